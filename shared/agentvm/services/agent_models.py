"""Agents over the token API (docs/token-api.md, "Agents as models"): `model: "agent/<imageId>"` runs
a turn of the caller's image through the chat use case (services/chat.py), the one the SSE chat API
and the WebSocket's `message_send` run, so its metering, budgets, holds, rate limits, tools and event
log are those of any agent turn. Only the request's last user message is sent: the session keeps the
conversation. The session is the one the caller names (`x-agentvm-session-id`, or `new` for a new
one), else the image's primary session.

The turn's session events become `AgentText` (the assistant's words; the agent's own tool calls run
on the server and are not shown, a blank line separates the words before a tool from those after)
and one `AgentDone` with the turn's usage and billed cost. A turn that fails before it has said or
done anything raises its error from `start` (a budget: `QuotaExceeded`), so the vendor fronts answer
it with its status rather than inside a 200 stream."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentvm.domain.models import Principal, Usage
from agentvm.drivers.base import LLMRequest
from agentvm.errors import (
    AgentVMError,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    RateLimited,
    UpstreamError,
)

if TYPE_CHECKING:  # the token API's routers import this module: the chat use case only when an agent is asked
    from pydantic import TypeAdapter

    from agentvm.services.chat import ChatEvent, ChatService, ChatTurn

JSON = dict[str, Any]
AGENT_PREFIX = "agent/"
SESSION_HEADER = "x-agentvm-session-id"
NEW_SESSION = "new"  # the session header's value that starts a new session of the image
SESSION_PREFIX = "sess_"  # a `user` field that is a session id names the session (else it is the end user's id)

_ERRORS: dict[str, type[AgentVMError]] = {"quota_exceeded": QuotaExceeded, "rate_limited": RateLimited}


@functools.cache
def _content() -> TypeAdapter[Any]:
    from pydantic import TypeAdapter

    from agentvm.protocol.messages import UserContent

    return TypeAdapter(UserContent)  # built at the first agent call, not at import (a cold path)


def is_agent_model(name: object) -> bool:
    return isinstance(name, str) and name.startswith(AGENT_PREFIX)


def session_of(header: str | None, user: object, user_field: str) -> tuple[str | None, str]:
    """The session a request names and the field that named it: the header, else a `user` field
    (OpenAI's `user`, Anthropic's `metadata.user_id`) that is a session id; (None, header): the
    image's primary session."""
    if header is not None and header.strip():
        return header.strip(), SESSION_HEADER
    if isinstance(user, str) and user.startswith(SESSION_PREFIX):
        return user, user_field
    return None, SESSION_HEADER


def turn_error(code: str, message: str) -> AgentVMError:
    """The error of a failed turn's `error_occurred` event, as the class its code maps to."""
    kind = _ERRORS.get(code)
    return kind(message) if kind is not None else UpstreamError(message, code=code)


@dataclass(frozen=True, slots=True)
class AgentText:
    text: str


@dataclass(frozen=True, slots=True)
class AgentDone:
    """The turn ended: `status` completed | failed | interrupted; `error` when it failed."""

    turn_id: str
    status: str
    usage: Usage
    cost: str  # USD billed, decimal text (the turn's `cost.billed`)
    error: AgentVMError | None = None


AgentEvent = AgentText | AgentDone | None  # None: a heartbeat (nothing happened for a while)


@dataclass(slots=True)
class _Reader:
    """Session chat events → agent events."""

    error: AgentVMError | None = None
    said: bool = False
    tool_ran: bool = False  # since the last words

    def read(self, event: ChatEvent | None) -> AgentEvent | bool:
        """The agent event of a chat event; True: the agent did something (a tool), nothing to show;
        False: nothing at all."""
        if event is None:
            return None
        if event.event == "message":
            text = str(event.data.get("content", ""))
            if not text:
                return False
            if self.tool_ran and self.said:
                text = "\n\n" + text
            self.said, self.tool_ran = True, False
            return AgentText(text)
        if event.event == "thought":
            if event.data.get("kind") in ("tool_call", "tool_result"):
                self.tool_ran = True
                return True
            return False
        if event.event == "error":
            self.error = turn_error(str(event.data.get("code") or "error"), str(event.data.get("message") or ""))
            return False
        data = event.data
        usage = data.get("usage") or {}
        cost = data.get("cost") or {}
        return AgentDone(turn_id=str(data.get("turn_id") or ""), status=str(data.get("status") or ""),
                         usage=Usage(int(usage.get("inputTokens", 0)),
                                                       int(usage.get("outputTokens", 0)),
                                                       int(usage.get("cacheReadTokens", 0)),
                                                       int(usage.get("cacheWriteTokens", 0))),
                         cost=str(cost.get("billed", "0")), error=self.error)


@dataclass(slots=True)
class AgentCall:
    """A turn sent and followed: `events()` streams what it says up to its `AgentDone`; `close()` stops
    following it (the turn goes on and is stored, as on the chat API)."""

    model: str
    image_id: str
    session_id: str
    turn_id: str
    _turn: ChatTurn
    _events: AsyncIterator[ChatEvent | None]
    _reader: _Reader
    _first: list[AgentEvent] = field(default_factory=list)
    _closed: bool = False

    async def events(self) -> AsyncIterator[AgentEvent]:
        for event in self._first:
            yield event
        self._first = []
        async for chat_event in self.chat_events():
            out = self._reader.read(chat_event)
            if out is True or out is False:
                continue
            yield out
            if isinstance(out, AgentDone):
                return

    async def chat_events(self) -> AsyncIterator[ChatEvent | None]:
        """The followed turn's chat events; a turn that outlasts the call's time limit raises `UpstreamError`
        (code timeout): the turn itself goes on."""
        try:
            async for chat_event in self._events:
                yield chat_event
        except TimeoutError as exc:
            raise UpstreamError(f"{exc}; it goes on: follow it with GET /api/v1/chat/stream?session_id="
                                f"{self.session_id}", code="timeout") from None

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._turn.feed.__aexit__(None, None, None)


class AgentModels:
    """`chat`: the chat use case for a caller (built per caller where the runtime is per tenant)."""

    def __init__(self, chat: Callable[[Principal], Awaitable[ChatService]], *, heartbeat_s: float = 15.0) -> None:
        self._chat = chat
        self._heartbeat_s = heartbeat_s

    async def start(self, p: Principal, model: str, request: LLMRequest, *, session: str | None,
                    session_field: str = SESSION_HEADER, max_tokens: int | None = None,
                    timeout_s: float | None = None) -> AgentCall:
        """Send the request's last user message to the image's session and follow the turn up to its
        first words (or tool, or end). `NotFound` (field model) for an image the caller does not own;
        a turn that failed before anything raises its error (`QuotaExceeded`, `RateLimited`, …).
        `timeout_s`: how long the call follows the turn (None: as long as it runs)."""
        image_id = model[len(AGENT_PREFIX):]
        _refuse_client_tools(request)
        options: JSON = {}
        if max_tokens is not None:
            if not 1 <= max_tokens <= 200_000:
                raise InvalidRequest("max_tokens: an agent's calls take 1 to 200000", field="max_tokens")
            options["maxTokens"] = max_tokens
        if request.temperature is not None:
            if not 0 <= request.temperature <= 1:
                raise InvalidRequest("temperature: an agent takes 0 to 1", field="temperature")
            options["temperature"] = request.temperature
        content = user_content(request.messages)
        chat = await self._chat(p)
        try:
            image = await chat.s.images.require(p, image_id) if image_id else None
        except NotFound:
            image = None
        if image is None:
            raise NotFound(f"model: {model[:200]} is not an image of yours (GET /v1/images lists them)",
                           field="model")
        if session == NEW_SESSION:
            session_id = (await chat.s.image_sessions.create(p, image.image_id)).session_id
        elif session is None:
            session_id = image.session_id
        else:
            try:
                session_id = (await chat.s.image_sessions.view(p, image, session)).session_id
            except NotFound:
                raise NotFound(f"{session_field}: {session[:200]} is not a session of {model[:200]}",
                               field=session_field) from None
        turn = await chat.start(p, agent_type=None, session_id=session_id, message=content, options=options,
                                container_id=None)
        reader = _Reader()
        events = turn.events(heartbeat_s=self._heartbeat_s, timeout_s=timeout_s).__aiter__()
        call = AgentCall(model, image.image_id, session_id, turn.turn_id, turn, events, reader)
        try:
            await self._first_sign(call)
        except BaseException:
            await call.close()
            raise
        return call

    @staticmethod
    async def _first_sign(call: AgentCall) -> None:
        """Follow the turn until it says or does something, or ends: a failure before that is raised."""
        async for chat_event in call.chat_events():
            out = call._reader.read(chat_event)
            if out is None or out is False:
                continue
            if out is True:
                return
            if isinstance(out, AgentDone) and out.error is not None and not call._reader.said:
                raise out.error
            call._first.append(out)
            return


def _refuse_client_tools(request: LLMRequest) -> None:
    for name, value in (("tools", request.tools), ("tool_choice", request.tool_choice),
                        ("stop", request.stop_sequences), ("top_p", request.top_p)):
        if value:
            raise InvalidRequest(f"{name}: not taken by agent models (an agent runs its own tools; "
                                 "docs/token-api.md, Agents as models)", field=name)


def user_content(messages: list[JSON]) -> str | list[JSON]:
    """The request's last message as the agent's user message: text and base64 images (the neutral,
    Anthropic-shaped blocks both fronts produce)."""
    last = messages[-1] if messages else None
    if not isinstance(last, dict) or last.get("role") != "user":
        raise InvalidRequest("messages: the last message must be the user's (an agent keeps the conversation; "
                             "only the last user message is sent)", field="messages")
    content = last.get("content")
    if isinstance(content, str):
        raw: str | list[JSON] = content
    else:
        parts: list[JSON] = []
        for block in content or []:
            kind = block.get("type") if isinstance(block, dict) else None
            source = block.get("source") if isinstance(block, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": block.get("text")})
            elif kind == "image" and isinstance(source, dict) and source.get("type") == "base64":
                parts.append({"type": "image", "data": source.get("data"), "media_type": source.get("media_type")})
            elif kind == "image":
                raise InvalidRequest("messages: an agent takes images inline (base64 data), not by URL",
                                     field="messages")
            else:
                raise InvalidRequest(f"messages: the last user message has a {kind} part; an agent takes text and "
                                     "images (its tools are its own: tool results cannot be sent)", field="messages")
        # text alone is sent as text, as a chat client sends it
        raw = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
    from pydantic import ValidationError

    from agentvm.protocol.messages import content_wire

    try:
        value = _content().validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidRequest(f"messages: the last user message: {first['msg']}", field="messages") from None
    if (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value):
        raise InvalidRequest("messages: the last user message is empty", field="messages")
    return content_wire(value)
