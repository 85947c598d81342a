"""Bedrock ConverseStream responses in the real `application/vnd.amazon.eventstream` wire format,
for `tests.fakes.http_stub.StubServer` (a botocore client pointed at it with `endpoint_url` signs,
sends, and parses them as it would Bedrock's).

A message: prelude (total length, headers length: big-endian uint32 each), the prelude's CRC32,
headers (name length byte, name, type 7 = string, value length uint16, value), the JSON payload,
then the CRC32 of everything before it. Events carry `:event-type`, `:content-type` and
`:message-type: event`; in-stream errors `:message-type: exception` and `:exception-type`. Payloads
carry the `p` padding field the service adds. HTTP errors: `x-amzn-ErrorType` and a `message` body.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from typing import Any

from tests.fakes.http_stub import Stub

JSON = dict[str, Any]
REQUEST_ID = "5f4e0d1c-aaaa-4bbb-8ccc-0123456789ab"


def _header(name: str, value: str) -> bytes:
    n, v = name.encode(), value.encode()
    return bytes([len(n)]) + n + b"\x07" + struct.pack(">H", len(v)) + v


def message(headers: dict[str, str], payload: bytes) -> bytes:
    encoded = b"".join(_header(k, v) for k, v in headers.items())
    prelude = struct.pack(">II", 12 + len(encoded) + len(payload) + 4, len(encoded))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return body + struct.pack(">I", zlib.crc32(body))


def event(event_type: str, body: JSON) -> bytes:
    payload = json.dumps({**body, "p": "abcdefghijklmnopqrstuvwxyzABCDEF"[: 8 + len(event_type) % 20]}).encode()
    return message({":event-type": event_type, ":content-type": "application/json", ":message-type": "event"},
                   payload)


def exception(exception_type: str, text: str) -> bytes:
    return message({":exception-type": exception_type, ":content-type": "application/json",
                    ":message-type": "exception"}, json.dumps({"message": text}).encode())


def message_start() -> bytes:
    return event("messageStart", {"role": "assistant"})


def text(index: int, pieces: Sequence[str]) -> list[bytes]:
    return [event("contentBlockDelta", {"contentBlockIndex": index, "delta": {"text": p}}) for p in pieces] + [
        event("contentBlockStop", {"contentBlockIndex": index})]


def tool_use(index: int, tool_use_id: str, name: str, fragments: Sequence[str]) -> list[bytes]:
    return [event("contentBlockStart", {"contentBlockIndex": index,
                                        "start": {"toolUse": {"toolUseId": tool_use_id, "name": name}}}),
            *[event("contentBlockDelta", {"contentBlockIndex": index, "delta": {"toolUse": {"input": f}}})
              for f in fragments],
            event("contentBlockStop", {"contentBlockIndex": index})]


def message_stop(reason: str) -> bytes:
    return event("messageStop", {"stopReason": reason})


def metadata(input_tokens: int, output_tokens: int, cache_read: int | None = None,
             cache_write: int | None = None) -> bytes:
    usage: JSON = {"inputTokens": input_tokens, "outputTokens": output_tokens,
                   "totalTokens": input_tokens + output_tokens + (cache_read or 0) + (cache_write or 0)}
    if cache_read is not None:
        usage["cacheReadInputTokens"] = cache_read
    if cache_write is not None:
        usage["cacheWriteInputTokens"] = cache_write
    return event("metadata", {"usage": usage, "metrics": {"latencyMs": 412}})


def stream(messages: Sequence[bytes], *, cut: bool = False, split: bool = False) -> Stub:
    """A 200 event stream, one message per HTTP chunk (`split`: each message in two chunks)."""
    pieces = list(messages)
    if split:
        pieces = [half for m in pieces for half in (m[: len(m) // 2], m[len(m) // 2:])]
    return Stub(200, {"content-type": "application/vnd.amazon.eventstream", "x-amzn-requestid": REQUEST_ID},
                tuple(pieces), cut=cut)


def text_reply(pieces: Sequence[str], *, input_tokens: int = 20, output_tokens: int = 6) -> Stub:
    return stream([message_start(), *text(0, pieces), message_stop("end_turn"),
                   metadata(input_tokens, output_tokens)])


def error(status: int, error_type: str, text_: str) -> Stub:
    return Stub(status, {"content-type": "application/json", "x-amzn-requestid": REQUEST_ID,
                         "x-amzn-errortype": f"{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/"},
                (json.dumps({"message": text_}).encode(),))
