"""The container task's loop (agentvm/worker/container_worker.py) with a fake record, disk and
sessions: what it serves, when it may exit, and that no escalated session is left behind."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any, cast

import pytest

from agentvm.adapters.aws.ecs_tasks import TaskWork
from agentvm.hosting.session_worker import SessionWorker
from agentvm.worker.container_worker import ContainerWorker, WorkerOptions


class Record:
    def __init__(self, pending: set[str]) -> None:
        self.pending_set = set(pending)
        self.calls: list[str] = []
        self.arrive_at_finish: set[str] = set()  # sessions escalated just before the first finish
        self.beat_ok = True
        self.stop_set: set[tuple[str, str]] = set()  # MCP servers of deleted images

    async def register(self, ttl_s: int) -> bool:
        self.calls.append("register")
        return True

    async def beat(self, ttl_s: int) -> bool:
        self.calls.append("beat")
        return self.beat_ok

    async def poll(self) -> TaskWork:
        return TaskWork(set(self.pending_set), set(self.stop_set))

    async def stopped(self, servers: Collection[tuple[str, str]]) -> None:
        self.calls.append(f"stopped:{','.join(sorted(name for name, _ in servers))}")
        self.stop_set -= set(servers)

    async def done(self, session_ids: set[str]) -> None:
        self.calls.append(f"done:{','.join(sorted(session_ids))}")
        self.pending_set -= session_ids

    async def finish(self) -> bool:
        if self.arrive_at_finish:
            self.pending_set |= self.arrive_at_finish
            self.arrive_at_finish = set()
        ok = not self.pending_set
        self.calls.append(f"finish:{ok}")
        return ok

    async def release(self) -> bool:
        self.calls.append("release")
        return True


class Disk:
    def __init__(self, fail_mount: bool = False) -> None:
        self.calls: list[str] = []
        self.fail_mount = fail_mount

    async def mount(self, tenant_id: str, container_id: str) -> Path:
        if self.fail_mount:
            raise OSError("S3 unreachable")
        self.calls.append("mount")
        return Path("/nonexistent")

    async def sync(self, tenant_id: str, container_id: str) -> None:
        self.calls.append("sync")

    async def unmount(self, tenant_id: str, container_id: str) -> None:
        self.calls.append("unmount")


class Fanout:
    closed = 0

    async def close(self) -> None:
        Fanout.closed += 1


class FakeSessions:
    """Session runs: `busy` sessions have their lease held elsewhere `busy[s]` more times."""

    def __init__(self, record: Record, busy: dict[str, int] | None = None, gone: set[str] | None = None) -> None:
        self.record = record
        self.busy = busy or {}
        self.gone = gone or set()
        self.runs: list[str] = []

    def factory(self, before_release: Callable[[str], Awaitable[None]]) -> SessionWorker:
        outer = self

        class Worker:
            acquired = False
            fanout = Fanout()

            async def run(self, tenant_id: str, session_id: str) -> list[Any]:
                if session_id in outer.gone:
                    return []
                if outer.busy.get(session_id, 0) > 0:
                    outer.busy[session_id] -= 1
                    return []
                self.acquired = True
                outer.runs.append(session_id)
                await before_release(session_id)  # while the lease is held
                return ["turn"]

        return cast(SessionWorker, Worker())

    async def exists(self, session_id: str) -> bool:
        return session_id not in self.gone


def worker(record: Record, disk: Disk, sessions: FakeSessions) -> ContainerWorker:
    return ContainerWorker(tenant_id="t", container_id="c", record=record, disk=cast(Any, disk),
                           session_worker=sessions.factory, session_exists=sessions.exists,
                           options=WorkerOptions(idle_s=0.05, heartbeat_ttl_s=60, poll_s=0.01))


async def test_serves_the_pending_sessions_then_finishes_when_idle() -> None:
    record, disk = Record({"s1", "s2"}), Disk()
    sessions = FakeSessions(record)
    Fanout.closed = 0
    assert await worker(record, disk, sessions).run() == 2
    assert sessions.runs == ["s1", "s2"]
    # each session: workspace synced, then marked handled, before its lease is released
    assert record.calls == ["register", "done:s1", "done:s2", "finish:True"]
    assert disk.calls == ["mount", "sync", "sync", "sync", "unmount"]
    assert Fanout.closed == 2


async def test_a_session_escalated_while_finishing_is_served_before_exit() -> None:
    record, disk = Record({"s1"}), Disk()
    record.arrive_at_finish = {"s2"}
    sessions = FakeSessions(record)
    assert await worker(record, disk, sessions).run() == 2
    assert sessions.runs == ["s1", "s2"]
    assert record.calls == ["register", "done:s1", "finish:False", "done:s2", "finish:True"]


async def test_a_busy_lease_is_retried_and_a_deleted_session_is_dropped() -> None:
    record, disk = Record({"s1", "gone"}), Disk()
    sessions = FakeSessions(record, busy={"s1": 2}, gone={"gone"})
    assert await worker(record, disk, sessions).run() == 1
    assert sessions.runs == ["s1"]
    assert record.calls.count("done:gone") == 1
    assert record.calls[-1] == "finish:True"


async def test_a_workspace_that_cannot_be_mounted_releases_the_container_at_once() -> None:
    record, disk = Record({"s1"}), Disk(fail_mount=True)
    with pytest.raises(OSError, match="S3 unreachable"):
        await worker(record, disk, FakeSessions(record)).run()
    assert record.calls == ["register", "release"]
    assert record.pending_set == {"s1"}  # still pending: the next task serves it


async def test_stop_ends_after_the_current_session_and_releases_with_work_left() -> None:
    record, disk = Record({"s1", "s2"}), Disk()
    sessions = FakeSessions(record)
    w = worker(record, disk, sessions)
    original = sessions.factory

    def stopping(before_release: Callable[[str], Awaitable[None]]) -> SessionWorker:
        w.stop()  # SIGTERM during the first session
        return original(before_release)

    w.session_worker = stopping
    assert await asyncio.wait_for(w.run(), 5) == 1
    assert sessions.runs == ["s1"]
    assert record.calls == ["register", "done:s1", "release"]
    assert disk.calls[-1] == "unmount"


async def test_mcp_servers_of_a_deleted_image_are_stopped_before_serving_on() -> None:
    record, disk = Record({"s1"}), Disk()
    record.stop_set = {("files", "f1"), ("web", "f2")}
    sessions = FakeSessions(record)
    asked: list[set[tuple[str, str]]] = []

    async def stop_mcp(servers: set[tuple[str, str]]) -> int:
        asked.append(servers)
        assert sessions.runs == []  # before the pending session is served
        return 1

    w = ContainerWorker(tenant_id="t", container_id="c", record=record, disk=cast(Any, disk),
                        session_worker=sessions.factory, session_exists=sessions.exists,
                        options=WorkerOptions(idle_s=0.05, heartbeat_ttl_s=60, poll_s=0.01), stop_mcp=stop_mcp)
    assert await w.run() == 1
    assert asked == [{("files", "f1"), ("web", "f2")}]  # once: then removed from the record
    assert record.calls == ["register", "stopped:files,web", "done:s1", "finish:True"]
    assert record.stop_set == set()
