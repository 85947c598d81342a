"""The local session host: one actor per active session, and subscriptions with `afterSeq` replay."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from agentvm.domain.models import Checkpoint, Image, LoggedEvent, Principal, Turn
from agentvm.engine.channel import SessionChannel
from agentvm.errors import NotFound
from agentvm.hosting import session_events
from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.hosting.session_actor import SessionActor
from agentvm.hosting.session_events import announce, session_context
from agentvm.hosting.user_turns import new_user_turn
from agentvm.observability import tracing

log = logging.getLogger(__name__)


class SessionRegistry:
    def __init__(self, deps: RuntimePorts, *, idle_evict_s: float = 300.0) -> None:
        self.deps = deps
        self.idle_evict_s = idle_evict_s
        self._actors: dict[str, SessionActor] = {}
        self._opening: dict[str, asyncio.Future[SessionActor]] = {}

    def get(self, session_id: str) -> SessionActor | None:
        return self._actors.get(session_id)

    def active_containers(self) -> dict[str, int]:
        """Distinct containers with a live session actor, per tenant: the metrics' gauge."""
        out: dict[str, int] = {}
        for tenant_id, _ in {(a.image.tenant_id, a.image.container_id) for a in self._actors.values()}:
            out[tenant_id] = out.get(tenant_id, 0) + 1
        return out

    async def actor_for(self, image: Image, agent_id: str | None) -> SessionActor:
        sid = image.session_id
        actor = self._actors.get(sid)
        if actor is not None:
            if agent_id:
                actor.set_agent(agent_id)
            return actor
        pending = self._opening.get(sid)
        if pending is not None:
            actor = await asyncio.shield(pending)
        else:
            fut: asyncio.Future[SessionActor] = asyncio.get_running_loop().create_future()
            self._opening[sid] = fut
            try:
                channel = await SessionChannel.open(store=self.deps.store, fanout=self.deps.fanout,
                                                    tenant_id=image.tenant_id, session_id=sid,
                                                    context=session_context(image, agent_id))
                actor = SessionActor(self.deps, image, channel)
                self._actors[sid] = actor
                fut.set_result(actor)
            except BaseException as exc:
                fut.set_exception(exc)
                fut.exception()  # retrieved: waiters re-raise it
                raise
            finally:
                del self._opening[sid]
        if agent_id:
            actor.set_agent(agent_id)
        return actor

    def set_agent(self, session_id: str, agent_id: str) -> None:
        actor = self._actors.get(session_id)
        if actor is not None:
            actor.set_agent(agent_id)

    async def send(self, p: Principal, connection_id: str | None, image: Image, agent_id: str,
                   content: str | list[dict[str, Any]], options: dict[str, Any] | None = None) -> Turn:
        """Store the user message durably, announce it, and queue its turn on the session's actor."""
        actor = await self.actor_for(image, agent_id)
        async with actor.send_lock:
            new = new_user_turn(p, image, content, options)
            # the turn's span: a child of this message's, not of whichever started the actor's task
            tracing.remember(new.turn.turn_id)
            await self.deps.store.commit(Checkpoint(p.tenant_id, image.session_id, messages=[new.message],
                                                    turns=[new.turn]))
            actor.history.extend([new.message])
            announce(actor.channel, new.message, sender=connection_id)
            if actor.submit(new.turn):
                session_events.queued(actor.channel, new.message.message_id)
        return new.turn

    async def interrupt(self, image: Image, agent_id: str) -> None:
        actor = self._actors.get(image.session_id)
        if actor is not None and actor.interrupt():
            session_events.interrupted(actor.channel, agent_id, image.container_id)

    async def stop(self, image: Image, agent_id: str, *, reason: str) -> None:
        """The agent was destroyed: end its turn, drop queued ones, announce `session_destroyed`."""
        actor = await self.actor_for(image, None)
        await actor.stop(reason=reason)
        actor.channel.context["agentId"] = agent_id
        session_events.session_destroyed(actor.channel, image, agent_id)
        await actor.flush()

    async def subscribe(self, tenant_id: str, connection_id: str, session_id: str, after_seq: int | None) -> None:
        session = await self.deps.store.get_session(tenant_id, session_id)
        if session is None:
            raise NotFound(f"Session not found: {session_id}")
        store = self.deps.store

        async def source(after_seq: int) -> list[LoggedEvent]:
            # The unpersisted tail first, in the same step as the store read is queued: a checkpoint
            # that takes the tail later commits after that read, so its events are in the copy; one
            # that took it before queued its commit ahead of the read (the store runs jobs in order).
            # Read the other way round, a checkpoint between the two lost its events from the replay.
            actor = self._actors.get(session_id)
            tail = actor.replay_tail(after_seq) if actor else []
            stored = await store.read_events(tenant_id, session_id, after_seq)
            return stored + tail

        await self.deps.fanout.subscribe(connection_id, session_id, session.container_id, after_seq, source)

    async def forget(self, image: Image) -> None:
        actor = self._actors.pop(image.session_id, None)
        if actor is not None:
            await actor.stop(reason="The image was deleted.")

    async def evict_idle(self) -> int:
        """Drop actors idle for a while; they are recreated on demand."""
        cutoff = time.monotonic() - self.idle_evict_s
        stale = [sid for sid, a in self._actors.items() if a.idle and a.last_used < cutoff]
        for sid in stale:
            del self._actors[sid]
        return len(stale)

    async def shutdown(self) -> None:
        actors = list(self._actors.values())
        await asyncio.gather(*(a.stop(reason="The server stopped.") for a in actors), return_exceptions=True)
        for a in actors:
            try:
                await a.flush()
            except Exception:
                log.exception("could not persist session events at shutdown")
