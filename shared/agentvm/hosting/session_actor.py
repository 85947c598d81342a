"""One actor per active session: its event channel, its turn queue (one turn at a time) and the
running turn. Actors live in memory only while a session is in use."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from agentvm.domain.models import Checkpoint, Image, LoggedEvent, Turn
from agentvm.engine.channel import SessionChannel
from agentvm.engine.history import SessionHistory
from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.hosting.session_events import drop_stopped
from agentvm.hosting.turn_scheduler import ScheduledTurn

log = logging.getLogger(__name__)


class SessionActor:
    def __init__(self, deps: RuntimePorts, image: Image, channel: SessionChannel) -> None:
        self.deps = deps
        self.image = image
        self.channel = channel
        self.send_lock = asyncio.Lock()
        self.history = SessionHistory(deps.store, image.tenant_id, image.session_id)
        self._queue: deque[Turn] = deque()
        self._runner: ScheduledTurn | None = None
        self._task: asyncio.Task[None] | None = None
        self.last_used = time.monotonic()

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def idle(self) -> bool:
        return not self.busy and not self._queue and not self.channel.unpersisted_after(0)

    def set_agent(self, agent_id: str) -> None:
        self.channel.context["agentId"] = agent_id

    def submit(self, turn: Turn) -> bool:
        """Queue a turn; True when it has to wait behind another one."""
        self.last_used = time.monotonic()
        waiting = self.busy
        self._queue.append(turn)
        if not waiting:
            self._task = asyncio.get_running_loop().create_task(self._drain(), name=f"session-{turn.session_id}")
        return waiting

    def interrupt(self) -> bool:
        """Interrupt the running turn; False when the session is idle (a no-op)."""
        if self._runner is None:
            return False
        self._runner.interrupt()
        return True

    async def stop(self, *, reason: str) -> None:
        """Interrupt the running turn, drop queued ones, and wait for the running one to record."""
        dropped = list(self._queue)
        self._queue.clear()
        self.interrupt()
        if dropped:
            drop_stopped(dropped, reason)
            await self.deps.store.commit(Checkpoint(self.image.tenant_id, self.image.session_id, turns=dropped))
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=30)

    async def flush(self) -> None:
        """Persist events published outside a turn (e.g. session_destroyed)."""
        if self.busy:
            return  # the running turn's next checkpoint takes them
        events = self.channel.take_pending()
        if events:
            try:
                await self.deps.store.commit(Checkpoint(self.image.tenant_id, self.channel.session_id,
                                                        events=events))
            except BaseException:
                self.channel.restore_pending(events)
                raise

    async def _drain(self) -> None:
        while self._queue:
            turn = self._queue.popleft()
            try:
                self._runner = ScheduledTurn(self.deps, self.channel, self.history)
                await self._runner.run(turn, self.image)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("turn could not be recorded", extra={"turn_id": turn.turn_id})
            finally:
                self._runner = None
                self.last_used = time.monotonic()

    def replay_tail(self, after_seq: int) -> list[LoggedEvent]:
        return self.channel.unpersisted_after(after_seq)
