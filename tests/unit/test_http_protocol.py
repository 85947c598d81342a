"""`avm serve`'s HTTP protocol (local/avm/http_protocol.py): the writes of one event-loop turn leave as one,
at the turn's end; a close sends what is pending first; a real server answers JSON, streams and WebSockets."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest
import uvicorn
import websockets
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from avm.http_protocol import JoinedWritesProtocol, _JoinedWrites


class Recording:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


async def test_the_writes_of_one_turn_leave_as_one_at_its_end() -> None:
    raw = Recording()
    joined = _JoinedWrites(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    joined.write(b"HTTP/1.1 200 OK\r\n\r\n")
    joined.write(b"{}")
    assert raw.writes == []
    await asyncio.sleep(0)
    assert raw.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    joined.write(b"next")
    joined.close()  # pending data first, then the close
    assert (raw.writes[-1], raw.closed) == (b"next", True)
    await asyncio.sleep(0)
    assert len(raw.writes) == 2
    assert joined.get_extra_info("peername") == ("127.0.0.1", 1)  # everything else passes through


async def _json(request: Any) -> JSONResponse:
    return JSONResponse({"ok": True})


async def _stream(request: Any) -> StreamingResponse:
    async def parts() -> Any:
        for part in (b"one ", b"two ", b"three"):
            await asyncio.sleep(0.01)
            yield part
    return StreamingResponse(parts(), media_type="text/plain")


async def _echo(ws: WebSocket) -> None:
    await ws.accept()
    while True:
        await ws.send_text("echo " + await ws.receive_text())


@pytest.fixture
async def server() -> Any:
    app = Starlette(routes=[Route("/json", _json), Route("/stream", _stream), WebSocketRoute("/ws", _echo)])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="off",
                            http=JoinedWritesProtocol, ws="websockets-sansio")
    srv = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(srv.serve())
    for _ in range(500):
        if srv.started:
            break
        await asyncio.sleep(0.01)
    yield f"127.0.0.1:{port}"
    srv.should_exit = True
    await asyncio.wait_for(task, 10)


async def test_a_real_server_answers_json_streams_and_websockets(server: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://{server}", timeout=10) as client:
        for _ in range(3):  # the connection kept between answers
            assert (await client.get("/json")).json() == {"ok": True}
        async with client.stream("GET", "/stream") as streamed:
            parts = [part async for part in streamed.aiter_raw()]
        assert b"".join(parts) == b"one two three" and len(parts) == 3  # each part when it was written
    async with websockets.connect(f"ws://{server}/ws") as ws:
        await ws.send("hi")
        assert await asyncio.wait_for(ws.recv(), 10) == "echo hi"
