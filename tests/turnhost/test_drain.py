"""A turn host's drain (SIGTERM: scale-in, a deploy, a Fargate Spot interruption's two-minute warning)
with fake ports: at `stop()` its session runs start no further turn and hand their sessions back (the
host sends them to the fallback before the drain ends); turns still running after `drain_s` are
interrupted through the host's `Drain` and get `abort_grace_s` to end; a run that ignores even that
makes `serve()` report False (exit code 1). The same with a real process on moto:
tests/turnhost/test_spot_interruption.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from agentvm.domain.models import LeaseHandoff, Turn
from agentvm.hosting.drain import Drain
from agentvm.turnhost.host import HostOptions, TurnHost
from tests.turnhost.fakes import Directory, Dispatches, Queue
from tests.turnhost.test_host_core import Cpu, req, until


class Runs:
    """run_session like SessionWorker with a Drain: each run is a turn that lasts until the test ends
    it (`finish`) or the drain aborts (`interrupted`); a session with a second turn queued hands itself
    back once draining instead of starting it."""

    def __init__(self, drain: Drain, *, queued: frozenset[str] = frozenset(), ignore_abort: bool = False) -> None:
        self.drain = drain
        self.queued = set(queued)
        self.ignore_abort = ignore_abort
        self.gates: dict[str, asyncio.Event] = {}
        self.ended: dict[str, str] = {}

    def finish(self, session_id: str) -> None:
        self.gates.setdefault(session_id, asyncio.Event()).set()

    async def run(self, tenant_id: str, session_id: str, _handoff: LeaseHandoff | None) -> Sequence[Turn]:
        gate = self.gates.setdefault(session_id, asyncio.Event())
        waits: set[asyncio.Future[object]] = {asyncio.ensure_future(gate.wait())}
        if not self.ignore_abort:
            waits.add(asyncio.ensure_future(self.drain.aborted()))
        _done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if self.ignore_abort:
            await gate.wait()
        self.ended[session_id] = "completed" if gate.is_set() else "interrupted"
        if session_id in self.queued and self.drain.draining:
            self.drain.hand_back(tenant_id, session_id)  # its next turn: elsewhere
        return []


def new_host(runs: Runs, fallback: Dispatches, queue: Queue, directory: Directory, **options: float) -> TurnHost:
    options.setdefault("poll_s", 1)
    return TurnHost("h-spot", queue=queue, directory=directory, fallback=fallback, run_session=runs.run,
                    cpu=Cpu().meter(), drain=runs.drain,
                    options=HostOptions(heartbeat_s=60, **options))  # type: ignore[arg-type]


async def test_the_running_turn_finishes_and_the_session_s_next_turn_is_handed_back() -> None:
    queue, directory, fallback, drain = Queue(), Directory(), Dispatches(), Drain()
    runs = Runs(drain, queued=frozenset({"a"}))
    host = new_host(runs, fallback, queue, directory, drain_s=5, abort_grace_s=5)
    serving = asyncio.create_task(host.serve())
    await queue.inbox.put([req("a"), req("b")])
    await until(lambda: len(host.running) == 2)
    host.stop()
    assert drain.draining and not drain.aborting
    await until(lambda: directory.deregistered == ["h-spot"])
    await queue.inbox.put([req("c")])  # what the receive in flight gets is refused: handed on, not lost
    await until(lambda: ("t", "c") in fallback.started)
    runs.finish("a")
    runs.finish("b")
    assert await asyncio.wait_for(serving, 3) is True
    assert runs.ended == {"a": "completed", "b": "completed"}  # within the drain: finished, not interrupted
    # c refused at once; a's queued turn handed back when its running turn ended, before the drain ended
    assert fallback.started == [("t", "c"), ("t", "a")]
    assert (host.counts.handed_back, host.counts.taken, host.counts.by_reason) == (1, 2, {"draining": 1})
    assert drain.handed_back == set() and not drain.aborting


async def test_turns_still_running_after_the_drain_are_interrupted_and_end_within_the_grace() -> None:
    queue, directory, fallback, drain = Queue(), Directory(), Dispatches(), Drain()
    runs = Runs(drain, queued=frozenset({"a"}))
    # a receive (a 1 s poll) is in flight at stop(): it is awaited, but the drain's deadline counts from
    # stop(), not from its end (on SQS a long poll lasts up to 20 s, and stopTimeout is 120 s)
    host = new_host(runs, fallback, queue, directory, drain_s=0.5, abort_grace_s=5, poll_s=1)
    serving = asyncio.create_task(host.serve())
    await queue.inbox.put([req("a"), req("b")])
    await until(lambda: len(host.running) == 2)
    await asyncio.sleep(0.05)  # the next receive is in flight
    started = time.monotonic()
    host.stop()
    assert await asyncio.wait_for(serving, 3) is True  # every run ended: a clean exit
    took = time.monotonic() - started
    # the receive returns after ~1 s, past the 0.5 s deadline: interrupted at once, ended at once (not
    # 1 + 0.5 s, not after the 5 s grace)
    assert 0.5 <= took < 1.4, took
    assert runs.ended == {"a": "interrupted", "b": "interrupted"} and drain.aborting
    assert fallback.started == [("t", "a")] and host.counts.handed_back == 1


async def test_a_run_that_ignores_the_interruption_makes_the_drain_report_failure() -> None:
    queue, directory, fallback, drain = Queue(), Directory(), Dispatches(), Drain()
    runs = Runs(drain, ignore_abort=True)
    host = new_host(runs, fallback, queue, directory, drain_s=0.05, abort_grace_s=0.1)
    serving = asyncio.create_task(host.serve())
    await queue.inbox.put([req("a")])
    await until(lambda: len(host.running) == 1)
    host.stop()
    assert await asyncio.wait_for(serving, 3) is False
    assert drain.aborting and "a" not in runs.ended
    runs.finish("a")
    await until(lambda: "a" in runs.ended)
