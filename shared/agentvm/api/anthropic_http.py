"""The Anthropic-compatible token API: `POST /v1/messages`, `POST /v1/messages/count_tokens`
(docs/token-api.md).

The request is Anthropic's own shape, the neutral driver request's too: messages (text, images,
documents, tool use and results, `cache_control` on any block), system (text or blocks),
tools, tool_choice, stop_sequences, temperature, top_p are passed through; `thinking` is refused
(the drivers do not return thinking blocks). A stream has Anthropic's events by their names
(message_start, content_block_start, ping, content_block_delta, content_block_stop, message_delta,
message_stop); the billed cost is `usage.cost` (USD, decimal text) of the message, or of the last
message_delta. Errors are Anthropic's shape `{"type": "error", "error": {"type", "message"}}`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentvm.api.token_common import (
    ANTHROPIC_ERROR,
    JSON,
    SSE_HEADERS,
    Completion,
    TokenCaller,
    collect,
    cost_headers,
    first_event,
    json_body,
    replay,
    vendor_responses,
)
from agentvm.domain.models import Usage
from agentvm.drivers.base import (
    DriverEvent,
    InputJsonDelta,
    LLMRequest,
    MessageStart,
    MessageStop,
    TextDelta,
    ToolUseStart,
    ToolUseStop,
    UsageUpdate,
)
from agentvm.errors import (
    AgentVMError,
    Forbidden,
    InvalidRequest,
    NotConfigured,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    Unauthorized,
    UpstreamError,
    public_message,
)
from agentvm.money import money_text
from agentvm.services.agent_models import is_agent_model
from agentvm.services.token_gateway import Billed, GatewayCall, TokenGateway

if TYPE_CHECKING:
    from agentvm.services.agent_models import AgentModels

_PASSED = ("messages", "system", "tools", "tool_choice", "stop_sequences", "temperature", "top_p")
# fields a request may carry that change nothing here
_IGNORED = frozenset({"model", "max_tokens", "stream", "metadata", "service_tier", "top_k", "container", "mcp_servers"})


def anthropic_error(exc: BaseException) -> JSONResponse:
    status, kind = 500, "api_error"
    if isinstance(exc, AgentVMError):  # a class not named below keeps its own status (SecretsMissing 409, …)
        status = exc.http_status
        kind = "invalid_request_error" if status < 500 else kind
    headers: dict[str, str] = {}
    if isinstance(exc, Unauthorized):
        status, kind = 401, "authentication_error"
    elif isinstance(exc, Forbidden):
        status, kind = 403, "permission_error"
    elif isinstance(exc, NotFound):
        status, kind = 404, "not_found_error"
    elif isinstance(exc, PayloadTooLarge):
        status, kind = 413, "request_too_large"
    elif isinstance(exc, InvalidRequest):
        status, kind = 400, "invalid_request_error"
    elif isinstance(exc, QuotaExceeded):
        status, kind = 429, "rate_limit_error"
        headers["x-should-retry"] = "false"  # an exhausted budget: a retry cannot help
    elif isinstance(exc, RateLimited):
        status, kind = 429, "rate_limit_error"
        headers["retry-after"] = "60"
    elif isinstance(exc, NotConfigured):
        status, kind = 503, "api_error"
    elif isinstance(exc, UpstreamError):
        status, kind = (429, "rate_limit_error") if exc.code == "rate_limit_error" else (
            (529, "overloaded_error") if exc.code == "overloaded_error" else (502, "api_error"))
    return JSONResponse({"type": "error", "error": {"type": kind, "message": public_message(exc)}},
                        status_code=status, headers=headers or None)


def _bad(field: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {problem}", field=field)


def to_request(body: JSON) -> tuple[str, LLMRequest, bool]:
    stream = body.get("stream") is True
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "Field required")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _bad("max_tokens", "Field required: a whole number from 1")
    unknown = sorted(set(body) - set(_PASSED) - _IGNORED)
    if unknown:
        raise _bad(unknown[0], "not supported by this server (docs/token-api.md lists what is passed through)")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and m.get("role") in ("user", "assistant") for m in messages):
        raise _bad("messages", "must be a non-empty list of user and assistant messages")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise _bad("system", "must be a string or a list of text blocks")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise _bad("tools", "must be a list of tools")
    tool_choice = body.get("tool_choice")
    if tool_choice is not None and not isinstance(tool_choice, dict):
        raise _bad("tool_choice", "must be an object such as {\"type\": \"auto\"}")
    stop = body.get("stop_sequences")
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)):
        raise _bad("stop_sequences", "must be a list of strings")
    numbers = {}
    for name, hi in (("temperature", 1.0), ("top_p", 1.0)):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not 0 <= value <= hi):
            raise _bad(name, f"must be a number from 0 to {hi:g}")
        numbers[name] = None if value is None else float(value)
    request = LLMRequest(model=model, messages=messages, max_tokens=max_tokens,
                         system=system if isinstance(system, str) else None,
                         system_blocks=system if isinstance(system, list) else None, tools=tools,
                         temperature=numbers["temperature"], top_p=numbers["top_p"], stop_sequences=stop or None,
                         tool_choice=tool_choice, stream=stream)
    return model, request, stream


def usage_wire(usage: Usage, billed: Billed | None) -> JSON:
    out: JSON = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                 "cache_creation_input_tokens": usage.cache_write_tokens,
                 "cache_read_input_tokens": usage.cache_read_tokens}
    if billed is not None:
        out["cost"] = money_text(billed.cost.billed)
    return out


def message_wire(done: Completion, model: str, ident: str) -> JSON:
    usage = done.billed.usage if done.billed is not None else Usage()
    return {"id": done.message_id or ident, "type": "message", "role": "assistant", "model": model,
            "content": done.blocks, "stop_reason": done.stop_reason, "stop_sequence": None,
            "usage": usage_wire(usage, done.billed)}


def _estimate_tokens(body: JSON) -> int:
    """About four UTF-8 bytes of the request's text per token: an estimate, not the provider's count."""
    parts = [body.get("system"), body.get("messages"), body.get("tools")]
    return max(1, len(orjson.dumps([p for p in parts if p is not None])) // 4)


def anthropic_router(gateway: Callable[[], TokenGateway], caller: TokenCaller,
                     agents: Callable[[], AgentModels] | None = None) -> APIRouter:
    """`agents`: `model: "agent/<imageId>"` runs a turn of the caller's image (None: no agent models)."""
    router = APIRouter(tags=["token API (Anthropic)"], responses=vendor_responses(ANTHROPIC_ERROR, streams=False))

    @router.post("/v1/messages", summary="Anthropic Messages over the catalog, metered",
                 responses=vendor_responses(ANTHROPIC_ERROR, streams=True))
    async def messages(request: Request) -> Response:
        try:
            principal = await caller(request)
            body = await json_body(request)
            name, llm_request, stream = to_request(body)
            if agents is not None and is_agent_model(name):
                from agentvm.api.agent_http import anthropic_agent

                return await anthropic_agent(agents(), principal, request, body, name, llm_request, stream)
            call = await gateway().start(principal, name, llm_request)
        except AgentVMError as exc:
            return anthropic_error(exc)
        try:
            first = await first_event(call)
        except AgentVMError as exc:
            return anthropic_error(exc)
        if not stream:
            try:
                done = await collect(replay(first, call))
            except AgentVMError as exc:
                return anthropic_error(exc)
            finally:
                await call.events.aclose()
            return JSONResponse(message_wire(done, call.model.id, "msg_" + call.call_id),
                                headers=cost_headers(call, done.billed))
        return StreamingResponse(_events(call, first), media_type="text/event-stream",
                                 headers={**SSE_HEADERS, **cost_headers(call, None)})

    @router.post("/v1/messages/count_tokens", summary="An estimate of a request's input tokens")
    async def count_tokens(request: Request) -> Response:
        try:
            await caller(request)
            body = await json_body(request)
            model = body.get("model")
            if not isinstance(model, str) or not model:
                raise _bad("model", "Field required")
            await gateway().model(model)
        except AgentVMError as exc:
            return anthropic_error(exc)
        return JSONResponse({"input_tokens": _estimate_tokens(body)})

    return router


def _sse(event: str, data: JSON) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


_PING = _sse("ping", {"type": "ping"})
_MESSAGE_STOP = _sse("message_stop", {"type": "message_stop"})


async def _events(call: GatewayCall, first: DriverEvent | Billed | None) -> AsyncIterator[bytes]:
    """The stream's events; those that go out together are one write (message_start and ping, a block's
    start and its first delta, the last block's stop and the closing message_delta and message_stop)."""
    index = -1
    open_text = False
    usage = Usage()
    stop_reason = "end_turn"
    held = b""  # the last block's stop, sent with what follows it
    try:
        async with contextlib.aclosing(replay(first, call)) as events:
            async for event in events:
                if isinstance(event, MessageStart):
                    usage = event.usage
                    yield _sse("message_start", {"type": "message_start", "message": {
                        "id": event.message_id or "msg_" + call.call_id, "type": "message", "role": "assistant",
                        "model": call.model.id, "content": [], "stop_reason": None, "stop_sequence": None,
                        "usage": usage_wire(usage, None)}}) + _PING
                elif isinstance(event, TextDelta):
                    out = b""
                    if not open_text:
                        index += 1
                        open_text = True
                        out = _sse("content_block_start", {"type": "content_block_start", "index": index,
                                                           "content_block": {"type": "text", "text": ""}})
                    yield out + _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                             "delta": {"type": "text_delta", "text": event.text}})
                elif isinstance(event, ToolUseStart):
                    out = b""
                    if open_text:
                        out = _sse("content_block_stop", {"type": "content_block_stop", "index": index})
                        open_text = False
                    index += 1
                    yield out + _sse("content_block_start", {"type": "content_block_start", "index": index,
                                                             "content_block": {"type": "tool_use",
                                                                               "id": event.tool_call_id,
                                                                               "name": event.name, "input": {}}})
                elif isinstance(event, InputJsonDelta):
                    yield _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                       "delta": {"type": "input_json_delta",
                                                                 "partial_json": event.partial_json}})
                elif isinstance(event, ToolUseStop):
                    yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
                elif isinstance(event, UsageUpdate):
                    usage = event.usage
                elif isinstance(event, MessageStop):
                    if open_text:
                        held = _sse("content_block_stop", {"type": "content_block_stop", "index": index})
                        open_text = False
                    stop_reason = event.stop_reason or "end_turn"
                elif isinstance(event, Billed):
                    # after the bill: message_delta carries the final usage and its cost
                    yield held + _sse("message_delta", {"type": "message_delta",
                                                        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                                                        "usage": usage_wire(event.usage, event)}) + _MESSAGE_STOP
                    held = b""
        if held:
            yield held
    except AgentVMError as exc:
        kind = "overloaded_error" if exc.code == "overloaded_error" else "api_error"
        yield held + _sse("error", {"type": "error", "error": {"type": kind, "message": public_message(exc)}})
    finally:
        await call.events.aclose()
