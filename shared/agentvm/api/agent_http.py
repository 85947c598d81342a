"""`model: "agent/<imageId>"` on the token API's routes (services/agent_models.py): a turn of the
caller's image answered as an OpenAI chat completion or an Anthropic message, streamed or not.

Called by api/openai_http.py and api/anthropic_http.py with the request they parsed; an error raised
before the answer starts is answered by them in their vendor's shape. Every answer names the
session (`x-agentvm-session-id`: send it back to continue) and the turn (`x-agentvm-turn-id`, the
turnId of its usage records); a whole answer also carries its billed cost (`x-agentvm-cost-usd`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import orjson
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from agentvm.api.openai_wire import ChatCall, chunk
from agentvm.api.openai_wire import usage_wire as openai_usage
from agentvm.api.token_common import COST_HEADER, JSON, SSE_HEADERS
from agentvm.domain.models import Principal, Usage
from agentvm.drivers.base import LLMRequest
from agentvm.errors import UpstreamError, public_message
from agentvm.services.agent_models import SESSION_HEADER, AgentCall, AgentDone, AgentModels, AgentText, session_of

TURN_HEADER = "x-agentvm-turn-id"
WHOLE_TIMEOUT_S = 600.0  # a whole (non-streamed) answer waits this long for its turn (as the chat API's execute)


def _headers(call: AgentCall) -> dict[str, str]:
    return {SESSION_HEADER: call.session_id, TURN_HEADER: call.turn_id}


async def _whole(call: AgentCall) -> tuple[str, AgentDone]:
    """The turn's words and its end; a failed turn raises its error (nothing is answered but it)."""
    parts: list[str] = []
    done: AgentDone | None = None
    try:
        async for event in call.events():
            if isinstance(event, AgentText):
                parts.append(event.text)
            elif isinstance(event, AgentDone):
                done = event
    finally:
        await call.close()
    if done is None:
        raise UpstreamError(f"the turn {call.turn_id} ended without its response", code="turn_lost")
    if done.error is not None:
        raise done.error
    return "".join(parts), done


# ---- OpenAI --------------------------------------------------------------------------------------

async def openai_agent(agents: AgentModels, p: Principal, request: Request, body: JSON, asked: ChatCall) -> Response:
    session, field = session_of(request.headers.get(SESSION_HEADER), body.get("user"), "user")
    max_tokens = asked.request.max_tokens if asked.max_tokens_param is not None else None
    call = await agents.start(p, asked.model, asked.request, session=session, session_field=field,
                              max_tokens=max_tokens, timeout_s=None if asked.stream else WHOLE_TIMEOUT_S)
    ident = "chatcmpl-" + call.turn_id
    if asked.stream:
        return StreamingResponse(_openai_chunks(call, ident, asked.include_usage), media_type="text/event-stream",
                                 headers={**SSE_HEADERS, **_headers(call)})
    text, done = await _whole(call)
    return JSONResponse({
        "id": ident, "object": "chat.completion", "created": int(time.time()), "model": call.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": _openai_usage(done)}, headers={**_headers(call), COST_HEADER: done.cost})


def _openai_usage(done: AgentDone) -> JSON:
    return {**openai_usage(done.usage, None), "cost": done.cost}


async def _openai_chunks(call: AgentCall, ident: str, include_usage: bool) -> AsyncIterator[bytes]:
    created = int(time.time())
    yield chunk(ident, call.model, created, {"role": "assistant", "content": ""})
    try:
        async for event in call.events():
            if event is None:
                yield b": ping\n\n"  # a comment (the SDK skips it): keeps idle proxies open
            elif isinstance(event, AgentText):
                yield chunk(ident, call.model, created, {"content": event.text})
            elif event.error is not None:
                # the answer has begun: the failure is an `error` event (the SDK raises APIError on it)
                yield b"data: " + orjson.dumps({"error": {"message": public_message(event.error),
                                                          "type": "agent_error", "param": None,
                                                          "code": event.error.code}}) + b"\n\n"
                return
            else:
                yield chunk(ident, call.model, created, {}, "stop")
                if include_usage:
                    yield chunk(ident, call.model, created, None, usage=_openai_usage(event))
    finally:
        await call.close()
    yield b"data: [DONE]\n\n"


# ---- Anthropic -----------------------------------------------------------------------------------

async def anthropic_agent(agents: AgentModels, p: Principal, request: Request, body: JSON, model: str,
                          asked: LLMRequest, stream: bool) -> Response:
    metadata = body.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    session, field = session_of(request.headers.get(SESSION_HEADER), user, "metadata.user_id")
    call = await agents.start(p, model, asked, session=session, session_field=field, max_tokens=asked.max_tokens,
                              timeout_s=None if stream else WHOLE_TIMEOUT_S)
    ident = "msg_" + call.turn_id
    if stream:
        return StreamingResponse(_anthropic_events(call, ident), media_type="text/event-stream",
                                 headers={**SSE_HEADERS, **_headers(call)})
    text, done = await _whole(call)
    return JSONResponse({
        "id": ident, "type": "message", "role": "assistant", "model": call.model,
        "content": [{"type": "text", "text": text}] if text else [], "stop_reason": "end_turn",
        "stop_sequence": None, "usage": _anthropic_usage(done.usage, done.cost)},
        headers={**_headers(call), COST_HEADER: done.cost})


def _anthropic_usage(usage: Usage, cost: str | None) -> JSON:
    out: JSON = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                 "cache_creation_input_tokens": usage.cache_write_tokens,
                 "cache_read_input_tokens": usage.cache_read_tokens}
    if cost is not None:
        out["cost"] = cost
    return out


def _sse(event: str, data: JSON) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def _anthropic_events(call: AgentCall, ident: str) -> AsyncIterator[bytes]:
    yield _sse("message_start", {"type": "message_start", "message": {
        "id": ident, "type": "message", "role": "assistant", "model": call.model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": _anthropic_usage(Usage(), None)}})
    opened = False
    try:
        async for event in call.events():
            if event is None:
                yield _sse("ping", {"type": "ping"})
            elif isinstance(event, AgentText):
                if not opened:
                    opened = True
                    yield _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                                       "content_block": {"type": "text", "text": ""}})
                yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                   "delta": {"type": "text_delta", "text": event.text}})
            elif event.error is not None:
                yield _sse("error", {"type": "error", "error": {"type": "api_error",
                                                                "message": public_message(event.error)}})
                return
            else:
                if opened:
                    yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
                yield _sse("message_delta", {"type": "message_delta",
                                             "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                             "usage": _anthropic_usage(event.usage, event.cost)})
                yield _sse("message_stop", {"type": "message_stop"})
    finally:
        await call.close()
