"""Full-text search of a tenant's messages: what text of a stored message is searchable, how a
query becomes a full-text match, how a match is shown, and the page cursors of a search.

What is searchable (`searchable_text`), per stored AgentX message body:

* user messages: the `content` string, or the `text` of its text parts, and the `filename` /
  `name` of its file and image parts (the data itself is not);
* assistant messages: the `text` of their text parts;
* tool calls: the tool's name and the string and number values of its input (not the JSON keys),
  at most `TOOL_PREVIEW_CHARS`;
* tool results: the tool's name and the start of its output, at most `TOOL_PREVIEW_CHARS`: a
  result may be 24 KB of file listing or build log, which would drown the conversation itself;
* error messages and anything else: nothing (they are the runtime's words, not the conversation's).

Each message's text is cut to `MAX_TEXT_BYTES` (UTF-8) at a character boundary: a longer message is
searchable by its beginning.

A query is plain words, never full-text syntax: every run of letters and digits is one term, quoted
(so `"`, `*`, `OR`, `NOT`, `NEAR`, parentheses and column filters mean nothing), and a message
matches when it holds every term (AND), after Porter stemming and Unicode case and diacritic
folding (the index's tokenizer, adapters/sqlite_fts.py): `pineapple` finds "Pineapples". At most
`MAX_TERMS` distinct terms count.

A snippet is HTML: the message text around the matches, escaped (`&`, `<`, `>`), with each matching
term in `<mark>…</mark>` and `…` where the text was cut. The escaping makes the marks unambiguous
(text that itself holds `<mark>` comes out as `&lt;mark&gt;`) and the snippet safe to render.
"""

from __future__ import annotations

import base64
import binascii
import html
import re
import zlib
from collections.abc import Mapping
from typing import Any

import orjson

from agentvm.errors import InvalidRequest

MAX_TEXT_BYTES = 8 * 1024
TOOL_PREVIEW_CHARS = 1000
MAX_TERMS = 16
SNIPPET_TOKENS = 16
ELLIPSIS = "…"
#: Placeholders of the match marks inside a full-text snippet (private-use characters, removed from
#: every searchable text), turned into `<mark>`/`</mark>` after the text is escaped.
MARK_OPEN, MARK_CLOSE = "\ue000", "\ue001"

_TERM = re.compile(r"[^\W_]+")  # letters and digits: what the unicode61 tokenizer keeps as a token
_MARKS = re.compile(f"[{MARK_OPEN}{MARK_CLOSE}]")
_BAD_CURSOR = "cursor: not a cursor of this list"


def searchable_text(body: Mapping[str, Any]) -> str:
    """The searchable text of a stored message body ("" when it has none), at most MAX_TEXT_BYTES."""
    subtype = body.get("subtype") or body.get("role")
    if subtype == "user":
        text = _content_text(body.get("content"), names=True)
    elif subtype == "assistant":
        text = _content_text(body.get("content"), names=False)
    elif subtype == "tool-call":
        call = body.get("toolCall")
        text = _tool_text(call.get("name"), _leaves(call.get("input"))) if isinstance(call, Mapping) else ""
    elif subtype == "tool-result":
        result = body.get("toolResult")
        if isinstance(result, Mapping):
            output = result.get("output")
            value = output.get("value") if isinstance(output, Mapping) else None
            text = _tool_text(result.get("name"), value if isinstance(value, str) else _json_text(value))
        else:
            text = ""
    else:
        text = ""
    return _bounded(_MARKS.sub(" ", text).strip())


def match_expression(query: str) -> str | None:
    """The FTS5 MATCH expression of a plain-words query (every term required), or None when the
    query holds no term (it matches nothing)."""
    terms = query_terms(query)
    return " ".join(f'"{t}"' for t in terms) if terms else None


def query_terms(query: str) -> list[str]:
    """The distinct terms of a query, lower-cased, at most MAX_TERMS."""
    return list(dict.fromkeys(t.lower() for t in _TERM.findall(query)))[:MAX_TERMS]


def render_snippet(raw: str) -> str:
    """An FTS5 snippet with the placeholder marks as HTML: text escaped, matches in <mark>."""
    return html.escape(raw, quote=False).replace(MARK_OPEN, "<mark>").replace(MARK_CLOSE, "</mark>")


# ---- cursors ---------------------------------------------------------------------------------


def search_cursor(state: Mapping[str, Any], query: str) -> str:
    """An opaque cursor holding a search's position `state` (JSON values), bound to its query."""
    raw = orjson.dumps({**state, "q": _fingerprint(query)})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def search_cursor_state(cursor: str | None, query: str) -> dict[str, Any] | None:
    """The state of a cursor from `search_cursor` for the same query; None for no cursor;
    InvalidRequest (field `cursor`) for anything else. The caller checks the state's own fields
    (and raises `bad_cursor()` when they are wrong)."""
    if cursor is None:
        return None
    try:
        state = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, orjson.JSONDecodeError):
        raise bad_cursor() from None
    if not isinstance(state, dict) or state.pop("q", None) != _fingerprint(query):
        raise bad_cursor()
    return state


def bad_cursor() -> InvalidRequest:
    return InvalidRequest(_BAD_CURSOR, field="cursor")


def cursor_int(state: Mapping[str, Any], name: str, low: int = 0, high: int = 1 << 53) -> int:
    value = state.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise bad_cursor()
    return value


def _fingerprint(query: str) -> int:
    return zlib.crc32("\x00".join(query_terms(query)).encode())


# ---- text extraction -------------------------------------------------------------------------


def _content_text(content: Any, *, names: bool) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    out: list[str] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif names:
            out += [str(part[k]) for k in ("filename", "name") if isinstance(part.get(k), str)]
    return "\n".join(out)


def _tool_text(name: Any, detail: str) -> str:
    detail = detail[:TOOL_PREVIEW_CHARS]
    return f"{name}\n{detail}" if isinstance(name, str) and name else detail


def _leaves(value: Any) -> str:
    """The string and number values inside a JSON value, space-separated (a tool input's words)."""
    out: list[str] = []
    size = 0

    def walk(v: Any) -> None:
        nonlocal size
        if size > TOOL_PREVIEW_CHARS:
            return
        if isinstance(v, Mapping):
            for item in v.values():
                walk(item)
        elif isinstance(v, list):
            for item in v:
                walk(item)
        elif isinstance(v, str | int | float) and not isinstance(v, bool):
            text = str(v)
            out.append(text)
            size += len(text) + 1

    walk(value)
    return " ".join(out)


def _json_text(value: Any) -> str:
    if value is None:
        return ""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return ""


def _bounded(text: str) -> str:
    data = text.encode()
    if len(data) <= MAX_TEXT_BYTES:
        return text
    return data[:MAX_TEXT_BYTES].decode(errors="ignore")
