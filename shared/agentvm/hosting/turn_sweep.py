"""The turn sweep (cloud, on a schedule): a session whose queued turns nobody runs gets a runner.

A `chat_turn` that dies mid-turn (a crash, the function's timeout) leaves its lease to expire and its
turn unfinished. Without the sweep, the session's next message recovers it (hosting/session_worker.py),
so a user who only waits sees the turn hang. The sweep lists the unfinished turns (the Store's sparse
index: a few Queries that read nothing while nothing is unfinished), and for every session with a turn
older than `grace_ms` whose lease nobody holds and whose queue is not empty it dispatches `chat_turn`.
That runner finds the dead one's mark and fails its turn (`worker_lost`, its budget hold given back),
then runs the turns queued behind it. A dispatch that was lost (an async invoke that never ran) is
picked up the same way. A session whose lease is held is left alone: its holder runs its queue, and a
second `chat_turn` would find the lease taken and leave. A turn handed to the container tier is the
task's: the sweep starts a runner for it only when the task died under its mark (a `chat_turn`
would hand it back to a task that is still starting).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from agentvm.domain.models import Turn, TurnStatus
from agentvm.ports import Dispatcher, SessionLeases, Store

log = logging.getLogger(__name__)

#: A turn younger than this is left to the `chat_turn` its message started (cold start included).
SWEEP_GRACE_MS = 30_000
_PARALLEL = 16


@dataclass(frozen=True, slots=True)
class SweepReport:
    unfinished: int  # turns queued or running
    sessions: int  # sessions with one older than the grace
    dispatched: int  # runners started
    failed: int  # dispatches that failed (the next sweep tries again)


async def sweep(store: Store, leases: SessionLeases, dispatcher: Dispatcher, *, now_ms: int,
                grace_ms: int = SWEEP_GRACE_MS) -> SweepReport:
    turns = await store.list_unfinished_turns()
    stale: dict[tuple[str, str], list[Turn]] = {}
    for t in turns:
        if now_ms - t.created_at >= grace_ms:
            stale.setdefault((t.tenant_id, t.session_id), []).append(t)
    limit = asyncio.Semaphore(_PARALLEL)

    async def check(tenant_id: str, session_id: str, waiting: list[Turn]) -> str:
        async with limit:
            try:
                state = await leases.poll(tenant_id, session_id, consistent=True)
                if state.held or not state.queued:
                    return "left"
                if all(_in_container(t) for t in waiting) and not state.dead_runner:
                    return "left"  # the container task resumes it (it is starting, or was never started)
                await dispatcher.start_turns(tenant_id, session_id)
            except Exception:
                log.exception("the sweep could not start a runner", extra={"session_id": session_id})
                return "failed"
            log.warning("a session's queue had no runner: one is started",
                        extra={"session_id": session_id, "queued": len(state.queued)})
            return "dispatched"

    outcomes = await asyncio.gather(*(check(t, s, waiting) for (t, s), waiting in sorted(stale.items())))
    return SweepReport(len(turns), len(stale), outcomes.count("dispatched"), outcomes.count("failed"))


def _in_container(turn: Turn) -> bool:
    return turn.status == TurnStatus.RUNNING and turn.tier == "container"
