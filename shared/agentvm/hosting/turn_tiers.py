"""The scheduler of the pure-chat tiers: a turn runs on a turn host when one takes turns, else on
the per-turn function (`chat_turn`).

A host's marginal cost for one more turn is about nothing (it is paid for by the hour and waits on
many LLM streams at once), a `chat_turn` invocation bills the whole turn's wall time: the cheapest
available tier is the host whenever one accepts. The choice needs the directory of hosts; it is read
at most once per `cache_s` per process (a busy `ws_default` environment reads it every 2 s, not per
message), and a listing that fails counts as "no host". A listed host is judged as of the listing
(its `until` against the time it was read), not as of each dispatch: a host that heartbeats every
`h` seconds is listed with about `3h` to go, so with `3h` below the cache's age a live host would
otherwise look dead for the rest of every cache period (measured: 6 of 20 simultaneous turns went to
`chat_turn` at a 0.5 s heartbeat). A host that dies is seen as dead at most `cache_s` later. With no
live host the turn goes straight to the function, so scaling the host tier from zero never delays a
turn. A host that receives a request it cannot take (at capacity, CPU-bound, draining) hands it to
the function at once (turnhost/), so a stale listing costs a queue hop, never a wait. The container
tier (sandbox tools) is chosen by the turn itself, as before (escalation).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from agentvm.domain.models import LeaseHandoff
from agentvm.domain.turn_hosts import TurnHostRecord
from agentvm.ids import now_ms
from agentvm.ports import Dispatcher, TurnHostDirectory, TurnQueue

log = logging.getLogger(__name__)

DIRECTORY_CACHE_S = 2.0


class TieredDispatcher:
    """The Dispatcher port over the tiers: the turn-host queue when a host takes turns, else `fallback`."""

    def __init__(self, queue: TurnQueue, hosts: TurnHostDirectory, fallback: Dispatcher, *,
                 cache_s: float = DIRECTORY_CACHE_S, clock: Callable[[], float] = time.monotonic,
                 wall_ms: Callable[[], int] = now_ms) -> None:
        self.queue = queue
        self.hosts = hosts
        self.fallback = fallback
        self.cache_s = cache_s
        self._clock = clock
        self._wall_ms = wall_ms
        self._listed: list[TurnHostRecord] = []
        self._listed_at: float | None = None
        self._listed_wall_ms = 0
        self._lock = asyncio.Lock()
        #: where each dispatch went, for metrics and tests: "host" | "function"
        self.counts: dict[str, int] = {"host": 0, "function": 0}

    async def start_turns(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None:
        if await self.host_available():
            try:
                await self.queue.send(tenant_id, session_id, handoff=handoff)
            except Exception:
                log.exception("the turn queue refused a request: the turn runs on the function tier",
                              extra={"session_id": session_id})
            else:
                self.counts["host"] += 1
                return
        await self.fallback.start_turns(tenant_id, session_id, handoff=handoff)
        self.counts["function"] += 1

    async def host_available(self) -> bool:
        hosts = await self._directory()
        return any(h.takes_turns(self._listed_wall_ms) for h in hosts)

    async def _directory(self) -> list[TurnHostRecord]:
        async with self._lock:  # concurrent dispatches share one listing
            at = self._listed_at
            if at is None or self._clock() - at >= self.cache_s:
                try:
                    self._listed = await self.hosts.list_hosts()
                except Exception:
                    log.exception("the turn-host directory could not be read: turns run on the function tier")
                    self._listed = []
                self._listed_at, self._listed_wall_ms = self._clock(), self._wall_ms()
            return self._listed

    async def close(self) -> None:
        for part in (self.queue, self.fallback):
            close = getattr(part, "close", None)
            if callable(close):
                await close()
