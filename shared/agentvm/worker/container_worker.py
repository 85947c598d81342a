"""The container tier's worker: one per Fargate task, serving one container.

It registers on the container-task record (agentvm/adapters/aws/ecs_tasks.py), mounts the
container's workspace (the `Disk` port: in the cloud, pulled from S3), then takes the sessions
escalated to it (`pending`) one by one: each under the session's lease, with the same
`SessionWorker` as `chat_turn` but in the container tier, so an escalated turn resumes where the
function tier stopped (same seq order, pending tool calls run here) and the session's later queued
turns run here too while the task lives. Before each lease release the workspace is synced and the
session is marked handled, while the lease still keeps new escalations of that session out. It
beats the heartbeat while alive, and exits after `idle_s` without work, through the record's
`finish` (which fails, and the loop goes on, if a session arrived in the meantime); the workspace is
synced before, and unmounted at exit. SIGTERM (ECS stopping the task) ends the loop after the
current session. The same read of the record names the MCP servers of images deleted meanwhile: the
worker stops them (`stop_mcp`) before serving on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from agentvm.hosting.session_worker import SessionWorker

if TYPE_CHECKING:
    from agentvm.adapters.aws.ecs_tasks import TaskWork
    from agentvm.ports import Disk

log = logging.getLogger(__name__)


class TaskRecord(Protocol):
    async def register(self, ttl_s: int) -> bool: ...
    async def beat(self, ttl_s: int) -> bool: ...
    async def poll(self) -> TaskWork: ...
    async def stopped(self, servers: Collection[tuple[str, str]]) -> None: ...
    async def done(self, session_ids: set[str]) -> None: ...
    async def finish(self) -> bool: ...
    async def release(self) -> bool: ...


@dataclass(slots=True)
class WorkerOptions:
    idle_s: float = 90.0  # Fargate bills from start with a one-minute minimum: stay a little for the next turn
    heartbeat_ttl_s: int = 60
    poll_s: float = 1.0


class ContainerWorker:
    def __init__(self, *, tenant_id: str, container_id: str, record: TaskRecord, disk: Disk,
                 session_worker: Callable[[Callable[[str], Awaitable[None]]], SessionWorker],
                 session_exists: Callable[[str], Awaitable[bool]], options: WorkerOptions | None = None,
                 stop_mcp: Callable[[set[tuple[str, str]]], Awaitable[int]] | None = None) -> None:
        self.tenant_id = tenant_id
        self.container_id = container_id
        self.record = record
        self.disk = disk
        self.session_worker = session_worker
        self.session_exists = session_exists
        self.options = options or WorkerOptions()
        self.stop_mcp = stop_mcp  # stops (name, config fingerprint) MCP servers of this container
        self._stop = asyncio.Event()
        self._lost = False
        self.handled: list[str] = []  # sessions served, in order (tests, logs)

    def stop(self) -> None:
        """End after the current session (SIGTERM)."""
        self._stop.set()

    async def run(self) -> int:
        """Serve the container until idle; returns how many turns ran."""
        o = self.options
        extra = {"tenant_id": self.tenant_id, "container_id": self.container_id}
        if not await self.record.register(o.heartbeat_ttl_s):
            log.warning("another task serves this container: exiting", extra=extra)
            return 0
        try:
            await self.disk.mount(self.tenant_id, self.container_id)
        except BaseException:
            # without its workspace the task cannot serve: let the next escalation start another now
            log.exception("workspace could not be mounted", extra=extra)
            await self.record.release()
            raise
        log.info("container worker started", extra=extra)
        beater = asyncio.get_running_loop().create_task(self._beat())
        finished = False
        turns = 0
        try:
            idle_since = time.monotonic()
            while not self._stop.is_set() and not self._lost:
                work = await self.record.poll()
                if work.stop_mcp:
                    await self._stop_servers(work.stop_mcp)
                sessions = work.pending
                if sessions:
                    for session_id in sorted(sessions):
                        if self._stop.is_set() or self._lost:
                            break
                        turns += await self._serve(session_id)
                    idle_since = time.monotonic()
                    continue
                if time.monotonic() - idle_since >= o.idle_s:
                    await self.disk.sync(self.tenant_id, self.container_id)
                    if await self.record.finish():
                        finished = True
                        break
                    continue  # a session arrived meanwhile
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), o.poll_s)
        finally:
            beater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beater
            try:
                await self.disk.unmount(self.tenant_id, self.container_id)  # after finish: nothing changed
            except Exception:
                log.exception("workspace not synced at exit", extra=extra)
            if not finished and not self._lost:
                await self.record.release()  # the next escalation starts a new task at once
        log.info("container worker exits", extra={**extra, "turns": turns, "sessions": len(self.handled)})
        return turns

    async def _stop_servers(self, servers: set[tuple[str, str]]) -> None:
        """The MCP servers of deleted images: stopped, then removed from the record."""
        stopped = await self.stop_mcp(servers) if self.stop_mcp is not None else 0
        await self.record.stopped(servers)
        log.info("mcp servers of deleted images stopped", extra={
            "tenant_id": self.tenant_id, "container_id": self.container_id, "count": stopped})

    async def _serve(self, session_id: str) -> int:
        async def handled(sid: str) -> None:
            await self.disk.sync(self.tenant_id, self.container_id)
            await self.record.done({sid})

        worker = self.session_worker(handled)
        try:
            ran = await worker.run(self.tenant_id, session_id)
        finally:
            await worker.fanout.close()
        if worker.acquired:
            self.handled.append(session_id)
        elif not await self.session_exists(session_id):
            await self.record.done({session_id})  # deleted meanwhile: nothing to run
        else:
            # a chat_turn invocation holds the lease (announcing, or handing over): try again soon
            await asyncio.sleep(self.options.poll_s / 4)
        return len(ran)

    async def _beat(self) -> None:
        ttl = self.options.heartbeat_ttl_s
        while True:
            await asyncio.sleep(ttl / 3)
            if not await self.record.beat(ttl):
                log.error("another task took the container over: stopping",
                          extra={"tenant_id": self.tenant_id, "container_id": self.container_id})
                self._lost = True
                self._stop.set()
                return
