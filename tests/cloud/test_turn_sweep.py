"""The scheduled `turn_sweep` (moto): a session whose queued turn nobody runs (its `chat_turn` died
holding the lease) gets a runner once the lease has expired, without waiting for the next message;
sessions whose lease is held, and turns younger than the grace, are left alone. Idle, a sweep is the
16 Queries of the unfinished-turns index and nothing else."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agentvm.cloud import runtime as cloud_runtime
from agentvm.domain.models import Checkpoint, LeaseHandoff, Principal, TurnStatus
from agentvm.engine.channel import SEQ_BLOCK
from agentvm.hosting.leased_host import LEASE_TTL_MS, LeasedSessions
from agentvm.hosting.session_worker import WORKER_LOST_TEXT
from agentvm.hosting.turn_sweep import SWEEP_GRACE_MS, SweepReport, sweep
from agentvm.ids import now_ms
from agentvm.protocol.commands import ImageConfig
from agentvm.services.use_cases import UseCases
from tests.support.cloud_edge import load_handler
from tests.support.dynamodb_calls import Calls

TENANT = "t-sweep"


class Dispatches:
    """The Dispatcher port, recording."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []
        self.handoffs: list[LeaseHandoff | None] = []

    async def start_turns(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None:
        self.started.append((tenant_id, session_id))
        self.handoffs.append(handoff)


async def _queued_turn(rt: cloud_runtime.CloudRuntime, container: str) -> tuple[str, str, int, LeaseHandoff]:
    """A message sent over the WebSocket path whose dispatch is lost: the session, its stored queued
    turn, its time, and the lease its `ws_default` handed on (held until it expires, or until the
    dispatched runner takes it over)."""
    inv = rt.invocation(TENANT, role="ws_default")
    dispatches = Dispatches()
    sessions = LeasedSessions(inv.deps, fanout=inv.fanout, leases=rt.leases, dispatcher=dispatches,
                              owner=inv.owner)
    s, p = UseCases(inv.deps, sessions), Principal(TENANT)
    image = await s.images.create(p, container, ImageConfig(name="Sweep"))
    _, _, turn = await s.turns.send(p, None, image.image_id, None, "hello")
    await inv.fanout.close()
    (handoff,) = dispatches.handoffs
    assert handoff is not None
    return image.session_id, turn.turn_id, turn.created_at, handoff


def test_a_queue_left_by_a_dead_runner_gets_a_runner_once_its_lease_expires(
        cloud: cloud_runtime.CloudRuntime) -> None:
    cloud_runtime.run(_dead_runner(cloud))


async def _dead_runner(rt: cloud_runtime.CloudRuntime) -> None:
    dead_sid, dead_turn, first, handoff = await _queued_turn(rt, "c-dead")
    live_sid, _, created, _ = await _queued_turn(rt, "c-live")
    assert created >= first
    # chat_turn took the first session's lease over and died; the second's dispatch was lost: the
    # lease its ws_default handed on is held until it expires
    assert await rt.leases.acquire(TENANT, dead_sid, "chat_turn:dead", LEASE_TTL_MS, SEQ_BLOCK, runner=True,
                                   handoff=handoff)
    dispatches = Dispatches()

    async def sweep_at(ms: int) -> SweepReport:
        return await sweep(rt.store, rt.leases, dispatches, now_ms=ms)

    # young turns are left to the chat_turn their message started; both leases still run
    assert await sweep_at(first + SWEEP_GRACE_MS - 1) == SweepReport(2, 0, 0, 0)
    assert await sweep_at(created + SWEEP_GRACE_MS) == SweepReport(2, 2, 0, 0)
    assert dispatches.started == []

    # past the leases' expiry both sessions get a runner: the lost dispatch's and the dead runner's
    later = time.time() + LEASE_TTL_MS / 1000 + 1
    rt.store._clock = lambda: later
    assert await sweep_at(int(later * 1000)) == SweepReport(2, 2, 2, 0)
    assert sorted(dispatches.started) == sorted([(TENANT, dead_sid), (TENANT, live_sid)])
    # the live session's runner holds it now: only the dead runner's session gets one
    dispatches.started.clear()
    assert await rt.leases.acquire(TENANT, live_sid, "chat_turn:live", LEASE_TTL_MS, SEQ_BLOCK, runner=True)
    assert await sweep_at(int(later * 1000)) == SweepReport(2, 2, 1, 0)
    assert dispatches.started == [(TENANT, dead_sid)]

    # the chat_turn it starts fails the dead runner's turn, and then nothing is left to sweep there
    inv = rt.invocation(TENANT, role="chat_turn", driver=await rt.driver())
    ran = await rt.worker(inv).run(TENANT, dead_sid)
    await inv.fanout.close()
    assert [(t.turn_id, t.status, t.error_code, t.error_message) for t in ran] == [
        (dead_turn, TurnStatus.FAILED, "worker_lost", WORKER_LOST_TEXT)]
    dispatches.started.clear()
    assert await sweep_at(int(later * 1000)) == SweepReport(1, 1, 0, 0)  # only the live session's turn
    assert dispatches.started == []


def test_a_turn_handed_to_the_container_tier_is_swept_only_when_its_task_died(
        cloud: cloud_runtime.CloudRuntime) -> None:
    cloud_runtime.run(_container_turn(cloud))


async def _container_turn(rt: cloud_runtime.CloudRuntime) -> None:
    sid, _, created, handoff = await _queued_turn(rt, "c-tools")
    (turn,) = await rt.store.list_turns(TENANT, sid)
    # chat_turn took the lease over, escalated the turn (handing it on to a task) and released
    state = await rt.leases.acquire(TENANT, sid, "chat_turn:x", LEASE_TTL_MS, SEQ_BLOCK, runner=True, handoff=handoff)
    assert state is not None and state.first_seq == handoff.next_seq
    turn.status, turn.tier = TurnStatus.RUNNING, "container"
    await rt.store.commit(Checkpoint(TENANT, sid, turns=[turn]))
    assert await rt.leases.release(TENANT, sid, "chat_turn:x", next_seq=state.first_seq, runner=True)
    dispatches = Dispatches()
    at = created + SWEEP_GRACE_MS

    # its task is still starting (no lease, no mark): a chat_turn would only hand it on again
    assert await sweep(rt.store, rt.leases, dispatches, now_ms=at) == SweepReport(1, 1, 0, 0)
    # the task took the lease and died; once the lease has expired, a runner is started to fail the turn
    assert await rt.leases.acquire(TENANT, sid, "task-0f3e", LEASE_TTL_MS, SEQ_BLOCK, runner=True)
    assert (await rt.leases.poll(TENANT, sid, consistent=True)).dead_runner == ""  # held: not dead yet
    assert await sweep(rt.store, rt.leases, dispatches, now_ms=at) == SweepReport(1, 1, 0, 0)
    later = time.time() + LEASE_TTL_MS / 1000 + 1
    rt.store._clock = lambda: later
    assert (await rt.leases.poll(TENANT, sid, consistent=True)).dead_runner == "task-0f3e"
    assert await sweep(rt.store, rt.leases, dispatches, now_ms=at) == SweepReport(1, 1, 1, 0)
    assert dispatches.started == [(TENANT, sid)]


def test_an_idle_sweep_reads_the_index_only(cloud: cloud_runtime.CloudRuntime) -> None:
    calls, dispatches = Calls(cloud.store), Dispatches()
    report = cloud_runtime.run(calls.ops(sweep(cloud.store, cloud.leases, dispatches, now_ms=now_ms())))
    assert report == ["Query"] * 16
    assert dispatches.started == []


class FailingDispatches(Dispatches):
    async def start_turns(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None:
        raise RuntimeError("Lambda is down")


def test_the_handler_reports_and_a_failed_dispatch_is_left_to_the_next_sweep(
        cloud: cloud_runtime.CloudRuntime, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    sid, _, _, _ = cloud_runtime.run(_queued_turn(cloud, "c-lost"))
    handler = load_handler("turn_sweep")
    later = time.time() + LEASE_TTL_MS / 1000 + 1  # the lease handed on to the lost dispatch has expired
    cloud.store._clock = lambda: later
    monkeypatch.setattr(handler, "now_ms", lambda: int(later * 1000))
    cloud.__dict__["dispatcher"] = FailingDispatches()  # the runtime's cached dispatcher
    assert handler.handler({}, None) == {"unfinished": 1, "sessions": 1, "dispatched": 0, "failed": 1}
    recorder = Dispatches()
    cloud.__dict__["dispatcher"] = recorder
    assert handler.handler({}, None) == {"unfinished": 1, "sessions": 1, "dispatched": 1, "failed": 0}
    assert recorder.started == [(TENANT, sid)]
    emf: list[dict[str, Any]] = [line for line in map(_json, capsys.readouterr().out.splitlines()) if "_aws" in line]
    assert [(m["function"], m.get("SweepDispatched"), m.get("SweepDispatchFailed")) for m in emf] == [
        ("turn_sweep", [0.0], [1.0]), ("turn_sweep", [1.0], None)]


def _json(line: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
