"""The Fanout port for one Lambda invocation: API Gateway connections, subscriptions in DynamoDB.

Publishing stays synchronous for the engine: every event goes into one ordered pipeline, resolved
to connections (a session's subscribers are read from the registry and cached for `refresh_s`, the
interval doubling up to `max_refresh_s`),
and posted through the Gateway by one sender per connection, so each connection receives events in
publish order. `drain()` waits until everything is posted; a handler calls it before returning.

A subscriber that appears while this invocation publishes (found at a refresh) first gets, from
this invocation's own log, the events above both its `afterSeq` and what was already replayed to it;
one still owed a replay from the stored log (`pending`) gets that first through `replay_source`.
A connection that API Gateway reports gone is dropped with all its records.

A connection that asked for batched frames (its record's or its subscription's `batch`) gets what
its sender finds queued in one post: the events published in the same tick, and those published
while its previous post was in flight, as one JSON array of at most 32 KB (agentvm.protocol.frames).
The order, and what each connection receives, are the same as one event per post.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from agentvm.domain.models import ConnectionRecord, LoggedEvent, Subscription
from agentvm.ports import ConnectionRegistry, EventSource, Gateway
from agentvm.protocol.frames import FrameBatch

log = logging.getLogger(__name__)

ReplaySource = Callable[[str, int], Awaitable[list[LoggedEvent]]]
HeadSource = Callable[[str], Awaitable[int]]  # a session's newest logged seq


@dataclass(slots=True)
class _Peer:
    connection_id: str
    queue: asyncio.Queue[str | asyncio.Future[None]] = field(default_factory=asyncio.Queue)
    sender: asyncio.Task[None] | None = None
    gone: bool = False
    batch: bool = False  # it takes batched frames
    # session_id → highest seq sent to this connection in this invocation
    sent: dict[str, int] = field(default_factory=dict)


class CloudFanout:
    def __init__(self, *, gateway: Gateway, registry: ConnectionRegistry, tenant_id: str,
                 refresh_s: float = 1.0, max_refresh_s: float = 4.0, replay_source: ReplaySource | None = None,
                 head_source: HeadSource | None = None) -> None:
        self.gateway = gateway
        self.registry = registry
        self.tenant_id = tenant_id
        self.refresh_s = refresh_s
        self.max_refresh_s = max(refresh_s, max_refresh_s)
        self._refresh_every: dict[str, float] = {}
        self.replay_source = replay_source
        self.head_source = head_source
        self._ops: asyncio.Queue[tuple[str, tuple[object, ...]]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._peers: dict[str, _Peer] = {}
        self._subs: dict[str, tuple[float, dict[str, Subscription]]] = {}
        # subscriptions made by this invocation: effective at once, whatever the registry returns yet
        self._local: dict[str, dict[str, Subscription]] = {}
        self._log: dict[str, list[tuple[int, str]]] = {}  # what this invocation published per session
        self._writes: set[asyncio.Task[None]] = set()
        # what the registry already records per connection (read with the connection record)
        self._known_sessions: dict[str, frozenset[str]] = {}
        self._known_containers: dict[str, set[str]] = {}
        self.served: dict[str, set[str]] = {}  # session_id → connections whose owed replay was served

    def known(self, record: ConnectionRecord) -> None:
        """What `record`'s connection already subscribes to and watches: naming them again writes nothing."""
        self._known_sessions[record.connection_id] = record.sessions
        self._known_containers[record.connection_id] = set(record.containers)
        if record.batch:
            self._peer(record.connection_id).batch = True

    # ---- Fanout port ---------------------------------------------------------------------------

    def to_connection(self, connection_id: str, payload: str) -> None:
        self._op("conn", connection_id, payload)

    def to_session(self, session_id: str, seq: int, payload: str, *, exclude: str | None = None) -> None:
        self._log.setdefault(session_id, []).append((seq, payload))
        self._op("session", session_id, seq, payload, exclude)

    def to_container(self, tenant_id: str, container_id: str, payload: str) -> None:
        self._op("container", tenant_id, container_id, payload)

    def watch(self, connection_id: str, container_id: str) -> None:
        known = self._known_containers.setdefault(connection_id, set())
        if container_id not in known:
            known.add(container_id)
            # in the op queue like a live subscription: a container event queued after this finds it
            self._op("watch", container_id, connection_id)

    def attach(self, connection_id: str, session_id: str, container_id: str) -> None:
        """Live events only: recorded for later invocations and effective at once for this one."""
        self.watch(connection_id, container_id)
        cached = self._subs.get(session_id)
        if connection_id in self._local.get(session_id, {}) or (cached is not None and connection_id in cached[1]):
            return
        sub = Subscription(connection_id, batch=self._batch(connection_id))
        self._remember(session_id, sub)
        self._op("mark", connection_id, session_id)
        if session_id not in self._known_sessions.get(connection_id, frozenset()):
            # in the op queue, not beside it: the answer posted after this (image_get_response) leaves
            # only once the subscription is stored, so an event another runner publishes after the
            # client has its answer finds the subscription
            self._op("live", session_id, connection_id)

    async def _record_live(self, session_id: str, connection_id: str) -> None:
        since = await self.head_source(session_id) if self.head_source is not None else 0
        await self.registry.put_subscription(self.tenant_id, session_id, Subscription(
            connection_id, since_seq=since, batch=self._batch(connection_id)))

    async def subscribe(self, connection_id: str, session_id: str, container_id: str, after_seq: int | None,
                        source: EventSource) -> None:
        """Replay the stored log above `after_seq` (the caller holds the session lease, so the log is
        complete), then record how far the replay went.

        A connection that is already subscribed is a cursor, as from `avm serve`: what it has
        received (replayed, or delivered live since its subscription began) is not sent again."""
        self.watch(connection_id, container_id)
        if after_seq is None:
            self.attach(connection_id, session_id, container_id)
            return
        head = await self.head_source(session_id) if self.head_source is not None else 0
        floor = max(after_seq, await self._received(session_id, connection_id, head))
        events = await source(floor)
        last = floor
        for e in events:
            if e.seq > last:
                self.to_connection(connection_id, e.payload)
                last = e.seq
        sub = Subscription(connection_id, after_seq=after_seq, replayed_seq=last, since_seq=max(head, last),
                           batch=self._batch(connection_id))
        self._remember(session_id, sub)
        self._op("mark", connection_id, session_id, last)
        self._op("subscription", session_id, sub)

    async def _received(self, session_id: str, connection_id: str, head: int) -> int:
        """The highest seq this connection has already been sent on the session (0: none)."""
        known = self._local.get(session_id, {}).get(connection_id)
        if known is None:
            found = [s for s in await self.registry.subscribers(self.tenant_id, session_id)
                     if s.connection_id == connection_id]
            known = found[0] if found else None
        if known is None:
            return 0
        live = head if head > known.since_seq else 0
        return max(known.replayed_seq, live, self._peer(connection_id).sent.get(session_id, 0))

    def owe_replay(self, connection_id: str, session_id: str, container_id: str, after_seq: int) -> None:
        """The session's lease is taken: the holder will replay above `after_seq` (see `serve_pending`)."""
        self.watch(connection_id, container_id)
        sub = Subscription(connection_id, after_seq=after_seq, replayed_seq=after_seq, pending=True,
                           batch=self._batch(connection_id))
        self._op("subscription", session_id, sub)

    # ---- invocation lifecycle --------------------------------------------------------------------

    async def drain(self) -> None:
        """Wait until every event published so far is posted and every registry write is done
        (usable mid-invocation: publishing may go on meanwhile and is waited for too)."""
        while True:
            await self._ops.join()
            for peer in list(self._peers.values()):
                await peer.queue.join()
            if self._writes:
                await asyncio.gather(*list(self._writes), return_exceptions=True)
            idle = all(t.done() for t in self._writes)
            if idle and self._ops.empty() and all(p.queue.empty() for p in self._peers.values()):
                return

    async def flushed(self) -> None:
        """Wait until everything published before this call is posted; later events may still be
        in flight (unlike `drain`, this returns while a turn goes on streaming)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._op("barrier", done)
        await done

    async def close(self) -> None:
        """Drain, then stop this invocation's tasks (the event loop outlives the invocation)."""
        await self.drain()
        tasks = [t for t in (self._worker, *(p.sender for p in self._peers.values())) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._worker = None
        for peer in self._peers.values():
            peer.sender = None

    def serve_pending(self, session_id: str, *, consistent: bool = True) -> None:
        """Re-read the session's subscribers now and serve the replays they are owed (the lease
        holder does this before releasing the lease)."""
        self._op("refresh", session_id, consistent)

    def listeners(self, session_id: str) -> int:
        """Subscribers of the session still reachable: 0 when every one has gone, -1 while they are
        not known yet or there never was one (a turn nobody watches live is not stopped)."""
        cached = self._subs.get(session_id)
        if cached is None or not cached[1]:
            return -1
        return sum(1 for c in cached[1] if not self._peer(c).gone)

    # ---- internals -------------------------------------------------------------------------------

    def _remember(self, session_id: str, sub: Subscription) -> None:
        self._local.setdefault(session_id, {})[sub.connection_id] = sub
        cached = self._subs.get(session_id)
        if cached is not None:
            cached[1][sub.connection_id] = sub

    def _op(self, kind: str, *args: object) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run())
        self._ops.put_nowait((kind, args))

    def _write(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    def _batch(self, connection_id: str) -> bool:
        peer = self._peers.get(connection_id)
        return peer is not None and peer.batch

    def _peer(self, connection_id: str) -> _Peer:
        peer = self._peers.get(connection_id)
        if peer is None:
            peer = self._peers[connection_id] = _Peer(connection_id)
        return peer

    def _send(self, connection_id: str, payload: str) -> None:
        peer = self._peer(connection_id)
        if peer.gone:
            return
        if peer.sender is None:
            peer.sender = asyncio.get_running_loop().create_task(self._post_loop(peer))
        peer.queue.put_nowait(payload)

    async def _run(self) -> None:
        while True:
            kind, args = await self._ops.get()
            try:
                if kind == "conn":
                    self._send(str(args[0]), str(args[1]))
                elif kind == "session":
                    await self._deliver(str(args[0]), int(str(args[1])), str(args[2]),
                                        None if args[3] is None else str(args[3]))
                elif kind == "container":
                    for cid in await self.registry.watchers(str(args[0]), str(args[1])):
                        self._send(cid, str(args[2]))
                elif kind == "barrier":
                    self._barrier(cast("asyncio.Future[None]", args[0]))
                elif kind == "refresh":
                    cached = self._subs.get(str(args[0]))
                    if cached is not None:
                        self._subs[str(args[0])] = (float("-inf"), cached[1])
                    await self._subscribers(str(args[0]), 1 << 62, forced=bool(args[1]))
                elif kind == "subscription":  # stored before anything queued after it is posted
                    await self.registry.put_subscription(self.tenant_id, str(args[0]), cast("Subscription", args[1]))
                elif kind == "watch":
                    await self.registry.watch(self.tenant_id, str(args[0]), str(args[1]))
                elif kind == "live":
                    await self._record_live(str(args[0]), str(args[1]))
                elif kind == "mark":
                    peer = self._peer(str(args[0]))
                    if len(args) > 2:
                        peer.sent[str(args[1])] = max(peer.sent.get(str(args[1]), 0), int(str(args[2])))
                    else:
                        peer.sent.setdefault(str(args[1]), 0)
            except Exception:
                log.exception("fan-out failed", extra={"op": kind})
            finally:
                self._ops.task_done()

    async def _deliver(self, session_id: str, seq: int, payload: str, exclude: str | None) -> None:
        subs = await self._subscribers(session_id, seq)
        for cid, sub in subs.items():
            peer = self._peer(cid)
            if seq <= peer.sent.get(session_id, sub.replayed_seq):
                continue
            peer.sent[session_id] = seq
            if cid != exclude:
                self._send(cid, payload)

    async def _subscribers(self, session_id: str, current_seq: int, *, forced: bool = False
                           ) -> dict[str, Subscription]:
        now = time.monotonic()
        cached = self._subs.get(session_id)
        every = self._refresh_every.get(session_id, self.refresh_s)
        if cached is not None and now - cached[0] < every:
            return cached[1]
        # the interval doubles (1, 2, 4 s): a 10 s turn reads its subscribers 4 times, not 10; a
        # subscriber that arrives meanwhile gets what it missed from this invocation's log when found
        self._refresh_every[session_id] = min(every * 2, self.max_refresh_s) if cached is not None else every
        # the first read and a forced one (an owed replay) are consistent; a periodic refresh need not be:
        # a subscriber it finds late is caught up from this invocation's log below
        consistent = cached is None or forced
        fresh = {s.connection_id: s for s in await self.registry.subscribers(self.tenant_id, session_id,
                                                                              consistent=consistent)}
        for cid, sub in fresh.items():
            if sub.batch:
                self._peer(cid).batch = True
        known = cached[1] if cached is not None else {}
        for cid, sub in fresh.items():
            owed = sub.pending and cid not in self.served.get(session_id, ())
            if (cid not in known and cached is not None) or owed:
                await self._catch_up(session_id, sub, current_seq)
        local = self._local.get(session_id, {})
        merged = {**fresh, **{c: s for c, s in {**known, **local}.items() if c not in fresh}}
        self._subs[session_id] = (now, merged)
        return merged

    async def _catch_up(self, session_id: str, sub: Subscription, current_seq: int) -> None:
        """A subscriber that arrived while this invocation was publishing: send it what it missed
        below the event being delivered now (that one, and later ones, follow in order)."""
        peer = self._peer(sub.connection_id)
        floor = max(sub.after_seq, sub.replayed_seq, peer.sent.get(session_id, 0))
        mine = self._log.get(session_id, [])
        if sub.pending and self.replay_source is not None:
            first_mine = mine[0][0] if mine else None
            for e in await self.replay_source(session_id, floor):
                if e.seq > floor and (first_mine is None or e.seq < first_mine):
                    self._send(sub.connection_id, e.payload)
                    floor = e.seq
            self._write(self.registry.put_subscription(
                self.tenant_id, session_id, Subscription(sub.connection_id, sub.after_seq, floor, False, floor,
                                                         sub.batch)))
            self.served.setdefault(session_id, set()).add(sub.connection_id)
        for seq, payload in mine:
            if floor < seq < current_seq:
                self._send(sub.connection_id, payload)
                floor = seq
        peer.sent[session_id] = floor

    def _barrier(self, done: asyncio.Future[None]) -> None:
        """Resolve `done` once every sender has posted what it holds now."""
        loop = asyncio.get_running_loop()
        markers: list[asyncio.Future[None]] = []
        for peer in self._peers.values():
            if peer.sender is not None and not peer.gone:
                marker: asyncio.Future[None] = loop.create_future()
                peer.queue.put_nowait(marker)
                markers.append(marker)

        def resolve(_: object) -> None:
            if not done.done():
                done.set_result(None)

        asyncio.gather(*markers).add_done_callback(resolve)

    async def _post_loop(self, peer: _Peer) -> None:
        carried: str | asyncio.Future[None] | None = None  # taken from the queue, not yet handled
        while True:
            item = carried if carried is not None else await peer.queue.get()
            carried, taken = None, 1
            try:
                if isinstance(item, asyncio.Future):
                    if not item.done():
                        item.set_result(None)
                elif peer.gone:
                    pass
                elif not peer.batch:
                    await self._post(peer, item)
                else:
                    batch = FrameBatch(item)
                    while not peer.queue.empty():
                        more = peer.queue.get_nowait()
                        if isinstance(more, asyncio.Future) or not batch.add(more):
                            carried = more  # a barrier resolves after this post; a big event goes next
                            break
                        taken += 1
                    await self._post(peer, batch.frame())
            finally:
                for _ in range(taken):
                    peer.queue.task_done()

    async def _post(self, peer: _Peer, payload: str) -> None:
        try:
            ok = await self.gateway.post(peer.connection_id, payload)
        except Exception:
            log.exception("post failed", extra={"connection_id": peer.connection_id})
            ok = True  # not known to be gone; the frame is lost, the connection kept
        if not ok:
            peer.gone = True
            self._write(self.registry.delete_connection(peer.connection_id))


if TYPE_CHECKING:
    from agentvm.ports import LeasedFanout

    def _implements_fanout(fanout: CloudFanout) -> LeasedFanout:  # mypy checks the port's signatures
        return fanout
