"""`TurnHost`: receive turn requests from the queue and run each session as its own task.

* Registration: the host's record in the directory (`until` = three heartbeats ahead, `capacity`,
  `running`, `accepting`), rewritten every heartbeat and at once when the host starts or stops
  accepting; deleted when it drains.
* Capacity: at most `capacity` sessions at once, and none more while the process's CPU use over the
  last seconds is above `max_cpu` of its vCPUs. A request the host receives but cannot take is
  refused: handed to the fallback (`chat_turn`) at once, never left waiting.
* A request for a session this host already runs is dropped: the running `SessionWorker`'s
  release-then-recheck runs whatever was queued meanwhile (that is what the request was for).
* Messages are deleted at receipt. A host killed holding a session's lease leaves the lease to
  expire; the next runner of the session (or the turn sweep) fails its turn `worker_lost` and gives
  the budget hold back (hosting/session_worker.py).
* `on_beat` sees every record the host writes (the running-turns metric the service scales in on).
* `stop()` (SIGTERM: ECS scale-in, a deploy, a Fargate Spot interruption's two-minute warning):
  deregister, stop receiving (requests received meanwhile are refused), let the running turns finish
  for up to `drain_s`. Through the host's `Drain` (hosting/drain.py) a session run starts no further
  turn: it hands its session back and the host sends it to the fallback (`chat_turn`) at once. Turns
  still running after `drain_s` are interrupted (`Drain.abort`) and their runs get `abort_grace_s`
  to store them and release their leases: everything settles before ECS's SIGKILL (stopTimeout 120 s:
  100 + 10 s by default). A host with a front (`endpoint`) stays registered, not accepting, until
  its sockets are closed (`deregister()` then).
* `take_here()`: a turn of a connection on the host's own WebSocket front (turnhost/front.py) runs
  on the host without a queue hop when it has room (turnhost/local_dispatch.py).
* `endpoint`: with a front, the private address, port and token other hosts post its sockets'
  frames to (turnhost/peers.py), written into every record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from agentvm.domain.models import LeaseHandoff, Turn
from agentvm.domain.turn_hosts import TurnHostRecord, TurnRequest
from agentvm.hosting.drain import Drain
from agentvm.ids import now_ms
from agentvm.ports import Dispatcher, TurnHostDirectory, TurnQueue
from agentvm.turnhost.cpu import CpuMeter

log = logging.getLogger("agentvm.turnhost")

RunSession = Callable[[str, str, LeaseHandoff | None], Awaitable[Sequence[Turn]]]
OnRun = Callable[[TurnRequest, Sequence[Turn], float], None]
OnBeat = Callable[[TurnHostRecord], None]

CPU_SAMPLE_S = 0.5
RECEIVE_RETRY_S = 1.0


@dataclass(slots=True)
class HostOptions:
    capacity: int = 200
    max_cpu: float = 0.7
    heartbeat_s: float = 10.0
    poll_s: float = 20.0
    drain_s: float = 100.0
    abort_grace_s: float = 10.0  # after drain_s: interrupted turns store their state and release their leases
    idle_pause_s: float = 0.05  # between empty receives when not long polling (poll_s 0: tests on moto)


@dataclass(slots=True)
class HostCounts:
    """What the host did with the requests it received."""

    received: int = 0
    taken: int = 0  # session runs started
    joined: int = 0  # requests for a session it was running already
    refused: int = 0  # handed to the fallback
    local: int = 0  # session runs started for the host's own front (take_here), without the queue
    handed_back: int = 0  # sessions with turns left when the host drained: sent to the fallback
    turns: int = 0  # turns its session runs ran
    by_reason: dict[str, int] = field(default_factory=dict)


class TurnHost:
    def __init__(self, host_id: str, *, queue: TurnQueue, directory: TurnHostDirectory, fallback: Dispatcher,
                 run_session: RunSession, cpu: CpuMeter, options: HostOptions | None = None,
                 on_run: OnRun | None = None, on_beat: OnBeat | None = None,
                 endpoint: tuple[str, int, str] | None = None, drain: Drain | None = None) -> None:
        """`drain`: the one `run_session` passes to its session runs (a new one when not given)."""
        self.host_id = host_id
        self.drain = drain or Drain()
        self.endpoint = endpoint
        # with a front the record must outlive the drain: other hosts find its open sockets by it
        # (not accepting, so no turn is sent to it); whoever closes the sockets calls `deregister()`
        self.stay_registered = endpoint is not None
        self._served = False
        self.queue = queue
        self.directory = directory
        self.fallback = fallback
        self.run_session = run_session
        self.cpu = cpu
        self.options = options or HostOptions()
        self.on_run = on_run
        self.on_beat = on_beat
        self.counts = HostCounts()
        self.running: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.draining = False
        self._advertised: bool | None = None
        self._wake: asyncio.Event | None = None
        self._stopped: asyncio.Event | None = None
        self._refusals: set[asyncio.Task[None]] = set()
        self.registered = False
        self._stop_at: float | None = None  # when `stop()` came: the drain's deadline counts from it

    # -- state

    def refusal(self) -> str | None:
        """Why the host would refuse a new session now (None: it takes it)."""
        if self.draining:
            return "draining"
        if len(self.running) >= self.options.capacity:
            return "capacity"
        if self.cpu.fraction() > self.options.max_cpu:
            return "cpu"
        return None

    def record(self) -> TurnHostRecord:
        o = self.options
        address, port, token = self.endpoint or ("", 0, "")
        return TurnHostRecord(self.host_id, now_ms() + int(3 * o.heartbeat_s * 1000), o.capacity,
                              len(self.running), self.refusal() is None, address, port, token)

    def take_here(self, tenant_id: str, session_id: str, handoff: LeaseHandoff | None = None) -> bool:
        """Run a session's queued turns on this host if it has room (True), or join its running
        run; False: the caller hands them on (the tiered dispatcher). Call it on the host's loop."""
        key = (tenant_id, session_id)
        request = TurnRequest(tenant_id, session_id, handoff=handoff)
        previous = self.running.get(key)
        if previous is not None:
            if handoff is None:
                self.counts.joined += 1
            else:  # as in `_take`: the handed-on lease is run after the ending run
                self.counts.taken += 1
                self.counts.local += 1
                self.running[key] = asyncio.create_task(self._run(request, after=previous))
            return True
        if self._wake is None or self.refusal() is not None:  # not serving, draining or full
            return False
        self.counts.taken += 1
        self.counts.local += 1
        self.running[key] = asyncio.create_task(self._run(request))
        self._changed()
        return True

    def stop(self) -> None:
        """Drain: deregister, stop receiving, let the running sessions finish (thread-unsafe: call it
        on the host's loop, e.g. from a signal handler installed with `loop.add_signal_handler`)."""
        if not self.draining:
            self._stop_at = time.monotonic()
        self.draining = True
        self.drain.drain()
        if self._stopped is not None:
            self._stopped.set()
        self._changed()

    # -- the process

    async def serve(self) -> bool:
        """Run until `stop()`, then drain. True when every session run finished within `drain_s`."""
        self._wake, self._stopped = asyncio.Event(), asyncio.Event()
        if self.draining:
            self._stopped.set()
        await self._beat()  # registered before the first receive: dispatchers can find it
        beats = asyncio.create_task(self._heartbeats())
        sampler = asyncio.create_task(self._sample_cpu())
        try:
            await self._receive_loop()
            finished = await self._drain()
        finally:
            self.draining = True  # also when receiving failed for good: the heartbeats deregister
            self._served = True
            sampler.cancel()
            self._changed()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await beats
        return finished

    async def _receive_loop(self) -> None:
        assert self._stopped is not None
        while not self.draining:
            room = max(1, self.options.capacity - len(self.running))
            receive = asyncio.create_task(self.queue.receive(room, self.options.poll_s))
            stopped = asyncio.create_task(self._stopped.wait())
            await asyncio.wait({receive, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            # a receive in flight when the host stops is still awaited: what it got is refused, not lost
            try:
                requests = await receive
            except Exception:
                log.exception("the turn queue could not be read")
                await asyncio.sleep(RECEIVE_RETRY_S)
                continue
            if not requests:
                if self.options.poll_s <= 0:
                    await asyncio.sleep(self.options.idle_pause_s)
                continue
            try:
                await self.queue.delete(requests)
            except Exception:  # they come back after the visibility timeout: a run that finds nothing to do
                log.exception("received turn requests could not be deleted")
            for request in requests:
                self._take(request)

    def _take(self, request: TurnRequest) -> None:
        self.counts.received += 1
        key = (request.tenant_id, request.session_id)
        previous = self.running.get(key)
        if previous is not None and request.handoff is None:
            self.counts.joined += 1
            return
        if previous is not None:
            # A lease handed on to this request while the session's last run here is ending (it
            # released already): run it right after, else the lease would wait to expire.
            self.counts.taken += 1
            self.running[key] = asyncio.create_task(self._run(request, after=previous))
            return
        reason = self.refusal()
        if reason is not None:
            self.counts.refused += 1
            self.counts.by_reason[reason] = self.counts.by_reason.get(reason, 0) + 1
            task = asyncio.create_task(self._refuse(request, reason))
            self._refusals.add(task)
            task.add_done_callback(self._refusals.discard)
            return
        self.counts.taken += 1
        self.running[key] = asyncio.create_task(self._run(request))
        self._changed()

    async def _refuse(self, request: TurnRequest, reason: str) -> None:
        try:
            await self.fallback.start_turns(request.tenant_id, request.session_id, handoff=request.handoff)
        except Exception:  # the turn sweep starts a runner for the session later
            log.exception("a refused turn request could not be handed on",
                          extra={"session_id": request.session_id, "reason": reason})

    async def _run(self, request: TurnRequest, *, after: asyncio.Task[None] | None = None) -> None:
        if after is not None:
            await asyncio.wait({after})
        started = time.monotonic()
        turns: Sequence[Turn] = ()
        key = (request.tenant_id, request.session_id)
        try:
            turns = await self.run_session(request.tenant_id, request.session_id, request.handoff)
        except Exception:
            log.exception("a session run failed", extra={"session_id": request.session_id})
        finally:
            if self.drain.take_handed_back(request.tenant_id, request.session_id):
                self.counts.handed_back += 1
                # before the run counts as done: the drain waits for it; the run took its handoff
                await self._refuse(replace(request, handoff=None), "draining")
            if self.running.get(key) is asyncio.current_task():  # not a run queued behind this one
                self.running.pop(key, None)
            self.counts.turns += len(turns)
            self._changed()
        if self.on_run is not None:
            try:
                self.on_run(request, turns, time.monotonic() - started)
            except Exception:
                log.exception("on_run failed")

    async def _drain(self) -> bool:
        pending = list(self.running.values()) + list(self._refusals)
        if not pending:
            return True
        log.info("draining", extra={"running": len(self.running)})
        # from SIGTERM, not from the end of the receive that was in flight (a long poll: up to 20 s), so
        # that drain_s + abort_grace_s stays within ECS's stopTimeout
        since = time.monotonic() - self._stop_at if self._stop_at is not None else 0.0
        _, late = await asyncio.wait(pending, timeout=max(0.0, self.options.drain_s - since))
        if late:
            log.warning("turns still running when the drain ended: interrupting them", extra={"running": len(late)})
            self.drain.abort()
            _, late = await asyncio.wait(late, timeout=self.options.abort_grace_s)
        if late:
            log.error("session runs still running after they were interrupted: their leases expire and the "
                      "next runner fails their turns", extra={"running": len(late)})
        return not late

    # -- registration

    def _changed(self) -> None:
        """Heartbeat at once when the host starts or stops accepting (or drains)."""
        if self._wake is None:
            return
        if self.draining or (self.refusal() is None) != self._advertised:
            self._wake.set()

    async def _heartbeats(self) -> None:
        assert self._wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.options.heartbeat_s)
            self._wake.clear()
            if self.draining and self.stay_registered:
                if self._served:
                    return
            elif self.draining:
                await self.deregister()
                return
            await self._beat()

    async def deregister(self) -> None:
        try:
            await self.directory.deregister(self.host_id)
        except Exception:  # its record lapses on its own (`until`)
            log.exception("the turn host could not deregister")
        self.registered = False

    async def _beat(self) -> None:
        record = self.record()
        if self.on_beat is not None:
            try:
                self.on_beat(record)
            except Exception:
                log.exception("on_beat failed")
        try:
            await self.directory.heartbeat(record)
        except Exception:
            log.exception("the turn host's heartbeat failed")
            return
        self._advertised = record.accepting
        self.registered = True

    async def _sample_cpu(self) -> None:
        while True:
            await asyncio.sleep(CPU_SAMPLE_S)
            self.cpu.sample()
            self._changed()
