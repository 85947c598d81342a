"""What the token API's two vendor fronts share (api/openai_http.py, api/anthropic_http.py): who the
caller is, the JSON body, a whole completion assembled from the driver events, and the billed-cost
header. The vendor fronts answer in their vendors' shapes, never in AgentVM's one error shape."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import Request

from agentvm.domain.models import Principal
from agentvm.drivers.base import DriverEvent, MessageStart, MessageStop, TextDelta, ToolUseStop
from agentvm.errors import InvalidRequest, Unauthorized
from agentvm.money import money_text
from agentvm.services.token_gateway import Billed, GatewayCall

JSON = dict[str, Any]
COST_HEADER = "x-agentvm-cost-usd"
CALL_HEADER = "x-agentvm-call-id"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
MISSING_KEY = "API key required: send `Authorization: Bearer <key>` or `x-api-key: <key>`"
# max_tokens of an OpenAI-shaped request that sets none (the hold is sized by it)
DEFAULT_MAX_TOKENS = 4096

# Who calls: the API key of `Authorization: Bearer` or `x-api-key` → its principal (open mode: the
# default tenant, no key read). Raises Unauthorized.
TokenCaller = Callable[[Request], Awaitable[Principal]]


OPENAI_ERROR: JSON = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
ANTHROPIC_ERROR: JSON = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"], "properties": {
        "type": {"type": "string"}, "message": {"type": "string"}}}}}
# every status a token API route answers (the app's own error statuses, declared for every operation
# in AgentVM's shape, are declared here first in the vendor's: api/http_app.py keeps a declared one)
_STATUSES = {400: "Invalid request (param named)", 401: "No or an unknown API key", 403: "The key may not do this",
             404: "Unknown model", 405: "Wrong method", 409: "Conflict", 413: "Request body too large",
             429: "Rate limit, or an exhausted budget (insufficient_quota)", 500: "Internal error",
             502: "The provider failed", 503: "The provider is not configured", 529: "The provider is overloaded"}


def vendor_responses(error: JSON, *, streams: bool) -> dict[int | str, Any]:
    """The OpenAPI responses of a token API route: a JSON (or SSE) success, errors in the vendor's shape."""
    ok: JSON = {"application/json": {"schema": {"type": "object"}}}
    if streams:
        ok["text/event-stream"] = {"schema": {"type": "string"}}
    out: dict[int | str, Any] = {200: {"description": "Success (SSE when `stream` is true)", "content": ok}}
    for status, description in _STATUSES.items():
        out[status] = {"description": description, "content": {"application/json": {"schema": error}}}
    return out


def vendor_token(request: Request) -> str:
    """The key of a vendor SDK's request: `Authorization: Bearer <key>` (OpenAI) or `x-api-key` (Anthropic)."""
    auth = request.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    key = request.headers.get("x-api-key", "").strip()
    if key:
        return key
    raise Unauthorized(MISSING_KEY)


async def json_body(request: Request) -> JSON:
    raw = await request.body()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("body: is not valid JSON", field="body") from None
    if not isinstance(body, dict):
        raise InvalidRequest("body: must be a JSON object", field="body")
    return body


def cost_headers(call: GatewayCall, billed: Billed | None) -> dict[str, str]:
    headers = {CALL_HEADER: call.call_id}
    if billed is not None:
        headers[COST_HEADER] = money_text(billed.cost.billed)
    return headers


@dataclass(slots=True)
class Completion:
    """A whole message assembled from a call's events: its content blocks in order (text merged)."""

    message_id: str = ""
    blocks: list[JSON] = field(default_factory=list)
    stop_reason: str = "end_turn"
    billed: Billed | None = None

    @property
    def text(self) -> str:
        return "".join(b["text"] for b in self.blocks if b["type"] == "text")

    @property
    def tool_calls(self) -> list[JSON]:
        return [b for b in self.blocks if b["type"] == "tool_use"]

    def add(self, event: DriverEvent | Billed) -> None:
        if isinstance(event, MessageStart):
            self.message_id = event.message_id
        elif isinstance(event, TextDelta):
            if self.blocks and self.blocks[-1]["type"] == "text":
                self.blocks[-1]["text"] += event.text
            else:
                self.blocks.append({"type": "text", "text": event.text})
        elif isinstance(event, ToolUseStop):
            self.blocks.append({"type": "tool_use", "id": event.tool_call_id, "name": event.name,
                                "input": dict(event.input)})
        elif isinstance(event, MessageStop):
            self.stop_reason = event.stop_reason or "end_turn"
        elif isinstance(event, Billed):
            self.billed = event


async def collect(events: AsyncGenerator[DriverEvent | Billed, None]) -> Completion:
    done = Completion()
    async for event in events:
        done.add(event)
    return done


async def first_event(call: GatewayCall) -> DriverEvent | Billed | None:
    """The call's first event, before an answer starts: a failure before the provider streams anything is
    answered with its status, not inside a 200 stream (the call's events are closed: its hold settled).
    None: the stream ended at once."""
    try:
        return await call.events.__anext__()
    except StopAsyncIteration:
        return None
    except BaseException:
        await call.events.aclose()
        raise


async def replay(first: DriverEvent | Billed | None, call: GatewayCall) -> AsyncGenerator[DriverEvent | Billed, None]:
    if first is None:
        return
    yield first
    async for event in call.events:
        yield event
