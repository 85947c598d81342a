"""JSON text that the frame parser (orjson) refuses, read anyway so that the frame is answered.

orjson refuses some texts that are JSON by RFC 8259: nesting deeper than 1024 levels, an escaped lone
surrogate (`"\\ud800"`: JavaScript's JSON.stringify writes one for a string cut inside an emoji) and a
number beyond a double's range (`1e400`). A `*_request` frame like that with a usable `data.requestId`
gets an `invalid_request` response saying why, instead of no answer at all (spec §2.1: every request
with a requestId gets exactly one response). Any other object (no usable type or requestId) gets a
`system_error` saying why, as an object orjson reads does. Anything else orjson refuses is not JSON
and is ignored (spec §1.2), as are JSON texts that are not an object, and ACKs.

The reading is the stdlib's parser, and for nesting too deep for its recursion an iterative scanner
that checks the whole grammar and keeps only the envelope's `type` and `data.requestId`. The scanner
reads frames that deep up to DEEP_SCAN_MAX characters (no client nests that deep on purpose); a
bigger one cannot be read, so neither its grammar nor its requestId is known: it gets a
`system_error` naming both limits (it cannot get a response, having no known requestId)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

PARSER_MAX_DEPTH = 1024  # orjson's
DEEP_SCAN_MAX = 16 * 1024  # ~30 ms of scanning at worst (a frame of `{"a":{"a":…`)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A frame the parser refused: why, and where (a field path); for a request with a usable
    requestId also the command name and that requestId (answered with a response), else both None
    (answered with a `system_error` only)."""

    message: str
    field: str
    name: str | None = None
    request_id: str | None = None


def refused_request(text: str | bytes) -> Refusal | None:
    """Why orjson could not parse a frame, or None when it is not JSON, not an object, or an ACK."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        body = json.loads(text, parse_constant=_not_json)
    except RecursionError:
        return _deep(text)
    except ValueError:
        return None
    if not isinstance(body, dict) or "__ack" in body:
        return None
    data = body.get("data")
    request = _request(body.get("type"), data.get("requestId") if isinstance(data, dict) else None)
    where, problem = _first_problem(body)
    if request is None:  # a lone surrogate in the type or the requestId: they cannot be echoed back
        label = body.get("type")
        prefix = f"{label}: " if isinstance(label, str) and _valid(label) and where != "type" else ""
        return Refusal(f"{prefix}{where}: {problem}", where)
    type_, request_id = request
    return Refusal(f"{type_}: {where}: {problem}", where, type_[: -len("_request")], request_id)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _valid(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _request(type_: object, request_id: object) -> tuple[str, str] | None:
    if not isinstance(type_, str) or not type_.endswith("_request") or not _valid(type_):
        return None
    if not isinstance(request_id, str) or not request_id or not _valid(request_id):
        return None
    return type_, request_id


def _too_big(number: int) -> bool:
    """Beyond a double's range (orjson reads every integer past 64 bits as a double)."""
    try:
        float(number)
    except OverflowError:
        return True
    return False


def _first_problem(body: dict[str, Any]) -> tuple[str, str]:
    """The path and description of the first value orjson refuses, in document order."""
    stack: list[tuple[tuple[str, ...], Any]] = [((), body)]
    while stack:
        path, value = stack.pop()
        where = ".".join(path) or "frame"
        if isinstance(value, str) and not _valid(value):
            return where, "a lone surrogate escape: strings must be valid Unicode"
        if (isinstance(value, float) and math.isinf(value)) or (isinstance(value, int) and _too_big(value)):
            return where, "number out of range"
        if isinstance(value, dict | list) and len(path) >= PARSER_MAX_DEPTH:
            return "frame", f"nests deeper than {PARSER_MAX_DEPTH} levels"  # read here with a higher recursion limit
        if isinstance(value, dict):
            if not all(_valid(k) for k in value):
                return where, "a key with a lone surrogate escape: strings must be valid Unicode"
            stack.extend(((*path, k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend(((*path, str(i)), v) for i, v in reversed(list(enumerate(value))))
    return "frame", "not readable"  # nothing found: orjson refused it for another reason


# ---- the iterative scanner (nesting too deep for any recursive parser) ------------------------

_TOKEN = re.compile(
    r'[ \t\n\r]*(?:(?P<open>\[+)|(?P<close>\]+)|(?P<punct>[{}:,])'
    r'|(?P<str>"(?:[^"\\\x00-\x1f]++|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+")'
    r"|(?P<scalar>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null))")
_VALUE, _VALUE_OR_END, _KEY_OR_END, _KEY, _COLON, _AFTER, _DONE = range(7)
_MISSING = object()


def _deep(text: str) -> Refusal | None:
    too_deep = f"frame: nests deeper than {PARSER_MAX_DEPTH} levels"
    if len(text) > DEEP_SCAN_MAX:
        return Refusal(f"{too_deep}; a frame that deep is read only up to {DEEP_SCAN_MAX} characters and "
                       f"this one has {len(text)}, so it was not read (no response: its requestId is unknown)",
                       "frame")
    found = _scan(text)
    if found is None:
        return None
    request = _request(*found)
    if request is None:
        label = found[0]
        prefix = f"{label}: " if isinstance(label, str) and _valid(label) else ""
        return Refusal(f"{prefix}{too_deep}", "frame")
    type_, request_id = request
    return Refusal(f"{type_}: {too_deep}", "frame", type_[: -len("_request")], request_id)


def _scan(text: str) -> tuple[object, object] | None:
    """(type, data.requestId) of a JSON text whose top level is an object that is not an ACK (the
    last of duplicate keys wins, as in every parser here; None for a missing one, or a type that is
    not a string); None when it is not JSON or not such an object. Only the keys of the top object
    and of its `data` object are decoded."""
    stack: list[str] = []  # "{" or "[" per open level
    key1: object = None  # the current key of the top object, and of `data`
    key2: object = None
    type_: object = _MISSING
    request_id: object = _MISSING
    ack = False
    top_object = False
    state, pos = _VALUE, 0

    def begin(kind: str, token: str) -> None:
        """A value starts in the current container: keep the ones that matter."""
        nonlocal type_, request_id
        if stack == ["{"] and kind == "str":
            if key1 == "type":
                type_ = json.loads(token)
        elif stack == ["{", "{"] and key1 == "data" and key2 == "requestId" and kind == "str":
            request_id = json.loads(token)

    def key(token: str) -> None:
        nonlocal key1, key2, type_, request_id, ack
        if stack == ["{"]:
            key1 = json.loads(token)
            if key1 == "type":
                type_ = _MISSING
            elif key1 == "data":
                request_id = _MISSING
            elif key1 == "__ack":
                ack = True
        elif stack == ["{", "{"] and key1 == "data":
            key2 = json.loads(token)
            if key2 == "requestId":
                request_id = _MISSING

    while state != _DONE:
        m = _TOKEN.match(text, pos)
        if m is None:
            return None
        pos = m.end()
        kind = m.lastgroup
        token = m.group(kind or 0)
        if kind == "open":
            if state not in (_VALUE, _VALUE_OR_END):
                return None
            stack.extend("[" * len(token))
            state = _VALUE_OR_END
        elif kind == "close":
            n = len(token)
            if state not in (_VALUE_OR_END, _AFTER) or len(stack) < n or stack[-n:] != ["["] * n:
                return None
            del stack[-n:]
            state = _AFTER if stack else _DONE
        elif kind in ("str", "scalar"):
            if state in (_KEY_OR_END, _KEY):
                if kind != "str":
                    return None
                key(token)
                state = _COLON
                continue
            if state not in (_VALUE, _VALUE_OR_END):
                return None
            begin(kind, token)
            state = _AFTER if stack else _DONE
        elif token == "{":
            if state not in (_VALUE, _VALUE_OR_END):
                return None
            top_object = top_object or not stack  # the top level is an object
            stack.append("{")
            key2 = None
            state = _KEY_OR_END
        elif token == "}":
            if state not in (_KEY_OR_END, _AFTER) or not stack or stack[-1] != "{":
                return None
            stack.pop()
            state = _AFTER if stack else _DONE
        elif token == ":":
            if state != _COLON:
                return None
            state = _VALUE
        else:  # ","
            if state != _AFTER:
                return None
            state = _KEY if stack[-1] == "{" else _VALUE
    if text[pos:].strip(" \t\n\r") or ack or not top_object:
        return None
    return (None if type_ is _MISSING else type_), (None if request_id is _MISSING else request_id)
