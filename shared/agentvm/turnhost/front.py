"""The turn host's own WebSocket front (AVM_TURN_HOST_WS_PORT, behind an Application Load Balancer:
template.yaml `WebSocketFront=LoadBalancer`): the stock AgentX client connects to it as it does to
API Gateway, and no frame is billed per message.

Each accepted upgrade is what `$connect` does, each inbound frame what `$default` does, a close what
`$disconnect` does: the same code (cloud/ws_routes.py), with connection ids `h-<host id>-<random>`
(domain/turn_hosts.py) so that every process can tell where a connection's socket is. What differs
from API Gateway is only what a socket allows:

* a bad key on the upgrade is accepted and closed at once with 1008 and the reason, as on
  `avm serve` (API Gateway can only answer 401, which a browser's WebSocket API cannot read);
  nothing of the client's is read and nothing but the close is sent;
* a connection accepted without credentials that sends no `auth` frame within AVM_AUTH_TIMEOUT_S is
  closed (1008, the reason), as on `avm serve`; a refused `auth` frame gets its `system_error`
  frame, then the close (1008);
* a handled frame that fails gets API Gateway's `{"message": "Internal server error", ...}`;
* the stock client's `{"__ack": …}` frames are dropped at once (they mean nothing in the cloud);
* at most MAX_INFLIGHT frames of a connection are handled at once: beyond that it is not read
  (API Gateway throttles instead; the ALB has no per-connection limit);
* a connection is closed after 2 h (1001, "Going away"), API Gateway's cap: the connection
  registry's records live just over that long.

Frames to the sockets (`HostSockets.post`) are queued per socket and written in order by one task;
a client that stops reading is closed (1013) once `max_queue` frames wait. `GET /health` answers 200
while the host is registered and not draining (the target group's health check), else 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from agentvm.api.ws_auth import read_auth_frame, timeout_reason
from agentvm.cloud import ws_routes
from agentvm.domain.turn_hosts import host_connection_id
from agentvm.ids import now_ms
from agentvm.protocol.frames import GOING_AWAY, INTERNAL_ERROR, POLICY_VIOLATION, TRY_AGAIN_LATER

if TYPE_CHECKING:
    from agentvm.cloud.runtime import CloudRuntime

log = logging.getLogger("agentvm.turnhost.front")

MAX_AGE_S = 2 * 3600
MAX_INFLIGHT = 32  # frames of one connection handled at once
OVERFLOW_REASON = "client too slow"


@dataclass(eq=False)
class _Socket:
    ws: WebSocket
    queue: asyncio.Queue[str | None]
    closing: tuple[int, str] | None = None
    pump: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


class HostSockets:
    """The open sockets of this host's front: what the gateway delivers this host's frames to."""

    def __init__(self, host_id: str, *, max_queue: int = 1000) -> None:
        self.host_id = host_id
        self.max_queue = max_queue
        self._sockets: dict[str, _Socket] = {}
        self.frames_out = 0  # written to sockets, and their bytes (the cost model's bytes out)
        self.bytes_out = 0

    def __len__(self) -> int:
        return len(self._sockets)

    def ids(self) -> list[str]:
        return list(self._sockets)

    async def post(self, connection_id: str, frame: str) -> bool:
        sock = self._sockets.get(connection_id)
        if sock is None or sock.closing is not None:
            return False
        try:
            sock.queue.put_nowait(frame)
        except asyncio.QueueFull:
            log.warning("closed a connection that stopped reading", extra={"connection_id": connection_id})
            self._close(sock, TRY_AGAIN_LATER, OVERFLOW_REASON)
            return False
        return True

    async def close(self, connection_id: str, code: int, reason: str) -> bool:
        """Close a socket after the frames queued before (False: it was not open)."""
        sock = self._sockets.get(connection_id)
        if sock is None or sock.closing is not None:
            return False
        self._close(sock, code, reason)
        return True

    def close_all(self, code: int, reason: str) -> None:
        for sock in list(self._sockets.values()):
            if sock.closing is None:
                self._close(sock, code, reason)

    def _close(self, sock: _Socket, code: int, reason: str) -> None:
        sock.closing = (code, reason)
        try:
            sock.queue.put_nowait(None)  # the pump closes after what was queued
        except asyncio.QueueFull:  # a client that stopped reading: drop its frames, close at once
            if sock.pump is not None:
                sock.pump.cancel()
            sock.pump = asyncio.get_running_loop().create_task(self._abort(sock))

    @staticmethod
    async def _abort(sock: _Socket) -> None:
        assert sock.closing is not None
        code, reason = sock.closing
        with contextlib.suppress(Exception):
            await asyncio.wait_for(sock.ws.close(code=code, reason=reason[:120]), 2)
        sock.done.set()

    def _open(self, connection_id: str, ws: WebSocket) -> _Socket:
        sock = _Socket(ws, asyncio.Queue(self.max_queue + 1))  # one place for the close marker
        sock.pump = asyncio.get_running_loop().create_task(self._pump(sock))
        self._sockets[connection_id] = sock
        return sock

    def _forget(self, connection_id: str) -> None:
        sock = self._sockets.pop(connection_id, None)
        if sock is not None and sock.pump is not None:
            sock.pump.cancel()

    async def _pump(self, sock: _Socket) -> None:
        try:
            while True:
                frame = await sock.queue.get()
                if frame is None:
                    break
                await sock.ws.send_text(frame)
                self.frames_out += 1
                self.bytes_out += len(frame.encode())
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass
        finally:
            if sock.closing is not None:
                code, reason = sock.closing
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(sock.ws.close(code=code, reason=reason[:120]), 2)
            sock.done.set()


class HostFront:
    """The ASGI app on AVM_TURN_HOST_WS_PORT: WebSockets on any path, GET /health."""

    def __init__(self, rt: CloudRuntime, sockets: HostSockets, *, healthy: Callable[[], bool],
                 max_age_s: float = MAX_AGE_S, metric: ws_routes.Metric = ws_routes.no_metric) -> None:
        """`metric`: the connection metrics the ws_* functions write (ConnectionsAccepted, …)."""
        self.rt = rt
        self.metric = metric
        self.sockets = sockets
        self.healthy = healthy
        self.max_age_s = max_age_s
        self._inflight: set[asyncio.Task[None]] = set()
        self._auth_timers: dict[str, asyncio.TimerHandle] = {}
        #: upgrades accepted and refused, frames handled (acks dropped apart)
        self.counts: dict[str, int] = {"accepted": 0, "refused": 0, "frames": 0, "acks": 0}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await self._socket(WebSocket(scope, receive, send))
        elif scope["type"] == "http":
            response = self._http(Request(scope, receive))
            await response(scope, receive, send)
        # lifespan: nothing to start or stop

    def _http(self, request: Request) -> Response:
        if request.method == "GET" and request.url.path == "/health":
            ok = self.healthy()
            return PlainTextResponse("ok" if ok else "draining", 200 if ok else 503)
        return PlainTextResponse("not found", 404)

    async def _socket(self, ws: WebSocket) -> None:
        cid = host_connection_id(self.sockets.host_id, secrets.token_hex(8))
        try:
            done = await ws_routes.connect(self.rt, cid, dict(ws.headers), dict(ws.query_params), self.metric)
        except Exception:
            log.exception("the upgrade could not be handled")
            await self._refuse(ws, INTERNAL_ERROR, "Internal server error")
            return
        if done.status != 200:
            self.counts["refused"] += 1
            await self._refuse(ws, POLICY_VIOLATION, done.reason or "unauthorized")
            return
        await ws.accept()
        self.counts["accepted"] += 1
        sock = self.sockets._open(cid, ws)
        loop = asyncio.get_running_loop()
        timers = [loop.call_later(self.max_age_s, self._expire, cid)]
        if not done.authenticated:
            timers.append(loop.call_later(self.rt.settings.auth_timeout_s, self._auth_deadline, cid))
            self._auth_timers[cid] = timers[-1]
        try:
            await self._read(ws, cid, sock)
        finally:
            for timer in timers:
                timer.cancel()
            self._auth_timers.pop(cid, None)
            if sock.closing is not None:  # let the pump write what was queued and the close frame
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sock.done.wait(), 2)
            self.sockets._forget(cid)
            try:
                await ws_routes.disconnect(self.rt, cid)
            except Exception:  # its record expires on its own (TTL)
                log.exception("a closed connection could not be forgotten", extra={"connection_id": cid})

    @staticmethod
    async def _refuse(ws: WebSocket, code: int, reason: str) -> None:
        """Accept and close at once: a browser reads a close's code and reason, not an HTTP refusal."""
        with contextlib.suppress(Exception):
            await ws.accept()
            await asyncio.wait_for(ws.close(code=code, reason=reason[:120]), 2)

    async def _read(self, ws: WebSocket, cid: str, sock: _Socket) -> None:
        loop = asyncio.get_running_loop()
        # API Gateway throttles a connection's frames; here a client that sends faster than its
        # frames are handled is simply not read (TCP backpressure) beyond MAX_INFLIGHT at once
        room = asyncio.Semaphore(MAX_INFLIGHT)
        while sock.closing is None:
            await room.acquire()
            read = loop.create_task(ws.receive())
            closed = loop.create_task(sock.done.wait())
            await asyncio.wait({read, closed}, return_when=asyncio.FIRST_COMPLETED)
            closed.cancel()
            if not read.done():
                read.cancel()
                return
            try:
                msg = read.result()
            except (WebSocketDisconnect, RuntimeError, OSError):
                return
            if msg["type"] == "websocket.disconnect":
                return
            body: str | bytes | None = msg.get("text")
            if body is None:
                body = msg.get("bytes")
            if body is None:
                room.release()
                continue
            if isinstance(body, str) and body.startswith('{"__ack"'):
                self.counts["acks"] += 1
                room.release()
                continue
            self.counts["frames"] += 1
            received_ms = now_ms()
            timer = self._auth_timers.get(cid)
            if timer is not None and read_auth_frame(body).is_auth:
                # the handshake answers an auth frame that came in time (accepted or refused), however
                # long its key check takes: the deadline no longer applies
                timer.cancel()
                del self._auth_timers[cid]
            # frames run concurrently, as API Gateway's $default invocations do; a frame accepted
            # before a disconnect is still handled (its message stored, its turn run)
            task = loop.create_task(self._frame(cid, body, received_ms))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            task.add_done_callback(lambda _: room.release())

    async def _frame(self, cid: str, body: str | bytes, received_ms: int) -> None:
        try:
            await ws_routes.frame(self.rt, cid, body, self.metric, role="turn_host_front", received_ms=received_ms)
        except Exception:
            log.exception("a frame could not be handled", extra={"connection_id": cid})
            await self.sockets.post(cid, json.dumps({"message": "Internal server error", "connectionId": cid,
                                                     "requestId": f"{int(time.time() * 1000)}"}))

    def _expire(self, cid: str) -> None:
        task = asyncio.ensure_future(self.sockets.close(cid, GOING_AWAY, "Going away"))
        self._inflight.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._inflight.discard)

    def _auth_deadline(self, cid: str) -> None:
        async def check() -> None:
            record = await self.rt.registry.get_connection(cid)
            if record is None or not record.authenticated:
                reason = timeout_reason(self.rt.settings.auth_timeout_s)
                log.info("websocket refused", extra={"reason": reason})
                await self.sockets.close(cid, POLICY_VIOLATION, reason)

        task = asyncio.ensure_future(check())
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for the frames being handled (the process stops next)."""
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=timeout_s)
