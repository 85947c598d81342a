"""The raw load client of `make bench`: thin, allocation-light, and identical against both servers.

It behaves like the stock AgentX client on the wire: it unwraps every `{__msgId, __payload}` frame,
ACKs it before processing, and correlates responses by `data.requestId`. Every loop is bounded by a
frame count; callers bound time with `asyncio.timeout`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

# Request ids are fixed-width so that the baseline server can splice them into pre-encoded
# responses without changing their size. The capture uses CAPTURE_RID.
CAPTURE_RID = "R99999999"
MAX_FRAMES_PER_REPLY = 50_000  # bound on frames read while waiting for one response or one turn

Event = dict[str, Any]


def rid(n: int) -> str:
    return f"R{n:08d}"


def request_frame(type_: str, data: Event, request_id: str) -> str:
    return orjson.dumps({"type": type_, "timestamp": 0, "data": {**data, "requestId": request_id},
                         "source": "command", "category": "request", "intent": "request"}).decode()


@dataclass
class TurnResult:
    first_delta_s: float  # send → first text_delta
    total_s: float  # send → turn_response
    deltas: int
    first_delta_at: float  # perf_counter timestamps
    end_at: float
    frames: list[str] = field(default_factory=list)  # raw frames, when recorded


class RawConn:
    """One WebSocket connection driven by a single coroutine at a time."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self._n = 0

    @classmethod
    async def open(cls, url: str) -> RawConn:
        ws = await connect(url, max_size=None, compression=None, ping_interval=None, open_timeout=10,
                           close_timeout=2)
        return cls(ws)

    async def close(self) -> None:
        await self.ws.close()

    def next_rid(self) -> str:
        self._n += 1
        return rid(self._n)

    async def recv(self) -> tuple[bytes, Event]:
        """The next frame (raw) and its event, ACKing a wrapper first."""
        raw = await self.ws.recv(decode=False)
        return raw, await self.ack(raw)

    async def ack(self, raw: str | bytes) -> Event:
        """The event of a received frame, ACKing a wrapper first."""
        assert isinstance(raw, bytes)
        body = orjson.loads(raw)
        mid = body.get("__msgId")
        if mid is None:
            return body
        await self.ws.send('{"__ack":' + orjson.dumps(mid).decode() + "}")
        return orjson.loads(body["__payload"])

    async def request(self, type_: str, data: Event, request_id: str | None = None,
                      record: list[str] | None = None) -> Event:
        """Send one request and read frames until its response."""
        request_id = request_id or self.next_rid()
        await self.ws.send(request_frame(type_, data, request_id))
        for _ in range(MAX_FRAMES_PER_REPLY):
            raw, ev = await self.recv()
            if ev.get("category") == "response" and ev["data"].get("requestId") == request_id:
                if record is not None:
                    record.append(raw.decode())
                return ev
        raise RuntimeError(f"no response to {type_} within {MAX_FRAMES_PER_REPLY} frames")

    async def setup_image(self, container_id: str) -> str:
        """Create a container and an image in it; return the imageId."""
        res = await self.request("container_create_request", {"containerId": container_id})
        if res["data"].get("error"):
            raise RuntimeError(f"container_create failed: {res['data']}")
        res = await self.request("image_create_request", {"containerId": container_id, "config": {}})
        record = res["data"].get("record")
        if not record:
            raise RuntimeError(f"image_create failed: {res['data']}")
        return str(record["imageId"])

    async def turn(self, image_id: str, content: str, *, request_id: str | None = None,
                   record: bool = False) -> TurnResult:
        """Send one message and read until `turn_response` (the last event of a turn)."""
        frames: list[str] = []
        frame = request_frame("message_send_request", {"imageId": image_id, "content": content},
                              request_id or self.next_rid())
        t0 = time.perf_counter()
        await self.ws.send(frame)
        first = 0.0
        deltas = 0
        for _ in range(MAX_FRAMES_PER_REPLY):
            raw, ev = await self.recv()
            if record:
                frames.append(raw.decode())
            t = ev.get("type")
            if t == "text_delta":
                if not deltas:
                    first = time.perf_counter()
                deltas += 1
            elif t == "turn_response":
                end = time.perf_counter()
                if not deltas:
                    raise RuntimeError("turn ended without a text_delta")
                return TurnResult(first - t0, end - t0, deltas, first, end, frames)
            elif t == "system_error":
                raise RuntimeError(f"turn failed: {ev['data']}")
        raise RuntimeError(f"turn did not end within {MAX_FRAMES_PER_REPLY} frames")


async def open_many(url: str, n: int, *, batch: int = 25) -> list[RawConn]:
    """Open n connections, a batch at a time (the listen backlog is finite)."""
    conns: list[RawConn] = []
    for start in range(0, n, batch):
        conns += await asyncio.gather(*(RawConn.open(url) for _ in range(start, min(n, start + batch))))
    return conns


async def close_all(conns: list[RawConn]) -> None:
    await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


async def create_pairs(conn: RawConn, n: int, *, inflight: int, prefix: str,
                       on_pair: Callable[[], None] | None = None) -> float:
    """Create n (container, image) pairs over one connection with `inflight` requests outstanding:
    each container response triggers its image request, and each image response starts the next
    pair. Returns the wall time in seconds."""
    ws = conn.ws
    sent = 0  # pairs started
    done = 0
    pending: dict[str, tuple[bool, str]] = {}  # requestId → (is_image, containerId)

    async def start_pair() -> None:
        nonlocal sent
        cid = f"{prefix}-{sent:07d}"
        r = conn.next_rid()
        pending[r] = (False, cid)
        sent += 1
        await ws.send(request_frame("container_create_request", {"containerId": cid}, r))

    t0 = time.perf_counter()
    for _ in range(min(inflight, n)):
        await start_pair()
    for _ in range(n * 2 * MAX_FRAMES_PER_REPLY):
        if done >= n:
            break
        _raw, ev = await conn.recv()
        if ev.get("category") != "response":
            continue
        data = ev["data"]
        entry = pending.pop(data.get("requestId"), None)
        if entry is None:
            continue
        if data.get("error"):
            raise RuntimeError(f"create failed: {data}")
        is_image, cid = entry
        if not is_image:
            r = conn.next_rid()
            pending[r] = (True, cid)
            await ws.send(request_frame("image_create_request", {"containerId": cid, "config": {}}, r))
            continue
        done += 1
        if on_pair is not None:
            on_pair()
        if sent < n:
            await start_pair()
    if done < n:
        raise RuntimeError(f"only {done} of {n} pairs were created")
    return time.perf_counter() - t0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, -(-len(ordered) * q // 100) - 1))
    return ordered[int(k)]
