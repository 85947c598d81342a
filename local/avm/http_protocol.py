"""`avm serve`'s HTTP/1.1 protocol: uvicorn's httptools one, whose writes made in one turn of the event
loop leave in one `send` (docs/benchmarks.md, token API overhead).

uvicorn writes a response's status line and headers at once, then each body part: a JSON answer is two
writes, a stream's end two more (its last event, then the chunked terminator). Each write wakes the
client, and on a busy 2-core machine the woken client often takes the CPU from the server before its
next write: measured, ~0.3 ms of a token API call. Here the writes of one loop turn are joined and
sent at its end (`call_soon`): what was written together leaves together, and nothing waits longer
than the turn that wrote it. A WebSocket upgrade gets the plain transport (its frames are written as
before).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _JoinedWrites:
    """A transport whose writes of one loop turn go out as one; every other call passes through (a close
    sends what is pending first, as the transport itself would; an abort drops it, as the transport does)."""

    __slots__ = ("_loop", "_pending", "raw")

    def __init__(self, raw: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.raw = raw
        self._loop = loop
        self._pending: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        if self._pending is None:
            self._pending = [data]
            self._loop.call_soon(self.flush)
        else:
            self._pending.append(data)

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self.raw.is_closing():
            self.raw.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self.raw.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class JoinedWritesProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_JoinedWrites(transport, self.loop))  # type: ignore[arg-type]

    def handle_websocket_upgrade(self) -> None:
        if isinstance(self.transport, _JoinedWrites):
            self.transport.flush()
            self.transport = self.transport.raw
        super().handle_websocket_upgrade()
