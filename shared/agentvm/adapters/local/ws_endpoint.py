"""The local WebSocket endpoint: one task reads frames, one pumps the send queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from starlette.websockets import WebSocket, WebSocketDisconnect

from agentvm.adapters.local.ws_hub import OVERFLOW_REASON, Connection, LocalHub
from agentvm.api.ws_router import CommandRouter
from agentvm.domain.models import Principal
from agentvm.ids import connection_id

log = logging.getLogger(__name__)

POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013


class WebSocketEndpoint:
    def __init__(self, *, hub: LocalHub, router: CommandRouter, principal_for: Callable[[WebSocket], Principal],
                 max_queue: int, wrap: bool = True) -> None:
        self.hub = hub
        self.router = router
        self.principal_for = principal_for
        self.max_queue = max_queue
        self.wrap = wrap
        self._inflight: set[asyncio.Task[None]] = set()

    async def __call__(self, ws: WebSocket) -> None:
        principal = self.principal_for(ws)
        await ws.accept()
        conn = Connection(connection_id(), principal.tenant_id, max_queue=self.max_queue, wrap=self.wrap)
        self.hub.register(conn)
        pump = asyncio.get_running_loop().create_task(self._pump(ws, conn))
        log.debug("connection opened", extra={"connection_id": conn.id})
        try:
            while not conn.closed:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                data = msg.get("text")
                if data is None:
                    data = msg.get("bytes")
                if data is None:
                    continue
                # Requests run concurrently (spec §2.1); their tasks outlive a disconnect so that an
                # accepted message is always stored and its turn always runs.
                task = asyncio.get_running_loop().create_task(self.router.handle_frame(principal, conn.id, data))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
        except WebSocketDisconnect:
            pass
        finally:
            self.hub.unregister(conn)
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
            log.debug("connection closed", extra={"connection_id": conn.id})

    async def _pump(self, ws: WebSocket, conn: Connection) -> None:
        try:
            await conn.pump(ws.send_text)
        except Exception:
            conn.close("send failed")
            return
        if conn.close_reason == OVERFLOW_REASON:
            log.warning("closing slow connection", extra={"connection_id": conn.id})
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(code=TRY_AGAIN_LATER, reason=OVERFLOW_REASON), 5)

    async def drain(self, timeout: float = 10.0) -> None:
        """Wait for requests still being handled (graceful shutdown)."""
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=timeout)
