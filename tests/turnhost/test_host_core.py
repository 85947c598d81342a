"""TurnHost with fake ports: it registers before receiving, runs each session as its own task,
joins a request for a session it runs, refuses (hands to the fallback) at capacity or above its CPU
limit, re-registers at once when it stops or starts accepting, and drains on stop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest

from agentvm.domain.models import LeaseHandoff, Turn
from agentvm.domain.turn_hosts import TurnHostRecord, TurnRequest
from agentvm.turnhost.__main__ import Metrics
from agentvm.turnhost.cpu import CpuMeter
from agentvm.turnhost.host import HostOptions, TurnHost
from tests.turnhost.fakes import Directory, Dispatches, Queue


class Sessions:
    """run_session: each run waits until the test releases its session."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.handoffs: list[LeaseHandoff | None] = []
        self.gates: dict[str, asyncio.Event] = {}

    async def run(self, tenant_id: str, session_id: str, handoff: LeaseHandoff | None) -> Sequence[Turn]:
        self.started.append(session_id)
        self.handoffs.append(handoff)
        await self.gates.setdefault(session_id, asyncio.Event()).wait()
        return []

    def finish(self, session_id: str) -> None:
        self.gates.setdefault(session_id, asyncio.Event()).set()


class Cpu:
    def __init__(self) -> None:
        self.cpu, self.t = 0.0, 0.0

    def meter(self) -> CpuMeter:
        return CpuMeter(0.5, cpu=lambda: self.cpu, clock=lambda: self.t)


async def until(check: object, timeout: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def req(session_id: str) -> TurnRequest:
    return TurnRequest("t", session_id, f"r-{session_id}")


async def test_takes_joins_refuses_and_drains() -> None:
    queue, directory, fallback, sessions, cpu = Queue(), Directory(), Dispatches(), Sessions(), Cpu()
    host = TurnHost("h1", queue=queue, directory=directory, fallback=fallback, run_session=sessions.run,
                    cpu=cpu.meter(), options=HostOptions(capacity=2, heartbeat_s=60, poll_s=1, drain_s=5))
    serving = asyncio.create_task(host.serve())
    await until(lambda: directory.beats)
    assert (directory.beats[0].accepting, directory.beats[0].capacity, directory.beats[0].running) == (True, 2, 0)

    await queue.inbox.put([req("a"), req("a"), req("b")])
    await until(lambda: sessions.started == ["a", "b"])
    assert queue.deleted == ["r-a", "r-a", "r-b"]  # at receipt
    await until(lambda: len(directory.beats) == 2)  # full: it says so at once
    assert (directory.beats[1].accepting, directory.beats[1].running) == (False, 2)

    await queue.inbox.put([req("c")])  # at capacity: refused, handed to the function tier
    await until(lambda: fallback.started == [("t", "c")])
    sessions.finish("a")
    await until(lambda: len(directory.beats) == 3)
    assert (directory.beats[2].accepting, directory.beats[2].running) == (True, 1)

    cpu.t, cpu.cpu = 5.0, 2.0  # 0.4 s of CPU per second on 0.5 vCPU: 80 % > 70 %
    host.cpu.sample()
    await queue.inbox.put([req("d")])
    await until(lambda: fallback.started == [("t", "c"), ("t", "d")])
    assert host.refusal() == "cpu"

    host.stop()
    await until(lambda: directory.deregistered == ["h1"])
    assert not serving.done()  # b still runs
    sessions.finish("b")
    assert await asyncio.wait_for(serving, 3) is True
    c = host.counts
    assert (c.received, c.taken, c.joined, c.refused, c.by_reason) == (5, 2, 1, 2, {"capacity": 1, "cpu": 1})
    assert sessions.started == ["a", "b"] and directory.hosts == {}


async def test_a_handed_on_lease_is_run_after_the_sessions_run_here_and_refused_with_it() -> None:
    """A request without a handoff for a session running here joins that run; one that carries the
    lease a ws_default passed on (that run released already) runs right after it, with the handoff,
    so the lease is taken over instead of waiting to expire. A refused one is handed on with it."""
    queue, directory, fallback, sessions, cpu = Queue(), Directory(), Dispatches(), Sessions(), Cpu()
    host = TurnHost("h3", queue=queue, directory=directory, fallback=fallback, run_session=sessions.run,
                    cpu=cpu.meter(), options=HostOptions(capacity=1, heartbeat_s=60, poll_s=1, drain_s=5))
    serving = asyncio.create_task(host.serve())
    handoff = LeaseHandoff("ws/turn-2", 9)
    await queue.inbox.put([req("a")])
    await until(lambda: sessions.started == ["a"])
    await queue.inbox.put([req("a"), TurnRequest("t", "a", "r-a2", handoff)])
    await until(lambda: host.counts.received == 3)
    assert sessions.started == ["a"]  # the second waits for the first
    await queue.inbox.put([TurnRequest("t", "b", "r-b", LeaseHandoff("ws/turn-3", 4))])  # at capacity
    await until(lambda: fallback.started == [("t", "b")])
    assert fallback.handoffs == [LeaseHandoff("ws/turn-3", 4)]
    sessions.finish("a")
    await until(lambda: sessions.started == ["a", "a"])
    assert sessions.handoffs == [None, handoff]
    await until(lambda: not host.running)
    host.stop()
    assert await asyncio.wait_for(serving, 3) is True
    c = host.counts
    assert (c.received, c.taken, c.joined, c.refused) == (4, 2, 1, 1)


async def test_a_drain_that_runs_out_of_time_reports_it() -> None:
    queue, directory, sessions = Queue(), Directory(), Sessions()
    host = TurnHost("h2", queue=queue, directory=directory, fallback=Dispatches(), run_session=sessions.run,
                    cpu=Cpu().meter(), options=HostOptions(heartbeat_s=60, poll_s=1, drain_s=0.05,
                                                           abort_grace_s=0.05))
    serving = asyncio.create_task(host.serve())
    await queue.inbox.put([req("a")])
    await until(lambda: sessions.started == ["a"])
    host.stop()
    assert await asyncio.wait_for(serving, 3) is False
    sessions.finish("a")


def test_cpu_meter_measures_over_its_window() -> None:
    now, cpu = [0.0], [0.0]
    meter = CpuMeter(0.5, window_s=5, cpu=lambda: cpu[0], clock=lambda: now[0])
    assert meter.fraction() == 0.0
    for _ in range(10):  # 0.1 s of CPU per second
        now[0] += 1
        cpu[0] += 0.1
        meter.sample()
    assert round(meter.fraction(), 6) == 0.2  # of 0.5 vCPU
    for _ in range(5):  # then 0.45 s per second: the old rate has left the window
        now[0] += 1
        cpu[0] += 0.45
        meter.sample()
    assert round(meter.fraction(), 6) == 0.9


async def test_every_heartbeat_record_goes_to_on_beat_and_the_metric_has_no_host_id(
        capsys: pytest.CaptureFixture[str]) -> None:
    queue, directory, fallback, sessions, cpu = Queue(), Directory(), Dispatches(), Sessions(), Cpu()
    beats: list[TurnHostRecord] = []
    host = TurnHost("h-1", queue=queue, directory=directory, fallback=fallback, run_session=sessions.run,
                    cpu=cpu.meter(), options=HostOptions(capacity=1, heartbeat_s=60, poll_s=1, drain_s=5),
                    on_beat=beats.append)
    serving = asyncio.create_task(host.serve())
    await until(lambda: len(beats) == 1)
    await queue.inbox.put([req("a")])
    await until(lambda: len(beats) == 2)  # full: a heartbeat at once
    sessions.finish("a")
    await until(lambda: len(beats) == 3)
    host.stop()
    assert await serving is True
    assert beats == directory.beats
    assert [(b.running, b.accepting) for b in beats] == [(0, True), (1, False), (0, True)]

    capsys.readouterr()
    Metrics().beat(beats[1])
    blobs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(blobs) == 1
    (declared,) = blobs[0]["_aws"]["CloudWatchMetrics"]
    assert declared["Namespace"] == "AgentVM"
    assert declared["Dimensions"] == [["function", "service"]]
    assert declared["Metrics"] == [{"Name": "HostRunningTurns", "Unit": "Count"}]
    assert (blobs[0]["function"], blobs[0]["service"], blobs[0]["HostRunningTurns"]) == ("turn_host", "agentvm", [1.0])
    assert "h-1" not in json.dumps(blobs[0])
