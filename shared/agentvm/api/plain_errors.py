"""Pydantic's validation errors in plain words, for people: "must not be empty", "must be a whole
number", the field as a JSON path (`messages[0].content`). Pydantic's own texts carry its internals
(`Value error, …`, a union member's tag such as `constrained-str` in the location, a link to
errors.pydantic.dev). Used by the HTTP API (api/http_errors.py) and the WebSocket router."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_LOCATIONS = ("body", "query", "path", "header", "cookie")
_PREFIXES = ("Value error, ", "Assertion failed, ")
_NO_LINK = re.compile(r"\s*\[?(For further information visit )?https://errors\.pydantic\.dev\S*\]?")


def json_path(loc: Sequence[Any], body: Any) -> str:
    """`loc` as a JSON path (`messages[0].content`), walking the body that was sent: a part that is
    not in it is a union member's tag (`constrained-str`, `function-after[…]`, a model's name) and
    is left out, except the last (a missing or an unknown field)."""
    parts = list(loc)
    where = "body"
    if parts and parts[0] in _LOCATIONS:
        where, parts = parts[0], parts[1:]
    if where != "body":
        return str(parts[0]) if parts else where  # a parameter: its name
    path = ""
    current: Any = body
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if isinstance(part, int) and isinstance(current, list):
            path += f"[{part}]"
            current = current[part] if 0 <= part < len(current) else None
        elif isinstance(part, str) and isinstance(current, dict) and part in current:
            path += f".{part}" if path else part
            current = current[part]
        elif last and isinstance(part, str | int) and (isinstance(current, dict) or current is None) \
                and not _is_tag(str(part)):
            path += f".{part}" if path else str(part)
        # else: a tag of pydantic's (or a step the body does not have): not a field
    return path or "body"


_TAG = re.compile(r"^[a-z]+(-[a-z]+)+(\[.*\])?$|^[\w-]+\[.*\]$|^(str|int|float|bool|list|dict|none|decimal)$"
                  r"|^[A-Z][A-Za-z0-9]*$")  # a model's name (the JSON fields are camelCase)


def _is_tag(part: str) -> bool:
    return bool(_TAG.match(part))


def plain_message(error: Mapping[str, Any]) -> str:
    kind = str(error.get("type", ""))
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    known = _MESSAGES.get(kind)
    if known is not None:
        return known
    if kind in ("string_too_short", "too_short"):
        least = ctx.get("min_length", 1)
        if least == 1:
            return "must not be empty"
        unit = "characters" if kind == "string_too_short" else "items"
        return f"must have at least {least} {unit}"
    if kind in ("string_too_long", "too_long"):
        unit = "characters" if kind == "string_too_long" else "items"
        return f"must have at most {ctx.get('max_length')} {unit}"
    bounds = {"greater_than": "greater than", "greater_than_equal": "at least", "less_than": "less than",
              "less_than_equal": "at most"}
    if kind in bounds:
        limit = next(iter(ctx.values()), "")
        return f"must be {bounds[kind]} {limit}"
    if kind == "string_pattern_mismatch":
        return f"must match the pattern {ctx['pattern']}" if ctx.get("pattern") else "is not in the expected form"
    if kind == "union_tag_invalid":
        return f"{str(ctx.get('discriminator', 'type')).strip(chr(39))} {ctx.get('tag', '')!r} is not one of " \
            f"{ctx.get('expected_tags')}"
    if kind in ("literal_error", "enum"):
        return f"must be one of {ctx.get('expected', 'the allowed values')}"
    message = str(error.get("msg", "")) or "is not valid"
    for prefix in _PREFIXES:
        if message.startswith(prefix):
            message = message[len(prefix):]
    return _NO_LINK.sub("", message).strip() or "is not valid"


_MESSAGES: Mapping[str, str] = {
    "missing": "is required",
    "extra_forbidden": "is not a known field",
    "string_type": "must be a string", "string_unicode": "must be a string",
    "int_type": "must be a whole number", "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number", "float_parsing": "must be a number", "finite_number": "must be a finite number",
    "decimal_type": "must be a decimal number", "decimal_parsing": "must be a decimal number",
    "bool_type": "must be true or false", "bool_parsing": "must be true or false",
    "dict_type": "must be a JSON object", "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object", "mapping_type": "must be a JSON object",
    "list_type": "must be a list", "tuple_type": "must be a list", "set_type": "must be a list",
    "none_required": "must be null",
    "url_parsing": "must be a URL", "url_type": "must be a URL", "url_scheme": "must be an http or https URL",
    "union_tag_not_found": "needs a type",
    "json_invalid": "is not valid JSON", "json_type": "must be JSON text",
}
