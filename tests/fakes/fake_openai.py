"""Chat Completions streams as OpenAI sends them (`chat.completion.chunk` objects as SSE `data:`
lines, tool-call arguments in fragments, the finish chunk, the `include_usage` chunk with empty
`choices`, then `data: [DONE]`), and OpenAI's error bodies, for `tests.fakes.http_stub.StubServer`.

The chunk shapes follow recorded OpenAI streams (2026: `service_tier`, `system_fingerprint`,
`logprobs`, `refusal`, the `obfuscation` padding, `usage: null` on every chunk but the last).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tests.fakes.http_stub import Stub

JSON = dict[str, Any]
MODEL = "gpt-4o-mini-2024-07-18"
CREATED = 1764150000


def chunk(delta: JSON | None = None, *, finish: str | None = None, chat_id: str = "chatcmpl-AbC123",
          model: str = MODEL, choices: bool = True) -> JSON:
    return {"id": chat_id, "object": "chat.completion.chunk", "created": CREATED, "model": model,
            "service_tier": "default", "system_fingerprint": "fp_560af6e559",
            "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}]
            if choices else [],
            "usage": None, "obfuscation": "Qup1BsQ3"}


def role_chunk(**kw: Any) -> JSON:
    return chunk({"role": "assistant", "content": "", "refusal": None}, **kw)


def text_chunks(pieces: Sequence[str], **kw: Any) -> list[JSON]:
    return [chunk({"content": piece}, **kw) for piece in pieces]


def tool_call_chunks(index: int, call_id: str, name: str, fragments: Sequence[str], **kw: Any) -> list[JSON]:
    """A streamed tool call: id, name and empty arguments first, then one chunk per fragment."""
    first = chunk({"role": "assistant", "content": None, "tool_calls": [
        {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}],
        "refusal": None} if index == 0 else {"tool_calls": [
        {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]}, **kw)
    return [first] + [chunk({"tool_calls": [{"index": index, "function": {"arguments": f}}]}, **kw)
                      for f in fragments]


def finish_chunk(reason: str, **kw: Any) -> JSON:
    return chunk({}, finish=reason, **kw)


def usage_chunk(prompt: int, completion: int, cached: int = 0, **kw: Any) -> JSON:
    out = chunk(choices=False, **kw)
    out["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                    "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                                  "accepted_prediction_tokens": 0,
                                                  "rejected_prediction_tokens": 0}}
    return out


def sse(chunks: Sequence[JSON | str], *, done: bool = True) -> list[bytes]:
    """The SSE events, one piece each (a str is sent verbatim as the data line)."""
    pieces = [f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks]
    if done:
        pieces.append(b"data: [DONE]\n\n")
    return pieces


def stream(chunks: Sequence[JSON | str], *, done: bool = True, cut: bool = False, split: bool = False) -> Stub:
    """A 200 event stream. `split`: every event is cut in two pieces mid-JSON (the parser must
    join them)."""
    pieces = sse(chunks, done=done)
    if split:
        pieces = [half for p in pieces for half in (p[: len(p) // 2], p[len(p) // 2:])]
    return Stub(200, {"content-type": "text/event-stream; charset=utf-8", "x-request-id": "req_fake"},
                tuple(pieces), cut=cut)


def text_reply(pieces: Sequence[str], *, prompt: int = 12, completion: int = 5, cached: int = 0,
               finish: str = "stop") -> Stub:
    return stream([role_chunk(), *text_chunks(pieces), finish_chunk(finish),
                   usage_chunk(prompt, completion, cached)])


def error(status: int, message: str, *, error_type: str = "invalid_request_error", code: str | None = None,
          param: str | None = None, headers: dict[str, str] | None = None) -> Stub:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return Stub(status, {"content-type": "application/json", **(headers or {})}, (json.dumps(body).encode(),))
