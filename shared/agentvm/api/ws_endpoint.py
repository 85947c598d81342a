"""The local WebSocket endpoint: one task reads frames, one pumps the send queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from agentvm.api.ws_auth import read_auth_frame, timeout_reason
from agentvm.api.ws_hub import OVERFLOW_REASON, Connection, LocalHub
from agentvm.api.ws_router import CommandRouter
from agentvm.auth.api_keys import MISSING_TOKEN
from agentvm.domain.models import Principal
from agentvm.errors import Unauthorized
from agentvm.ids import connection_id
from agentvm.protocol.frames import POLICY_VIOLATION, TRY_AGAIN_LATER, wants_batches

log = logging.getLogger(__name__)



def queue_close_frame(ws: WebSocket, code: int, reason: str) -> bool:
    """Queue a close frame behind what the transport already holds, when the client has stopped
    reading (the transport is paused). uvicorn's ASGI `websocket.close` first waits for the
    transport to be writable again, which never happens then: the socket would be closed without
    the close frame, and the client could not learn why. For uvicorn's websockets-sansio protocol
    (the one `avm serve` runs; Starlette wraps `send` but passes its `receive` through); False
    otherwise, or when the transport is writable and the ASGI close works."""
    proto: Any = getattr(getattr(ws, "_receive", None), "__self__", None)
    writable: Any = getattr(proto, "writable", None)
    wire: Any = getattr(proto, "conn", None)
    transport: Any = getattr(proto, "transport", None)
    if not isinstance(writable, asyncio.Event) or writable.is_set() or getattr(proto, "close_sent", True) \
            or not hasattr(wire, "send_close") or not hasattr(transport, "write") or transport.is_closing():
        return False
    try:
        wire.send_close(code, reason)
        transport.write(b"".join(wire.data_to_send()))
    except Exception:
        log.debug("could not queue the close frame", exc_info=True)
        return False
    # The protocol then closes the transport when the app returns: the buffer (bounded by its
    # high-water mark) and this close frame go out if the client reads again.
    proto.close_sent = True
    return True


async def refuse_upgrade(ws: WebSocket, reason: str) -> None:
    """Refuse a connection whose upgrade carries a bad key: accept it and close it at once with 1008
    and the reason. A browser's WebSocket API cannot read an HTTP refusal of the upgrade (neither
    its status nor its body), but it can read a close's code and reason. Nothing of the client's is
    read and nothing but the close is sent."""
    await ws.accept()
    with contextlib.suppress(Exception):
        await ws.close(code=POLICY_VIOLATION, reason=reason[:120])


class WebSocketEndpoint:
    def __init__(self, *, hub: LocalHub, router: CommandRouter,
                 principal_for: Callable[[WebSocket], Awaitable[Principal | None]], max_queue: int,
                 wrap: bool = True, auth_frame: Callable[[Mapping[str, str]], Awaitable[Principal]] | None = None,
                 auth_timeout_s: float = 5.0) -> None:
        """`principal_for`: the caller of an upgrade; None when it carries no credentials, and then
        (with `auth_frame`) the first frame must be `{"type": "auth", "headers": {...}}` within
        `auth_timeout_s` (browsers cannot set headers on an upgrade)."""
        self.hub = hub
        self.router = router
        self.principal_for = principal_for
        self.auth_frame = auth_frame
        self.auth_timeout_s = auth_timeout_s
        self.max_queue = max_queue
        self.wrap = wrap
        self._inflight: set[asyncio.Task[None]] = set()

    async def __call__(self, ws: WebSocket) -> None:
        try:
            principal = await self.principal_for(ws)
            if principal is None and self.auth_frame is None:
                raise Unauthorized(MISSING_TOKEN)
        except Unauthorized as exc:  # refused (1008 and the reason) before anything is read
            log.info("websocket refused", extra={"reason": exc.message})
            await refuse_upgrade(ws, exc.message)
            return
        await ws.accept()
        if principal is None:
            principal = await self._authenticate(ws)
            if principal is None:
                return
        conn = Connection(connection_id(), principal.tenant_id, max_queue=self.max_queue, wrap=self.wrap,
                          batch=wants_batches(ws.query_params))
        self.hub.register(conn)
        loop = asyncio.get_running_loop()
        pump = loop.create_task(self._pump(ws, conn))
        reader = loop.create_task(self._read(ws, conn, principal))
        # A client that stops reading blocks the pump on a full socket: closing the connection
        # (queue overflow) cancels the pump at once, and whichever task ends first ends both.
        conn.on_close = pump.cancel
        log.debug("connection opened", extra={"connection_id": conn.id})
        try:
            await asyncio.wait({pump, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.hub.unregister(conn)
            for task in (pump, reader):
                task.cancel()
            await asyncio.gather(pump, reader, return_exceptions=True)
            log.debug("connection closed", extra={"connection_id": conn.id, "reason": conn.close_reason})
        if conn.close_reason == OVERFLOW_REASON:
            log.warning("closed a connection that stopped reading", extra={"connection_id": conn.id})
            if not queue_close_frame(ws, TRY_AGAIN_LATER, OVERFLOW_REASON):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(ws.close(code=TRY_AGAIN_LATER, reason=OVERFLOW_REASON), 2)

    async def _authenticate(self, ws: WebSocket) -> Principal | None:
        """The principal of a first `auth` frame; None (the socket closed with a reason) otherwise.
        The frame is never echoed or logged: it holds the key."""
        assert self.auth_frame is not None
        try:
            msg = await asyncio.wait_for(ws.receive(), self.auth_timeout_s)
            if msg["type"] == "websocket.disconnect":
                return None
            frame = read_auth_frame(msg.get("text") or msg.get("bytes") or b"")
            if frame.headers is None:
                raise Unauthorized(frame.refusal)
            return await self.auth_frame(frame.headers)
        except TimeoutError:
            reason = timeout_reason(self.auth_timeout_s)
        except Unauthorized as exc:
            reason = exc.message
        log.info("websocket refused", extra={"reason": reason})
        with contextlib.suppress(Exception):
            await ws.close(code=POLICY_VIOLATION, reason=reason[:120])
        return None

    async def _read(self, ws: WebSocket, conn: Connection, principal: Principal) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    return
                data = msg.get("text")
                if data is None:
                    data = msg.get("bytes")
                if data is None or (isinstance(data, str) and data.startswith('{"__ack"')):
                    continue  # ACKs are transport-level and need no task (the stock client sends one per frame)
                # Requests run concurrently (spec §2.1); their tasks outlive a disconnect so that an
                # accepted message is always stored and its turn always runs.
                task = loop.create_task(self.router.handle_frame(principal, conn.id, data))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)

    @staticmethod
    async def _pump(ws: WebSocket, conn: Connection) -> None:
        try:
            await conn.pump(ws.send_text)
        except Exception:
            conn.close("send failed")

    async def drain(self, timeout: float = 10.0) -> None:
        """Wait for requests still being handled (graceful shutdown)."""
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=timeout)
