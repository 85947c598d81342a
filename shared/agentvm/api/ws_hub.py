"""The in-process fan-out for `avm serve`: connections, their bounded send queues, subscriptions,
and `afterSeq` replay that delivers each session event exactly once per connection, in order.
A connection that asked for batched frames sends what its queue holds when the pump runs as one
JSON array (agentvm.protocol.frames)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from agentvm.ports import EventSource
from agentvm.protocol.envelope import wrap
from agentvm.protocol.frames import FrameBatch

log = logging.getLogger(__name__)

_K = TypeVar("_K")

OVERFLOW_REASON = "send queue overflow: the client is not reading"


class Connection:
    __slots__ = ("_counter", "_replaying", "_wake", "batch", "close_reason", "closed", "containers", "id",
                 "max_queue", "on_close", "queue", "seen", "tenant_id", "wrap")

    def __init__(self, connection_id: str, tenant_id: str, *, max_queue: int, wrap: bool = True,
                 batch: bool = False) -> None:
        self.id = connection_id
        self.batch = batch
        self.tenant_id = tenant_id
        self.max_queue = max_queue
        self.wrap = wrap
        self.queue: deque[str] = deque()
        self.closed = False
        self.close_reason: str | None = None
        # session_id → highest seq delivered (or deliberately skipped) on this connection
        self.seen: dict[str, int] = {}
        self.containers: set[str] = set()
        self._replaying: dict[str, list[tuple[int, str]]] = {}
        self._counter = 0
        self._wake = asyncio.Event()
        # Called once when the connection closes (the transport stops a pump blocked on a full socket).
        self.on_close: Callable[[], object] | None = None

    def push(self, payload: str) -> None:
        if self.closed:
            return
        if len(self.queue) >= self.max_queue:
            self.close(OVERFLOW_REASON)
            return
        if self.wrap:
            self._counter += 1
            payload = wrap(f"{self.id}_{self._counter}", payload)
        self.queue.append(payload)
        self._wake.set()

    def close(self, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self.close_reason = reason
            self.queue.clear()
            self._wake.set()
            if self.on_close is not None:
                self.on_close()

    async def receive(self, timeout: float) -> str | None:
        """The next queued frame, waiting up to `timeout` s; None on timeout or once closed (a
        listener that reads in-process instead of pumping to a socket: the SSE chat API)."""
        if not self.queue and not self.closed:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                return None
        return self.queue.popleft() if self.queue else None

    async def pump(self, send: Callable[[str], Awaitable[None]]) -> None:
        """Write queued frames in order until the connection closes."""
        queue = self.queue
        while not self.closed:
            while queue:
                if not self.batch:
                    await send(queue.popleft())
                    continue
                batch = FrameBatch(queue.popleft())
                while queue and batch.add(queue[0]):
                    queue.popleft()
                await send(batch.frame())
            if self.closed:
                break
            self._wake.clear()
            await self._wake.wait()


class LocalHub:
    """Implements the Fanout port for connections held by this process."""

    def __init__(self) -> None:
        self._conns: dict[str, Connection] = {}
        self._by_session: dict[str, dict[str, Connection]] = {}
        # (tenant, container) → connections watching that container
        self._by_container: dict[tuple[str, str], dict[str, Connection]] = {}

    def __len__(self) -> int:
        return len(self._conns)

    def per_tenant(self) -> dict[str, int]:
        """Open connections (WebSockets and SSE feeds) per tenant: the metrics' gauge."""
        out: dict[str, int] = {}
        for conn in self._conns.values():
            out[conn.tenant_id] = out.get(conn.tenant_id, 0) + 1
        return out

    def register(self, conn: Connection) -> None:
        self._conns[conn.id] = conn

    def unregister(self, conn: Connection) -> None:
        self._conns.pop(conn.id, None)
        for cid in conn.containers:
            _discard(self._by_container, (conn.tenant_id, cid), conn.id)
        for sid in conn.seen:
            _discard(self._by_session, sid, conn.id)
        conn.close("closed")

    # ---- Fanout --------------------------------------------------------------------------------

    def to_connection(self, connection_id: str, payload: str) -> None:
        conn = self._conns.get(connection_id)
        if conn is not None:
            conn.push(payload)

    def to_container(self, tenant_id: str, container_id: str, payload: str) -> None:
        for conn in tuple(self._by_container.get((tenant_id, container_id), {}).values()):
            conn.push(payload)

    def watch(self, connection_id: str, container_id: str) -> None:
        conn = self._conns.get(connection_id)
        if conn is not None and container_id not in conn.containers:
            conn.containers.add(container_id)
            self._by_container.setdefault((conn.tenant_id, container_id), {})[conn.id] = conn

    def to_session(self, session_id: str, seq: int, payload: str, *, exclude: str | None = None) -> None:
        subs = self._by_session.get(session_id)
        if not subs:
            return
        for conn in tuple(subs.values()):
            pending = conn._replaying.get(session_id)
            if pending is not None:
                pending.append((seq, payload))
                continue
            if seq <= conn.seen.get(session_id, 0):
                continue
            conn.seen[session_id] = seq
            if conn.id != exclude:
                conn.push(payload)

    def attach(self, connection_id: str, session_id: str, container_id: str) -> None:
        self.watch(connection_id, container_id)
        conn = self._conns.get(connection_id)
        if conn is None or session_id in conn.seen:
            return
        conn.seen[session_id] = 0
        self._by_session.setdefault(session_id, {})[conn.id] = conn

    async def subscribe(self, connection_id: str, session_id: str, container_id: str, after_seq: int | None,
                        source: EventSource) -> None:
        conn = self._conns.get(connection_id)
        if conn is None:
            return
        if after_seq is None:
            self.attach(connection_id, session_id, container_id)
            return
        self.watch(connection_id, container_id)
        if session_id in conn._replaying:
            return  # a replay is already running for this session on this connection
        # Never send again what this connection has already received.
        floor = max(after_seq, conn.seen.get(session_id, 0))
        conn.seen[session_id] = floor
        self._by_session.setdefault(session_id, {})[conn.id] = conn
        conn._replaying[session_id] = []
        try:
            missed = await source(floor)
        except Exception:
            log.exception("replay failed", extra={"session_id": session_id, "connection_id": conn.id})
            missed = []
        live = conn._replaying.pop(session_id, [])
        merged: dict[int, str] = {e.seq: e.payload for e in missed}
        for seq, payload in live:
            merged.setdefault(seq, payload)
        last = conn.seen.get(session_id, floor)
        for seq in sorted(merged):
            if seq > last:
                conn.push(merged[seq])
                last = seq
        conn.seen[session_id] = last


def _discard(index: dict[_K, dict[str, Connection]], key: _K, connection_id: str) -> None:
    members = index.get(key)
    if members is not None:
        members.pop(connection_id, None)
        if not members:
            del index[key]
