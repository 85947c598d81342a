"""The chat API (SSE and `execute`) on the same services, sessions and billing as the WebSocket.

A chat turn is an ordinary turn: the user message is stored and queued on a session with
`TurnService.send`, and the session's events (the same ones WebSocket subscribers get, with their
`seq`) are followed through a `Feed` and turned into chat events:

| session event | chat event |
|---|---|
| `conversation_start`, `tool_executing`, `tool_result`, `conversation_queued` | `thought` |
| `text_delta` | `message` (`{"content": chunk}`) |
| `error_occurred` | `error` (`{"code", "message"}`) |
| the turn's `turn_response` | `done` (`{"session_id", "turn_id", "status", "usage", "cost", …}`), the end |

Each chat event's `id` is the session event's `seq`, so a client that reconnects with
`Last-Event-ID` gets exactly what it missed (`resume`). Turns of a session run one at a time: a
message sent while another turn runs is queued, and its stream skips the turns ahead of it.
A client that goes away does not stop its turn; the turn ends and is stored as always.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, Self

import orjson

from agentvm.domain.models import TERMINAL_TURN_STATUSES, Image, Principal, Turn
from agentvm.domain.resource_uri import is_resource_uri
from agentvm.errors import InvalidRequest, NotFound
from agentvm.protocol.commands import ImageConfig
from agentvm.services.use_cases import UseCases

JSON = dict[str, Any]
DEFAULT_CONTAINER = "default"
HEARTBEAT_S = 15.0


class Feed(Protocol):
    """One listener on session events (`seq`-ordered encoded envelopes), for one tenant."""

    async def __aenter__(self) -> Self: ...
    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None: ...

    @property
    def connection_id(self) -> str | None:
        """The id the session host knows this listener by (it is not sent its own `user_message`);
        None where the listener is not a connection of the fan-out (the cloud's stream)."""
        ...

    async def follow(self, session_id: str, container_id: str, after_seq: int) -> None:
        """Deliver the session's events after `after_seq`, then live ones, each once, in order."""
        ...

    async def receive(self, timeout: float) -> str | None:
        """The next event (an encoded envelope), or None after `timeout` s without one."""
        ...


class Feeds(Protocol):
    def open(self, tenant_id: str) -> Feed: ...


@dataclass(frozen=True, slots=True)
class ChatEvent:
    event: str  # thought | message | error | done
    data: JSON
    id: int | None = None


def chat_event(envelope: JSON) -> ChatEvent | None:
    """The chat event of one session event (None: not shown on the chat API)."""
    kind, data, seq = envelope.get("type"), envelope.get("data") or {}, envelope.get("seq")
    if kind == "text_delta":
        return ChatEvent("message", {"content": data.get("text", "")}, seq)
    if kind == "conversation_start":
        return ChatEvent("thought", {"kind": "thinking"}, seq)
    if kind == "conversation_queued":
        return ChatEvent("thought", {"kind": "queued", "messageId": data.get("messageId")}, seq)
    if kind == "tool_executing":
        return ChatEvent("thought", {"kind": "tool_call", "tool": data.get("toolName"), "input": data.get("input"),
                                     "toolCallId": data.get("toolId")}, seq)
    if kind == "tool_result":
        return ChatEvent("thought", {"kind": "tool_result", "toolCallId": data.get("toolCallId"),
                                     "result": data.get("result"), "isError": bool(data.get("isError"))}, seq)
    if kind == "error_occurred":
        return ChatEvent("error", {"code": data.get("code") or "error", "message": data.get("message", "")}, seq)
    return None


def done_event(session_id: str, data: JSON, seq: int | None) -> ChatEvent:
    return ChatEvent("done", {"session_id": session_id, "turn_id": data.get("turnId"), "status": data.get("status"),
                              "usage": data.get("usage", {}), "cost": data.get("cost", {}),
                              "model": data.get("model"), "duration_ms": data.get("durationMs"),
                              "tier": data.get("tier")}, seq)


@dataclass(slots=True)
class ChatTurn:
    """One turn followed on the chat API."""

    session: Image  # the image as the session runs it
    turn_id: str
    feed: Feed
    ahead: set[str] = field(default_factory=set)  # turns of the session that run before this one

    async def events(self, *, heartbeat_s: float = HEARTBEAT_S, timeout_s: float | None = None
                     ) -> AsyncIterator[ChatEvent | None]:
        """The turn's chat events up to `done`; None now and then while nothing happens (a
        heartbeat: keep idle proxies open). `timeout_s` ends a turn that never finishes."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            wait = heartbeat_s if deadline is None else min(heartbeat_s, max(0.0, deadline - time.monotonic()))
            payload = await self.feed.receive(wait)
            if payload is None:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"the turn {self.turn_id} did not end within {timeout_s:g} s")
                yield None
                continue
            envelope = orjson.loads(payload)
            kind, data = envelope.get("type"), envelope.get("data") or {}
            if kind == "turn_response":
                turn_id = data.get("turnId")
                if turn_id == self.turn_id:
                    yield done_event(self.session.session_id, data, envelope.get("seq"))
                    return
                self.ahead.discard(str(turn_id))
                continue
            if self.ahead:
                continue  # a turn before ours is still streaming
            event = chat_event(envelope)
            if event is not None:
                yield event


class ChatService:
    def __init__(self, services: UseCases, feeds: Feeds) -> None:
        self.s = services
        self.feeds = feeds

    async def start(self, p: Principal, *, agent_type: str | None, session_id: str | None,
                    message: str | list[JSON], options: JSON, container_id: str | None) -> ChatTurn:
        """Store the message on the session (a new one built from `agent_type` when None) and return
        the turn to follow. The feed is following before the message is sent: nothing is missed."""
        if session_id is not None:
            _session, image = await self.s.image_sessions.with_image(p, session_id)
        else:
            if not agent_type:
                raise InvalidRequest("agent_type: required without a session_id (see GET /api/v1/agents)",
                                     field="agent_type")
            from agentvm.definitions import code_definition

            agent = agent_type
            if not is_resource_uri(agent_type) and code_definition(agent_type) is None:
                await self.definition(p, agent_type, field_name="agent_type")  # a clear 404 first
                agent = f"resource://agents/{agent_type}"
            config = ImageConfig(agent=agent, name=agent_type[:100])
            image = await self.s.images.create(p, container_id or DEFAULT_CONTAINER, config)
        feed = self.feeds.open(p.tenant_id)
        await feed.__aenter__()
        try:
            head = await self.s.deps.store.last_seq(p.tenant_id, image.session_id)
            await feed.follow(image.session_id, image.container_id, head)
            image, _agent, turn = await self.s.turns.send(p, feed.connection_id, image.image_id, None, message,
                                                          image.session_id, options)
            ahead = await self._ahead(p, image.session_id, turn)
        except BaseException:
            await feed.__aexit__(None, None, None)
            raise
        return ChatTurn(image, turn.turn_id, feed, ahead)

    async def resume(self, p: Principal, session_id: str, after_seq: int) -> ChatTurn | None:
        """Follow the session's latest turn again from `after_seq` (a reconnect with Last-Event-ID);
        None when the session has no turn."""
        _session, image = await self.s.image_sessions.with_image(p, session_id)
        turns = await self.s.deps.store.list_turns(p.tenant_id, session_id)
        if not turns:
            return None
        target = turns[-1]
        feed = self.feeds.open(p.tenant_id)
        await feed.__aenter__()
        try:
            await feed.follow(session_id, image.container_id, after_seq)
        except BaseException:
            await feed.__aexit__(None, None, None)
            raise
        ahead = {t.turn_id for t in turns[:-1] if t.status not in TERMINAL_TURN_STATUSES}
        return ChatTurn(image, target.turn_id, feed, ahead)

    async def _ahead(self, p: Principal, session_id: str, turn: Turn) -> set[str]:
        turns = await self.s.deps.store.list_turns(p.tenant_id, session_id)
        return {t.turn_id for t in turns if t.turn_id != turn.turn_id and t.status not in TERMINAL_TURN_STATUSES
                and (t.created_at, t.turn_id) < (turn.created_at, turn.turn_id)}

    async def definition(self, p: Principal, name: str, *, field_name: str = "agent_id") -> JSON:
        from agentvm.definitions import code_definition

        code = code_definition(name)
        if code is not None:
            return {"id": name, "source": "code", "description": code.get("description", ""), "definition": code}
        try:
            node = await self.s.resources.resolve(p, f"resource://agents/{name}")
        except (NotFound, InvalidRequest):
            raise NotFound(f"Agent not found: {name}", field=field_name) from None
        return {"id": name, "source": "resource", "uri": node.pinned,
                "description": node.resource.description, "definition": node.resource.content}

    async def definitions(self, p: Principal) -> list[JSON]:
        from agentvm.definitions import code_definitions

        items: list[JSON] = [{"id": n, "source": "code", "description": c.get("description", "")}
                             for n, c in code_definitions().items()]
        agents, _ = await self.s.resources.discover(p, kind="agent", limit=200)
        items += [{"id": a.name, "source": "resource", "uri": f"resource://agents/{a.name}@{a.version}",
                   "description": a.description} for a in agents]
        return items
