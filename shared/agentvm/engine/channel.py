"""A session's event channel: assigns the per-session `seq`, fans events out, keeps the unpersisted
tail for replay, and hands that tail to the next checkpoint.

Seqs are allocated from blocks reserved in the store (hi/lo), so a crash before a checkpoint never
makes a restarted server reuse a seq that a client already saw.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from agentvm.domain.models import LoggedEvent
from agentvm.ids import now_ms
from agentvm.ports import Fanout, Store
from agentvm.protocol.base import WireModel
from agentvm.protocol.envelope import encode, event

log = logging.getLogger(__name__)

SEQ_BLOCK = 10_000


class SessionChannel:
    def __init__(self, *, store: Store, fanout: Fanout, tenant_id: str, session_id: str,
                 context: dict[str, str], first_seq: int, reserved_until: int, block: int = SEQ_BLOCK) -> None:
        self.store = store
        self.fanout = fanout
        self.tenant_id = tenant_id
        self.session_id = session_id
        self.context = context
        self._next_seq = first_seq
        self._reserved_until = reserved_until
        self._block = block
        self._reserving: asyncio.Task[None] | None = None
        self._pending: list[LoggedEvent] = []

    @classmethod
    async def open(cls, *, store: Store, fanout: Fanout, tenant_id: str, session_id: str,
                   context: dict[str, str]) -> SessionChannel:
        first, until = await store.reserve_seqs(tenant_id, session_id, SEQ_BLOCK)
        return cls(store=store, fanout=fanout, tenant_id=tenant_id, session_id=session_id, context=context,
                   first_seq=first, reserved_until=until)

    @property
    def next_seq(self) -> int:
        """The seq the next event gets."""
        return self._next_seq

    def publish(self, type_: str, data: dict[str, Any] | WireModel, *, exclude: str | None = None,
                timestamp: int | None = None) -> LoggedEvent:
        """Allocate a seq, send to subscribers now, and keep the event for the next checkpoint."""
        seq = self._next_seq
        self._next_seq += 1
        if self._reserved_until - seq < self._block // 2 and self._reserving is None:
            self._reserving = asyncio.get_running_loop().create_task(self._reserve_more())
        ts = now_ms()
        payload = encode(event(type_, data, self.context, timestamp=ts if timestamp is None else timestamp,
                               seq=seq))
        logged = LoggedEvent(seq, type_, payload, ts)
        self._pending.append(logged)
        self.fanout.to_session(self.session_id, seq, payload, exclude=exclude)
        return logged

    def take_pending(self) -> list[LoggedEvent]:
        out, self._pending = self._pending, []
        return out

    def restore_pending(self, events: list[LoggedEvent]) -> None:
        """Put back events whose checkpoint failed, ahead of newer ones."""
        self._pending = events + self._pending

    def unpersisted_after(self, after_seq: int) -> list[LoggedEvent]:
        return [e for e in self._pending if e.seq > after_seq]

    async def _reserve_more(self) -> None:
        try:
            _first, until = await self.store.reserve_seqs(self.tenant_id, self.session_id, self._block)
            self._reserved_until = max(self._reserved_until, until)
            # Blocks are reserved from the stored ceiling, so allocation continues without a gap.
        except Exception:
            log.exception("seq reservation failed", extra={"session_id": self.session_id})
        finally:
            self._reserving = None
