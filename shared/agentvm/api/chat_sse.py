"""The SSE chat API (`/api/v1`): plain HTTP clients chat with the same services, sessions and
billing as the WebSocket. See services/chat.py for the event mapping; docs/sessions.md for the API."""

# no `from __future__ import annotations`: FastAPI reads these annotations (Depends, Header) at run time

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentvm import __version__
from agentvm.api.sessions_http import turn_wire
from agentvm.domain.models import Principal, StoredMessage
from agentvm.errors import InvalidRequest, NotFound, UpstreamError
from agentvm.protocol.commands import content_not_empty
from agentvm.protocol.messages import UserContent, content_wire
from agentvm.services.chat import HEARTBEAT_S, ChatEvent, ChatService, ChatTurn

JSON = dict[str, Any]
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
# documented as what it is (FastAPI would say application/json): the schema is each event's
SSE_EVENT: JSON = {"type": "object", "required": ["event", "data"], "properties": {
    "event": {"enum": ["thought", "message", "error", "done"]},
    "id": {"type": "string", "description": "the event's seq in its session: Last-Event-ID to resume after it"},
    "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": {"type": "object"}}}}
SSE_RESPONSE: dict[int | str, Any] = {200: {"description": "The turn's events (Server-Sent Events)",
                                            "content": {"text/event-stream": {"schema": SSE_EVENT}}}}
EXECUTE_TIMEOUT_S = 600.0
MAX_EVENT_ID = (1 << 53) - 1


class ChatConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    temperature: float | None = Field(None, ge=0, le=1)
    max_tokens: int | None = Field(None, ge=1, le=200_000)

    def options(self) -> JSON:
        out: JSON = {}
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.max_tokens is not None:
            out["maxTokens"] = self.max_tokens
        return out


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent_type: str | None = Field(None, min_length=1, max_length=300,
                                   description="a definition (GET /api/v1/agents); required without session_id")
    session_id: str | None = Field(None, min_length=1, max_length=128, description="continue this session")
    message: UserContent = Field(description="text, or content parts")
    config: ChatConfig | None = None
    container_id: str | None = Field(None, min_length=1, max_length=128,
                                     description="where a new session's image goes (default: 'default')")

    _not_empty = field_validator("message")(content_not_empty)



class ExecuteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: UserContent = Field(description="the task, as a user message")
    session_id: str | None = Field(None, min_length=1, max_length=128)
    config: ChatConfig | None = None
    container_id: str | None = Field(None, min_length=1, max_length=128)
    timeout_s: float = Field(EXECUTE_TIMEOUT_S, gt=0, le=EXECUTE_TIMEOUT_S)

    _not_empty = field_validator("task")(content_not_empty)


def sse(event: ChatEvent | None) -> bytes:
    if event is None:
        return b": ping\n\n"
    head = f"id: {event.id}\n" if event.id is not None else ""
    return f"{head}event: {event.event}\ndata: ".encode() + orjson.dumps(event.data) + b"\n\n"


async def _stream(turn: ChatTurn, heartbeat_s: float) -> AsyncIterator[bytes]:
    try:
        yield b": stream of a turn\n\n"  # a comment: sends the headers at once, dispatches no event
        async for event in turn.events(heartbeat_s=heartbeat_s):
            yield sse(event)
    finally:  # also when the client went away: the turn itself goes on and is stored
        await turn.feed.__aexit__(None, None, None)


def last_event_id(value: str | None) -> int | None:
    if value is None or not value.strip():
        return None
    try:
        seq = int(value)
    except ValueError:
        raise InvalidRequest(f"Last-Event-ID: {value!r} is not an event id of this API", field="Last-Event-ID") \
            from None
    if seq < 0:
        raise InvalidRequest("Last-Event-ID: must not be negative", field="Last-Event-ID")
    if seq > MAX_EVENT_ID:  # no session has that many events (and the stores' integers end at 2^63)
        raise InvalidRequest(f"Last-Event-ID: {value!r} is not an event id of this API", field="Last-Event-ID")
    return seq


def simple_message(m: StoredMessage) -> JSON:
    """A stored AgentX message as {id, role, content, timestamp} (+ tool or error details)."""
    body = m.body
    out: JSON = {"id": m.message_id, "role": body.get("role"), "timestamp": body.get("timestamp")}
    subtype = body.get("subtype")
    if subtype == "user":
        content = body.get("content")
        out["content"] = content if isinstance(content, str) else " ".join(
            str(p.get("text", "")) for p in content or [] if isinstance(p, dict))
    elif subtype == "assistant":
        out["content"] = "".join(str(p.get("text", "")) for p in body.get("content") or []
                                 if isinstance(p, dict) and p.get("type") == "text")
    elif subtype == "tool-call":
        call = body.get("toolCall") or {}
        out.update(role="tool_call", tool=call.get("name"), input=call.get("input"), content="")
    elif subtype == "tool-result":
        result = body.get("toolResult") or {}
        output = result.get("output") or {}
        out.update(role="tool_result", tool=result.get("name"), content=output.get("value"),
                   is_error=str(output.get("type", "")).startswith("error"))
    elif subtype == "error":
        out.update(content=body.get("content"), error_code=body.get("errorCode"))
    return out


def chat_router(chat: Callable[[], ChatService],
                principal_for: Callable[[Request], Awaitable[Principal]], *,
                probe: Callable[[], Awaitable[object]], heartbeat_s: float = HEARTBEAT_S) -> APIRouter:
    """`probe`: a cheap read of the store, for the health check (no caller needed)."""
    router = APIRouter(prefix="/api/v1", tags=["chat (SSE)"])
    Caller = Annotated[Principal, Depends(principal_for)]
    LastEventId = Annotated[str | None, Header(alias="Last-Event-ID")]

    def streaming(turn: ChatTurn) -> StreamingResponse:
        return StreamingResponse(_stream(turn, heartbeat_s), media_type="text/event-stream", headers=SSE_HEADERS)

    @router.post("/chat/completions", summary="Send a message and stream the turn (SSE)",
                 response_class=StreamingResponse, responses=SSE_RESPONSE)
    async def completions(body: ChatRequest, p: Caller, last_event: LastEventId = None) -> StreamingResponse:
        after = last_event_id(last_event)
        if after is not None:  # a reconnect: the message is stored already; stream what was missed
            if body.session_id is None:
                raise InvalidRequest("session_id: required with Last-Event-ID (the session to resume)",
                                     field="session_id")
            resumed = await chat().resume(p, body.session_id, after)
            if resumed is None:
                raise NotFound(f"No turn to resume in session {body.session_id}", field="session_id")
            return streaming(resumed)
        options = body.config.options() if body.config else {}
        turn = await chat().start(p, agent_type=body.agent_type, session_id=body.session_id,
                                  message=content_wire(body.message), options=options, container_id=body.container_id)
        return streaming(turn)

    @router.get("/chat/stream", summary="Follow a session's latest turn again (EventSource reconnects)",
                response_class=StreamingResponse, responses=SSE_RESPONSE)
    async def stream(p: Caller, session_id: Annotated[str, Query(min_length=1, max_length=128)],
                     last_event: LastEventId = None,
                     last_event_query: Annotated[str | None, Query(alias="last_event_id")] = None) -> StreamingResponse:
        after = last_event_id(last_event if last_event is not None else last_event_query) or 0
        resumed = await chat().resume(p, session_id, after)
        if resumed is None:
            raise NotFound(f"No turn to resume in session {session_id}", field="session_id")
        return streaming(resumed)

    @router.get("/chat/history", summary="A session's messages and turns")
    async def history(p: Caller, session_id: Annotated[str, Query(min_length=1, max_length=128)]) -> JSON:
        center = chat().s.image_sessions
        messages = await center.messages(p, session_id)
        turns = await center.turns(p, session_id)
        return {"session_id": session_id, "messages": [simple_message(m) for m in messages],
                "turns": [turn_wire(t) for t in turns]}

    @router.get("/agents", summary="The agent definitions (code and agent resources)")
    async def agents(p: Caller) -> JSON:
        return {"agents": await chat().definitions(p)}

    @router.get("/agents/{agent_id}", summary="One agent definition")
    async def agent(agent_id: str, p: Caller) -> JSON:
        return await chat().definition(p, agent_id)

    @router.post("/agents/{agent_id}/execute", summary="Run one task to its end; the result as JSON")
    async def execute(agent_id: str, body: ExecuteRequest, p: Caller) -> JSON:
        service = chat()
        if body.session_id is None:
            await service.definition(p, agent_id)  # 404 for an unknown agent before anything is stored
        turn = await service.start(p, agent_type=agent_id, session_id=body.session_id,
                                   message=content_wire(body.task),
                                   options=body.config.options() if body.config else {},
                                   container_id=body.container_id)
        parts: list[str] = []
        thoughts: list[JSON] = []
        errors: list[JSON] = []
        done: JSON = {}
        try:
            async for event in turn.events(timeout_s=body.timeout_s):
                if event is None:
                    continue
                if event.event == "message":
                    parts.append(str(event.data.get("content", "")))
                elif event.event == "thought":
                    thoughts.append(event.data)
                elif event.event == "error":
                    errors.append(event.data)
                else:
                    done = event.data
        except TimeoutError as exc:
            raise UpstreamError(f"{exc}; it goes on: follow it with GET /api/v1/chat/stream?session_id="
                                f"{turn.session.session_id}", code="timeout") from None
        finally:
            await turn.feed.__aexit__(None, None, None)
        stored = await service.s.deps.store.get_turn(p.tenant_id, turn.turn_id)
        return {"session_id": turn.session.session_id, "turn_id": turn.turn_id, "status": done.get("status"),
                "result": "".join(parts), "error": errors[-1] if errors else None, "thoughts": thoughts,
                "usage": done.get("usage", {}), "cost": done.get("cost", {}),
                "log": turn_wire(stored) if stored is not None else None}

    @router.get("/health", summary="Liveness of the API and its store")
    async def health() -> JSON:
        try:
            await asyncio.wait_for(probe(), 5)
            store = "ok"
        except Exception as exc:  # reported, not raised: the answer says what is wrong
            store = f"error: {type(exc).__name__}"
        return {"status": "ok" if store == "ok" else "degraded", "version": __version__, "store": store}

    return router
