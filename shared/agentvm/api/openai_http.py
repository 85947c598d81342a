"""The OpenAI-compatible token API: `GET /v1/models`, `POST /v1/chat/completions` (docs/token-api.md).

Errors answer in OpenAI's shape `{"error": {"message", "type", "param", "code"}}` with the statuses its
SDK maps to its exception types: 400 BadRequestError (param named), 401 AuthenticationError, 403
PermissionDeniedError, 404 NotFoundError (unknown model), 429 RateLimitError (a rate limit, and an
exhausted budget with code `insufficient_quota`, which the SDK is told not to retry), 5xx. The route
reads the caller's key itself, before the body (the request gate's limit on the body's size holds)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentvm.api.json_mode import json_answer
from agentvm.api.openai_wire import FINISH_REASONS, chunk, completion_wire, to_request, usage_wire
from agentvm.api.token_common import (
    JSON,
    OPENAI_ERROR,
    SSE_HEADERS,
    TokenCaller,
    collect,
    cost_headers,
    first_event,
    json_body,
    replay,
    vendor_responses,
)
from agentvm.drivers.base import DriverEvent, InputJsonDelta, MessageStop, TextDelta, ToolUseStart
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
from agentvm.services.agent_models import is_agent_model
from agentvm.services.token_gateway import Billed, GatewayCall, TokenGateway

if TYPE_CHECKING:
    from agentvm.services.agent_models import AgentModels

OWNER = "agentvm"


def openai_error(exc: BaseException) -> JSONResponse:
    status, kind, code, param = 500, "server_error", "internal_error", None
    if isinstance(exc, AgentVMError):  # a class not named below keeps its own status (SecretsMissing 409, …)
        status, code, param = exc.http_status, exc.code, exc.field
        kind = "invalid_request_error" if status < 500 else kind
    headers: dict[str, str] = {}
    if isinstance(exc, Unauthorized):
        status, kind, code = 401, "invalid_request_error", "invalid_api_key"
    elif isinstance(exc, Forbidden):
        status, kind, code = 403, "invalid_request_error", "permission_denied"
    elif isinstance(exc, NotFound):
        status, kind, code, param = 404, "invalid_request_error", "model_not_found", exc.field
    elif isinstance(exc, PayloadTooLarge):
        status, kind, code, param = 413, "invalid_request_error", "request_too_large", exc.field
    elif isinstance(exc, InvalidRequest):
        status, kind, code, param = 400, "invalid_request_error", "invalid_value", exc.field
    elif isinstance(exc, QuotaExceeded):
        # an exhausted budget: retrying cannot help (the SDK honours x-should-retry)
        status, kind, code = 429, "insufficient_quota", "insufficient_quota"
        headers["x-should-retry"] = "false"
    elif isinstance(exc, RateLimited):
        status, kind, code = 429, "requests", "rate_limit_exceeded"
        headers["retry-after"] = "60"
    elif isinstance(exc, NotConfigured):
        status, kind, code, param = 503, "server_error", "not_configured", exc.field
    elif isinstance(exc, UpstreamError):
        status, kind, code = (429, "requests", "rate_limit_exceeded") if exc.code == "rate_limit_error" else (
            502, "upstream_error", exc.code)
    body = {"error": {"message": public_message(exc), "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers or None)


def openai_router(gateway: Callable[[], TokenGateway], caller: TokenCaller,
                  agents: Callable[[], AgentModels] | None = None) -> APIRouter:
    """`agents`: `model: "agent/<imageId>"` runs a turn of the caller's image (None: no agent models)."""
    router = APIRouter(tags=["token API (OpenAI)"], responses=vendor_responses(OPENAI_ERROR, streams=False))
    streamed = vendor_responses(OPENAI_ERROR, streams=True)

    @router.get("/v1/models", summary="The catalog's models (OpenAI's list shape)")
    async def list_models(request: Request) -> Response:
        try:
            await caller(request)
            models = await gateway().models()
        except AgentVMError as exc:
            return openai_error(exc)
        return JSONResponse({"object": "list", "data": [
            {"id": m.id, "object": "model", "created": 0, "owned_by": m.provider,
             "context_window": m.context_window, "max_output_tokens": m.max_output,
             "pricing": {"input": str(m.price.input), "output": str(m.price.output),
                         "cache_read": str(m.price.cache_read), "cache_write": str(m.price.cache_write),
                         "unit": "USD per million tokens (list price, before the markup)"}}
            for m in models]})

    @router.get("/v1/models/{model_id:path}", summary="One catalog model")
    async def get_model(model_id: str, request: Request) -> Response:
        try:
            await caller(request)
            m = await gateway().model(model_id)
        except AgentVMError as exc:
            return openai_error(exc)
        return JSONResponse({"id": m.id, "object": "model", "created": 0, "owned_by": m.provider})

    @router.post("/v1/chat/completions", summary="OpenAI Chat Completions over the catalog, metered",
                 responses=streamed)
    async def chat_completions(request: Request) -> Response:
        try:
            principal = await caller(request)
            body = await json_body(request)
            asked = to_request(body)
            if agents is not None and is_agent_model(asked.model):
                if asked.json_tool is not None:
                    raise InvalidRequest("response_format: not taken by agent models (an agent answers in "
                                         "words; ask it for JSON in the message)", field="response_format")
                from agentvm.api.agent_http import openai_agent

                return await openai_agent(agents(), principal, request, body, asked)
            call = await gateway().start(principal, asked.model, asked.request, max_tokens_param=asked.max_tokens_param)
        except AgentVMError as exc:
            return openai_error(exc)
        ident = "chatcmpl-" + call.call_id
        try:
            first = await first_event(call)
        except AgentVMError as exc:
            return openai_error(exc)
        if not asked.stream:
            try:
                done = await collect(_answer(replay(first, call), asked.json_tool))
            except AgentVMError as exc:
                return openai_error(exc)
            finally:
                await call.events.aclose()
            return JSONResponse(completion_wire(done, call.model.id, ident), headers=cost_headers(call, done.billed))
        return StreamingResponse(_chunks(call, first, ident, asked.include_usage, asked.json_tool),
                                 media_type="text/event-stream",
                                 headers={**SSE_HEADERS, **cost_headers(call, None)})

    return router


def _answer(events: AsyncGenerator[DriverEvent | Billed, None],
            json_tool: str | None) -> AsyncGenerator[DriverEvent | Billed, None]:
    return events if json_tool is None else json_answer(events, json_tool)


async def _chunks(call: GatewayCall, first: DriverEvent | Billed | None, ident: str,
                  include_usage: bool, json_tool: str | None) -> AsyncIterator[bytes]:
    model, created = call.model.id, int(time.time())
    tools = -1  # the index of the current tool call
    held = b""  # the finish chunk, sent with the usage chunk and [DONE] (one write)
    yield chunk(ident, model, created, {"role": "assistant", "content": ""})
    try:
        async with contextlib.aclosing(_answer(replay(first, call), json_tool)) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    yield chunk(ident, model, created, {"content": event.text})
                elif isinstance(event, ToolUseStart):
                    tools += 1
                    yield chunk(ident, model, created, {"tool_calls": [{
                        "index": tools, "id": event.tool_call_id, "type": "function",
                        "function": {"name": event.name, "arguments": ""}}]})
                elif isinstance(event, InputJsonDelta):
                    yield chunk(ident, model, created, {"tool_calls": [{
                        "index": tools, "function": {"arguments": event.partial_json}}]})
                elif isinstance(event, MessageStop):
                    held = chunk(ident, model, created, {}, FINISH_REASONS.get(event.stop_reason, "stop"))
                elif isinstance(event, Billed) and include_usage:
                    held += chunk(ident, model, created, None, usage=usage_wire(event.usage, event))
    except AgentVMError as exc:
        # the answer has begun: the failure is an `error` event (the SDK raises APIError on it)
        error: JSON = {"error": {"message": public_message(exc), "type": "upstream_error", "param": None,
                                 "code": exc.code}}
        yield held + b"data: " + orjson.dumps(error) + b"\n\n"
        return
    finally:
        await call.events.aclose()
    yield held + b"data: [DONE]\n\n"
