"""The cloud session host: no session lives in memory between invocations.

Whoever holds a session's lease (a record in the store, with a reserved block of seqs) is its only
publisher, so seqs reach clients in order. `ws_default` takes the lease briefly to announce a
message or to replay missed events; `chat_turn` (`session_worker.SessionWorker`) holds it while it
runs the queued turns. When the lease is taken, the work is recorded on the lease record instead
(`enqueue`, `owe_replay`, `request_interrupt`) and the holder picks it up: its release returns what
was added meanwhile, so nothing is stranded (release, then recheck, in one write).

Writes for one message on an idle session: the lease with a seq block that also queues the turn,
one batch (message, queued turn, the two announcement events). The lease is not released: it is
handed on to the runner that `send` starts (`LeaseHandoff`), whose acquire takes it over, so the
runner continues the seqs and no release is written in between. See docs/cloud-design.md.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from agentvm.domain.models import (
    Checkpoint,
    Image,
    LeaseHandoff,
    LeaseState,
    LoggedEvent,
    Principal,
    Turn,
    TurnStatus,
)
from agentvm.engine.channel import SessionChannel
from agentvm.errors import NotFound
from agentvm.hosting import session_events
from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.hosting.session_events import announce, drop_stopped, session_context
from agentvm.hosting.user_turns import new_user_turn
from agentvm.ports import Dispatcher, LeasedFanout, SessionLeases

log = logging.getLogger(__name__)

LEASE_TTL_MS = 60_000
ANNOUNCE_SEQ_BLOCK = 16  # a message announcement publishes 2 events; the rest of the block is skipped
STOP_WAIT_S = 5.0
INTERRUPT_WAIT_S = 3.0  # the holder acts within one poll: at most 2 s (session_worker.INTERRUPT_BOUND_S)
INTERRUPT_POLL_S = 0.05


class DeferredFanout:
    """Holds session events back until the checkpoint that stores them has committed, so a client
    never sees `message_persisted` for a message that was not persisted. (A `SessionChannel` only
    calls `to_session` on its fan-out.)"""

    def __init__(self, fanout: LeasedFanout) -> None:
        self.fanout = fanout
        self._held: list[tuple[str, int, str, str | None]] = []

    def to_session(self, session_id: str, seq: int, payload: str, *, exclude: str | None = None) -> None:
        self._held.append((session_id, seq, payload, exclude))

    def release(self) -> None:
        held, self._held = self._held, []
        for session_id, seq, payload, exclude in held:
            self.fanout.to_session(session_id, seq, payload, exclude=exclude)


class LeasedSessions:
    def __init__(self, deps: RuntimePorts, *, fanout: LeasedFanout, leases: SessionLeases, dispatcher: Dispatcher,
                 owner: str) -> None:
        self.deps = deps
        self.fanout = fanout
        self.leases = leases
        self.dispatcher = dispatcher
        self.owner = owner

    def set_agent(self, session_id: str, agent_id: str) -> None:
        """Nothing to do: each publisher reads the session's agent when it takes the lease."""

    async def send(self, p: Principal, connection_id: str | None, image: Image, agent_id: str,
                   content: str | list[dict[str, Any]], options: dict[str, Any] | None = None) -> Turn:
        store, sid = self.deps.store, image.session_id
        new = new_user_turn(p, image, content, options)
        turn_id = new.turn.turn_id
        # an owner of this message alone: only the runner started for it can take the lease over
        owner = f"{self.owner}/{turn_id}"
        state = await self.leases.acquire(p.tenant_id, sid, owner, LEASE_TTL_MS, ANNOUNCE_SEQ_BLOCK, queue=turn_id)
        if state is None:  # a turn is running: it announces the message and runs the turn next
            await store.commit(Checkpoint(p.tenant_id, sid, messages=[new.message], turns=[new.turn]))
            await self.leases.enqueue(p.tenant_id, sid, turn_id, connection_id)
            await self.fanout.drain()  # the requester's subscription is recorded before chat_turn reads it
            await self.dispatcher.start_turns(p.tenant_id, sid)
            return new.turn
        held = DeferredFanout(self.fanout)
        channel = self._channel(image, agent_id, state, held, ANNOUNCE_SEQ_BLOCK)
        announce(channel, new.message, sender=connection_id)
        try:
            await store.commit(Checkpoint(p.tenant_id, sid, messages=[new.message], turns=[new.turn],
                                          events=channel.take_pending()))
        except BaseException:
            await self.leases.release(p.tenant_id, sid, owner, done={turn_id})
            raise
        held.release()
        await self.fanout.drain()  # posted, and the requester's subscription recorded, before the runner starts
        try:
            await self.dispatcher.start_turns(p.tenant_id, sid, handoff=LeaseHandoff(owner, channel.next_seq))
        except BaseException:
            # the turn stays queued for the turn sweep; the seqs go on where the announcement ended
            await self.leases.release(p.tenant_id, sid, owner, next_seq=channel.next_seq)
            raise
        return new.turn

    async def interrupt(self, image: Image, agent_id: str) -> None:
        """Only a lease holder can be running a turn. Signal it and wait (briefly) until it has
        acted and posted `interrupted`, so the client gets that event before the response, as from
        `avm serve`."""
        t, sid = image.tenant_id, image.session_id
        count = await self.leases.request_interrupt(t, sid)
        if count is None:
            return  # nothing runs: a no-op
        deadline = asyncio.get_running_loop().time() + INTERRUPT_WAIT_S
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(INTERRUPT_POLL_S)
            state = await self.leases.poll(t, sid, consistent=True)
            if state.interrupts_seen >= count or not state.held:
                return
        log.warning("interrupt not acknowledged in time", extra={"session_id": sid})

    async def stop(self, image: Image, agent_id: str, *, reason: str) -> None:
        """The agent record is already deleted, so `chat_turn` runs no further turn of this image
        (runners' cached definitions of the session expire here: `bump_definitions`). Interrupt the
        running one, then take the lease to drop the queue and announce the end."""
        t, sid = image.tenant_id, image.session_id
        await self.leases.bump_definitions(t, sid)
        await self.leases.request_interrupt(t, sid)
        state = await self._acquire_within(t, sid, STOP_WAIT_S)
        if state is None:
            log.warning("session busy: session_destroyed not announced", extra={"session_id": sid})
            return
        try:
            queued = await self.leases.get_turns(t, sid, state.queued)
            dropped = drop_stopped((turn for turn in queued if turn.status == TurnStatus.QUEUED), reason)
            channel = self._channel(image, agent_id, state, self.fanout, ANNOUNCE_SEQ_BLOCK)
            session_events.session_destroyed(channel, image, agent_id)
            await self.deps.store.commit(Checkpoint(t, sid, turns=dropped, events=channel.take_pending()))
        except BaseException:
            await self.leases.release(t, sid, self.owner)
            raise
        # the queue is settled: a dead runner's mark goes with it (it must not fail a later turn)
        await self._release(t, sid, state, channel.next_seq, done=state.queued, announced=state.announce,
                            runner=True)

    async def subscribe(self, tenant_id: str, connection_id: str, session_id: str, after_seq: int | None) -> None:
        store = self.deps.store
        session = await store.get_session(tenant_id, session_id)
        if session is None:
            raise NotFound(f"Session not found: {session_id}")
        if after_seq is None:
            self.fanout.attach(connection_id, session_id, session.container_id)
            return
        # The stored log is complete only while nobody writes it: replay under the lease.
        state = await self.leases.acquire(tenant_id, session_id, self.owner, LEASE_TTL_MS, 0)
        if state is None:
            self.fanout.owe_replay(connection_id, session_id, session.container_id, after_seq)
            await self.fanout.drain()
            await self.leases.owe_replay(tenant_id, session_id, connection_id)
            return

        async def source(after_seq: int) -> list[LoggedEvent]:
            return await store.read_events(tenant_id, session_id, after_seq)

        try:
            await self.fanout.subscribe(connection_id, session_id, session.container_id, after_seq, source)
        except BaseException:
            await self.leases.release(tenant_id, session_id, self.owner)
            raise
        await self._release(tenant_id, session_id, state, state.first_seq)

    async def forget(self, image: Image) -> None:
        await self.leases.request_interrupt(image.tenant_id, image.session_id)

    async def shutdown(self) -> None:
        await self.fanout.drain()

    # ---- internals -----------------------------------------------------------------------------

    def _channel(self, image: Image, agent_id: str | None, state: LeaseState, fanout: Any,
                 block: int) -> SessionChannel:
        return SessionChannel(store=self.deps.store, fanout=fanout, tenant_id=image.tenant_id,
                              session_id=image.session_id, context=session_context(image, agent_id),
                              first_seq=state.first_seq, reserved_until=state.last_seq, block=block)

    async def _release(self, tenant_id: str, session_id: str, state: LeaseState, next_seq: int, *,
                       done: frozenset[str] = frozenset(), announced: frozenset[tuple[str, str]] = frozenset(),
                       runner: bool = False) -> None:
        """Serve owed replays, wait for delivery, release (handing `next_seq` on: the session's seqs
        stay gap-free); leftover work goes to `chat_turn`."""
        if state.pending_subs:
            self.fanout.serve_pending(session_id)
        await self.fanout.drain()
        served = state.pending_subs | self.fanout.served.get(session_id, set())
        rest = await self.leases.release(tenant_id, session_id, self.owner, done=done,
                                         announced=announced, served=served, next_seq=next_seq, runner=runner)
        if rest is not None and rest.has_work:
            await self.dispatcher.start_turns(tenant_id, session_id)

    async def _acquire_within(self, tenant_id: str, session_id: str, timeout_s: float) -> LeaseState | None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            state = await self.leases.acquire(tenant_id, session_id, self.owner, LEASE_TTL_MS, ANNOUNCE_SEQ_BLOCK)
            if state is not None or asyncio.get_running_loop().time() >= deadline:
                return state
            await asyncio.sleep(0.1)
