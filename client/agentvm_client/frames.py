"""The wire's frames as the client sees them: event fields, request frames, and the stand-ins the
server sends for an event too big for one frame (a reference to fetch, or a truncation notice)."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import httpx

Event = dict[str, Any]
EventHandler = Callable[[Event], Awaitable[None] | None]
Hook = Callable[[], Awaitable[None] | None]

_MAX_MESSAGE_BYTES = 100 * 1024 * 1024  # the reference `ws` default (spec §1.2)
_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
# Fetching an event sent by reference: the receive loop waits for it (events stay in order), so this
# stays well below the ping timeout.
_REF_TIMEOUT_S = 10.0
_REF_KEYS = frozenset({"__ref", "requestId"})
_TRUNCATED_KEYS = frozenset({"__truncated", "bytes", "requestId"})
_HEX = frozenset("0123456789abcdef")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _request_id() -> str:
    return f"req_{_now_ms()}_" + "".join(secrets.choice(_ALPHABET) for _ in range(6))


def _data(event: Event) -> dict[str, Any]:
    data = event.get("data")
    return data if isinstance(data, dict) else {}


def _context_str(event: Event, key: str) -> str | None:
    ctx = event.get("context")
    if isinstance(ctx, dict):
        value = ctx.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _str_field(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


def _encode(obj: Any) -> str:
    return orjson.dumps(obj).decode()


class _Unavailable(Exception):
    """An event sent by reference could not be fetched, or failed its checks."""


def _stand_in(event: Event) -> str | None:
    """Whether `event` only stands for the real one: "ref" (sent by reference), "truncated", or None."""
    data = event.get("data")
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("__ref"), dict) and data.keys() <= _REF_KEYS:
        return "ref"
    if data.get("__truncated") is True and data.keys() <= _TRUNCATED_KEYS:
        return "truncated"
    return None


def _unavailable(event: Event, reason: str) -> Event:
    """What the caller gets for an event it cannot have: the response with `data.error` (so the request
    fails like any refused request), or a `system_error` in place of any other event."""
    request_id = _data(event).get("requestId")
    seq = event.get("seq")
    what = f"{event['type']} event" + (f" (seq {seq})" if isinstance(seq, int) else "")
    message = f"Cannot deliver the {what}: {reason}"
    if event.get("category") == "response":
        data: dict[str, Any] = {"error": message, "errorCode": "frame_unavailable"}
        if isinstance(request_id, str):
            data["requestId"] = request_id
        return {**event, "data": data}
    error: Event = {"type": "system_error", "timestamp": event.get("timestamp", _now_ms()), "source": "command",
                    "category": "error", "intent": "notification",
                    "data": {"message": message, "code": "frame_unavailable", "severity": "error",
                             "eventType": event["type"]}}
    if isinstance(request_id, str):
        error["data"]["requestId"] = request_id
    if isinstance(event.get("context"), dict):
        error["context"] = event["context"]
    return error


async def _fetch_referenced(event: Event, http: Callable[[], httpx.AsyncClient]) -> Event:
    """The event a reference stands for, fetched with `http()` and checked against its size and hash."""
    import httpx

    ref = _data(event)["__ref"]
    url, size, digest = ref.get("url"), ref.get("bytes"), ref.get("sha256")
    if (not isinstance(url, str) or not url.startswith(("https://", "http://"))
            or not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= _MAX_MESSAGE_BYTES
            or not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX):
        raise _Unavailable("malformed reference")
    client = http()
    body = bytearray()
    try:  # the URL is a credential for a while: it appears in no message
        async with asyncio.timeout(_REF_TIMEOUT_S), client.stream("GET", url) as resp:
            if resp.status_code != 200:
                raise _Unavailable(f"HTTP {resp.status_code}")
            async for chunk in resp.aiter_bytes():
                body += chunk
                if len(body) > size:
                    raise _Unavailable(f"more than the announced {size} bytes")
    except TimeoutError:
        raise _Unavailable(f"no answer within {_REF_TIMEOUT_S:g}s") from None
    except httpx.HTTPError as exc:
        raise _Unavailable(f"{type(exc).__name__} while fetching it") from None
    if len(body) != size:
        raise _Unavailable(f"{len(body)} bytes instead of the announced {size}")
    if hashlib.sha256(body).hexdigest() != digest:
        raise _Unavailable("its sha256 does not match")
    try:
        original = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _Unavailable("it is not JSON") from None
    if not isinstance(original, dict) or original.get("type") != event["type"]:
        raise _Unavailable("it is not the announced event")
    return original
