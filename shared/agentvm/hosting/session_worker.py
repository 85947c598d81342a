"""`chat_turn`: run a session's queued turns under its lease, then hand the session back.

One invocation takes the lease (with a block of seqs), announces messages that were queued while
the lease was taken, runs the queued turns one at a time with the same `TurnRunner` as `avm serve`,
and releases the lease in the write that also removes the finished turns. That write returns what
was added meanwhile; if anything is left the worker takes the lease again (release-then-recheck),
so a message queued at any moment is run by someone.

Reads before a turn: the queued turns (one BatchGetItem). The session comes with the lease (the
acquire's write returns the item), and the image and agent from the process's `DefinitionCache`
while the session's `definitions` counter and a TTL say they are still good (definition_cache.py);
interrupts are settled with a consistent read only between two turns of one tenure (before the
first, the acquire's state is exact and newer).

While a turn streams, a watcher reads the lease record (an eventually consistent read of half a read
unit, not a write) every `poll_s` at the turn's start, the interval doubling up to `max_poll_s`
(`INTERRUPT_BOUND_S`, 2 s): a 10 s turn reads it 7 times (at 0.25, 0.75, 1.75, 3.75, …) instead of
40 at a fixed 0.25 s, so an interrupt is seen within 0.25-0.5 s in the turn's first second and
within 2 s (plus one read) later: the documented interrupt latency bound. It looks for
interrupt requests, newly queued messages and owed replays, renews the lease well before it
expires, and stops the LLM stream when every subscriber has gone: the turn and its messages are
still stored, only the tokens nobody would see are saved.

A worker that dies holding the lease (a crash, the function's timeout) leaves its turn unfinished
and its runner mark on the lease record; so does one whose tenure raised (it releases the lease but
keeps the mark: its turn is not settled). The next worker to take the lease, once it has expired,
finds the mark (`LeaseState.dead_runner`) and fails that turn (`worker_lost`: the error triple,
`turn_response`, the error message in the history), as `avm serve` does at start-up with the turns
of a crash (hosting/recovery.py), and gives back the budget hold of the call it died in; the turns
queued behind it then run.

A worker given a `Drain` (a turn host's, hosting/drain.py) stops with its process: once draining it
starts no further turn and, instead of taking the lease again for work left, hands the session back
(`Drain.handed_back`: the host sends it to `chat_turn`); on `abort` it interrupts the running turn
(error `host_stopped`) and releases the lease as after any turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agentvm.domain.models import Agent, Checkpoint, Image, LeaseHandoff, LeaseState, Turn, TurnStatus
from agentvm.engine.channel import SEQ_BLOCK, SessionChannel
from agentvm.engine.history import SessionHistory
from agentvm.errors import WorkerLost
from agentvm.hosting import session_events
from agentvm.hosting.definition_cache import DefinitionCache
from agentvm.hosting.drain import HOST_STOPPED, HOST_STOPPED_TEXT, Drain
from agentvm.hosting.leased_host import LEASE_TTL_MS
from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.hosting.session_events import announce, drop_stopped, session_context
from agentvm.hosting.turn_scheduler import ScheduledTurn
from agentvm.ports import LeasedFanout, SessionLeases

log = logging.getLogger(__name__)

NO_LISTENERS = "no_listeners"
#: The longest a running turn takes to see an interrupt request (the watcher's longest pause).
INTERRUPT_BOUND_S = 2.0
WORKER_LOST_TEXT = "The worker running this turn stopped before it finished; send the message again to retry."


@dataclass(slots=True)
class _Run:
    """What one lease tenure did, for the release that ends it."""

    state: LeaseState
    done: set[str] = field(default_factory=set)
    announced: set[tuple[str, str]] = field(default_factory=set)
    interrupts: int = 0
    lost: bool = False
    handed_off: bool = False  # a turn went on in the container tier: its task takes the session on
    next_seq: int | None = None  # the first seq not used (the next holder continues there)


@dataclass(frozen=True, slots=True)
class DeadRunner:
    """What `fail_dead_runner` did: the turn it failed (None: the runner died between turns) and
    whether turns are left for a new runner."""

    lost: Turn | None
    more: bool


class SessionWorker:
    """`before_release(session_id)`: called while the lease is still held, just before each release
    (the container task's worker marks the session handled there; see agentvm/worker)."""

    def __init__(self, deps: RuntimePorts, *, fanout: LeasedFanout, leases: SessionLeases, owner: str,
                 poll_s: float = 0.25, max_poll_s: float = INTERRUPT_BOUND_S, lease_ms: int = LEASE_TTL_MS,
                 renew_s: float | None = None,
                 before_release: Callable[[str], Awaitable[None]] | None = None,
                 definitions: DefinitionCache | None = None, drain: Drain | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.deps = deps
        self.fanout = fanout
        self.leases = leases
        self.owner = owner
        self.poll_s = poll_s
        self.max_poll_s = max(poll_s, max_poll_s)
        self.lease_ms = lease_ms
        self.renew_s = lease_ms / 3000 if renew_s is None else renew_s  # renewed every third of the lease
        self.before_release = before_release
        self.definitions = definitions
        self.drain = drain
        self._sleep = sleep  # the watcher's pauses (tests: virtual time)
        self.acquired = False  # whether the last `run` got the lease at least once

    async def run(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> list[Turn]:
        """Run every queued turn of the session; returns the turns this invocation ran. `handoff`: the
        lease as the `ws_default` that started this run left it (taken over by the first acquire)."""
        ran: list[Turn] = []
        self.acquired = False
        while True:
            if self._draining:  # its process stops: the session's turns run elsewhere
                assert self.drain is not None
                self.drain.hand_back(tenant_id, session_id)
                return ran
            state = await self.leases.acquire(tenant_id, session_id, self.owner, self.lease_ms, SEQ_BLOCK,
                                              runner=True, handoff=handoff)
            handoff = None
            if state is None:
                return ran  # another invocation publishes; its release-then-recheck covers our work
            self.acquired = True
            run = _Run(state, interrupts=state.interrupts)
            if state.interrupts > state.interrupts_seen:
                # requested while the lease was handed on, before any turn ran: nothing to interrupt
                # (a no-op, as on a free session), acknowledged so that the requester stops waiting
                await self.leases.ack_interrupt(tenant_id, session_id, self.owner, state.interrupts)
            try:
                ran += await self._tenure(tenant_id, session_id, run)
            except BaseException:
                # The turn it was running is not settled: the release keeps the runner mark, so the next
                # holder fails that turn as a dead runner's (turn_failed at once, for a chat_turn that raised).
                await self._release_unsettled(tenant_id, session_id, run)
                raise
            rest = await self._release(tenant_id, session_id, run)
            if rest is None or not rest.has_work or run.handed_off:
                return ran

    async def fail_dead_runner(self, tenant_id: str, session_id: str, dead_runner: str) -> DeadRunner | None:
        """Lambda reported that the invocation `dead_runner` failed (crashed, ran out of memory or
        time): take its lease at once (not after it expires), fail the turn it was running as the
        next runner would (`worker_lost`, the budget hold given back) and release, leaving the turns
        queued behind it to a new runner (`DeadRunner.more`). None when the lease is no longer that
        invocation's (it released, or another runner recovered it): nothing to do."""
        state = await self.leases.take_over(tenant_id, session_id, self.owner, dead_runner, self.lease_ms, SEQ_BLOCK)
        if state is None:
            return None
        run = _Run(state, interrupts=state.interrupts)
        lost: Turn | None = None
        try:
            opened = await self._open(tenant_id, session_id, run)
            if opened is not None:
                turns, channel, _image, _agent = opened
                lost = await self._recover(channel, turns, run)
                leftover = channel.take_pending()
                if leftover:
                    await self.deps.store.commit(Checkpoint(tenant_id, session_id, events=leftover))
                run.next_seq = channel.next_seq
        except BaseException:
            await self._release_unsettled(tenant_id, session_id, run)  # the next holder recovers it
            raise
        rest = await self._release(tenant_id, session_id, run)
        return DeadRunner(lost, more=rest is not None and rest.has_work)

    async def _open(self, tenant_id: str, session_id: str,
                    run: _Run) -> tuple[list[Turn], SessionChannel, Image, Agent | None] | None:
        """The queued turns and the session's channel for a tenure, or None when there is nothing
        to run or announce."""
        store, state = self.deps.store, run.state
        if state.pending_subs:
            self.fanout.serve_pending(session_id)
        turns = await self.leases.get_turns(tenant_id, session_id, state.queued)
        run.done |= state.queued - {t.turn_id for t in turns}  # unknown ids: nothing to run
        if not turns and not state.announce:
            return None
        session = state.session or await store.get_session(tenant_id, session_id)
        found = await self._definitions(tenant_id, session_id, session.image_id, state.definitions) \
            if session is not None else None
        if found is None:  # deleted meanwhile: nothing left to run or announce
            run.done |= state.queued
            run.announced |= state.announce
            return None
        image, agent = found
        image = image.for_session(session_id)  # the image as this one of its sessions runs it
        channel = SessionChannel(store=store, fanout=self.fanout, tenant_id=tenant_id, session_id=session_id,
                                 context=session_context(image, agent.agent_id if agent else None),
                                 first_seq=state.first_seq, reserved_until=state.last_seq)
        return turns, channel, image, agent

    async def _tenure(self, tenant_id: str, session_id: str, run: _Run) -> list[Turn]:
        store, state = self.deps.store, run.state
        opened = await self._open(tenant_id, session_id, run)
        if opened is None:
            return []
        turns, channel, image, agent = opened
        ran: list[Turn] = []
        if state.dead_runner:
            lost = await self._recover(channel, turns, run)
            if lost is not None:
                ran.append(lost)  # reported with the turns this invocation ran (its metrics)
                turns = [t for t in turns if t is not lost]
        await self._announce(channel, state.announce, run)
        for turn in turns:
            escalated = turn.status == TurnStatus.RUNNING and turn.tier == "container"
            if escalated and self.deps.sandbox_tools is None:
                run.handed_off = True  # the container task resumes it, then runs the turns after it
                break
            if turn.status != TurnStatus.QUEUED and not escalated:
                run.done.add(turn.turn_id)  # finished by an invocation that died before its release
                continue
            if run.lost or self._draining:  # a draining process starts no further turn: it is handed back
                break
            if ran:  # read again between turns: an agent destroyed meanwhile runs nothing more
                agent = await store.get_agent_for_image(tenant_id, image.image_id)
                if agent is None and self.definitions is not None:
                    self.definitions.forget(tenant_id, session_id)
            if agent is None:  # the agent was destroyed: its queued turns do not run
                drop_stopped([turn])
                await store.commit(Checkpoint(tenant_id, session_id, turns=[turn]))
                run.done.add(turn.turn_id)
                continue
            channel.context["agentId"] = agent.agent_id
            if ran:  # before the first turn the acquire's state is exact
                await self._settle_interrupts(tenant_id, session_id, run)
            # read afresh: messages queued by ws_default since the last turn are part of the context
            history = self.deps.history(tenant_id, session_id, expect={turn.user_message_id})
            scheduled = await self._run_turn(turn, image, channel, history, run, resume=escalated)
            ran.append(turn)
            if scheduled.handed_off:
                run.handed_off = True
                break
            run.done.add(turn.turn_id)
        # events published outside a turn (announcements with nothing left to run)
        leftover = channel.take_pending()
        if leftover:
            await store.commit(Checkpoint(tenant_id, session_id, events=leftover))
        run.next_seq = channel.next_seq
        return ran

    @property
    def _draining(self) -> bool:
        return self.drain is not None and self.drain.draining

    async def _definitions(self, tenant_id: str, session_id: str, image_id: str,
                           definitions: int) -> tuple[Image, Agent | None] | None:
        """The session's image and agent: cached (definition_cache.py) or read (one consistent read
        of both); None when the image is gone."""
        cache = self.definitions
        cached = cache.get(tenant_id, session_id, image_id, definitions) if cache is not None else None
        if cached is not None:
            return cached
        image, agent = await self.deps.store.get_image_and_agent(tenant_id, image_id)
        if image is None:
            if cache is not None:
                cache.forget(tenant_id, session_id)
            return None
        if cache is not None:
            cache.put(tenant_id, session_id, definitions, image, agent)
        return image, agent

    async def _run_turn(self, turn: Turn, image: Image, channel: SessionChannel, history: SessionHistory,
                        run: _Run, *, resume: bool) -> ScheduledTurn:
        scheduled = ScheduledTurn(self.deps, channel, history)
        loop = asyncio.get_running_loop()
        watchers = [loop.create_task(self._watch(scheduled, turn, image, channel, run))]
        if self.drain is not None:
            watchers.append(loop.create_task(self._stop_on_abort(self.drain, scheduled, turn)))
        try:
            if resume:
                await scheduled.resume(turn, image)
            else:
                await scheduled.run(turn, image)
        finally:
            for watcher in watchers:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        return scheduled

    async def _stop_on_abort(self, drain: Drain, runner: ScheduledTurn, turn: Turn) -> None:
        """The process's drain ran out of time: end the turn now (interrupted, its reply so far kept)
        rather than leave it to die with the process and be failed after its lease expires."""
        await drain.aborted()
        log.warning("the host stops: interrupting the running turn",
                    extra={"session_id": turn.session_id, "turn_id": turn.turn_id})
        turn.error_code, turn.error_message = HOST_STOPPED, HOST_STOPPED_TEXT
        runner.interrupt()

    async def _watch(self, runner: ScheduledTurn, turn: Turn, image: Image, channel: SessionChannel,
                     run: _Run) -> None:
        tenant_id, session_id = turn.tenant_id, turn.session_id
        renewed = time.monotonic()
        pause = self.poll_s
        while True:
            await self._sleep(pause)
            pause = min(pause * 2, self.max_poll_s)
            if time.monotonic() - renewed >= self.renew_s:
                state = await self.leases.renew(tenant_id, session_id, self.owner, self.lease_ms)
                renewed = time.monotonic()
                if state is None:
                    log.error("session lease lost mid-turn", extra={"session_id": session_id, "turn_id": turn.turn_id})
                    run.lost = True
                    runner.interrupt()
                    return
            else:
                state = await self.leases.poll(tenant_id, session_id)
            if state.interrupts > run.interrupts:
                run.interrupts = state.interrupts
                runner.interrupt()
                session_events.interrupted(channel, channel.context.get("agentId", ""), image.container_id)
                await self.fanout.flushed()  # posted before the requester gets its response
                await self.leases.ack_interrupt(tenant_id, session_id, self.owner, state.interrupts)
            await self._announce(channel, state.announce - run.announced, run)
            if state.pending_subs - self.fanout.served.get(session_id, set()):
                self.fanout.serve_pending(session_id)
            if self.fanout.listeners(session_id) == 0:
                log.info("every subscriber left: stopping the LLM stream",
                         extra={"session_id": session_id, "turn_id": turn.turn_id})
                turn.error_code, turn.error_message = NO_LISTENERS, "Every client disconnected during the turn."
                runner.interrupt()
                return

    async def _recover(self, channel: SessionChannel, turns: list[Turn], run: _Run) -> Turn | None:
        """The previous runner died holding the lease: fail the turn it was running (turns run one at
        a time, oldest first: the oldest unfinished one) and return it; the others run as usual. A
        runner that died between two turns, or before its first, costs that turn (a rare window)."""
        lost = next((t for t in turns if t.status in (TurnStatus.QUEUED, TurnStatus.RUNNING)), None)
        if lost is None:
            return None
        log.error("the previous runner died during a turn: the turn is failed", extra={
            "session_id": lost.session_id, "turn_id": lost.turn_id, "runner": run.state.dead_runner})
        history = self.deps.history(lost.tenant_id, lost.session_id, expect={lost.user_message_id})
        await ScheduledTurn(self.deps, channel, history).abandon(lost, WorkerLost(WORKER_LOST_TEXT))
        if self.deps.meter is not None:
            try:
                released = await self.deps.meter.release_lost(lost)
            except Exception:  # the turn is failed already; the hold then lasts until the month ends
                log.exception("the dead runner's budget hold was not released", extra={"turn_id": lost.turn_id})
            else:
                if released:
                    log.warning("the dead runner's budget hold is released", extra={
                        "turn_id": lost.turn_id, "released": str(released)})
        run.done.add(lost.turn_id)
        return lost

    async def _settle_interrupts(self, tenant_id: str, session_id: str, run: _Run) -> None:
        """Interrupts requested between turns had nothing to interrupt: a no-op, as from `avm serve`,
        not a reason to stop the next turn."""
        state = await self.leases.poll(tenant_id, session_id, consistent=True)
        if state.interrupts > run.interrupts:
            run.interrupts = state.interrupts
            await self.leases.ack_interrupt(tenant_id, session_id, self.owner, state.interrupts)

    async def _announce(self, channel: SessionChannel, entries: frozenset[tuple[str, str]], run: _Run) -> None:
        """Publish the user messages of turns queued while the lease was taken (so they waited behind
        another turn: `conversation_queued` follows each, as from `avm serve`)."""
        if not entries:
            return
        tenant_id, session_id = channel.tenant_id, channel.session_id
        turns = {t.turn_id: t for t in await self.leases.get_turns(tenant_id, session_id,
                                                                   {turn_id for turn_id, _ in entries})}
        expect = {t.user_message_id for t in turns.values()}
        by_id = {m.message_id: m for m in await self.deps.history(tenant_id, session_id, expect).load()}
        for entry in sorted(entries, key=lambda e: turns[e[0]].created_at if e[0] in turns else 0):
            run.announced.add(entry)
            turn = turns.get(entry[0])
            message = by_id.get(turn.user_message_id) if turn else None
            if message is None:
                continue
            announce(channel, message, sender=entry[1] or None)
            session_events.queued(channel, message.message_id)

    async def _release_unsettled(self, tenant_id: str, session_id: str, run: _Run) -> None:
        try:
            await self._release(tenant_id, session_id, run, runner=False)
        except Exception:  # the lease then expires under the mark: the same outcome, later
            log.exception("the lease of a failed tenure was not released", extra={"session_id": session_id})

    async def _release(self, tenant_id: str, session_id: str, run: _Run, *, runner: bool = True) -> LeaseState | None:
        if run.lost:
            return None
        state = run.state
        # a last look for subscribers that came late; consistent only when a replay is known to be
        # owed (one recorded after this read stays on the record: the release returns it, and the
        # next tenure serves it)
        self.fanout.serve_pending(session_id,
                                  consistent=bool(state.pending_subs - self.fanout.served.get(session_id, set())))
        await self.fanout.drain()
        served = state.pending_subs | self.fanout.served.get(session_id, set())
        if self.before_release is not None:
            await self.before_release(session_id)
        return await self.leases.release(tenant_id, session_id, self.owner, done=run.done,
                                         announced=run.announced, served=served, next_seq=run.next_seq,
                                         runner=runner)
