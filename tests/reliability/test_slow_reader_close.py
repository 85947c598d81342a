"""A client that stopped reading long ago still gets the close frame and its reason (1013, send
queue overflow) once it reads again: by then the server's transport is paused on a full socket, and
uvicorn's ASGI `websocket.close` would wait for it to drain (found by the 1,000-client load of
`make bench`, tests/bench/many_clients.py, where the close frame never arrived)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agentvm.api.ws_hub import OVERFLOW_REASON
from tests.support.raw_ws import client_frame, open_raw, read_until_close
from tests.support.servers import in_process
from tests.support.stock_client import StockClient

WORD = "x" * 1000 + " "  # each echoed word is one text_delta frame of ~1 KB


async def test_the_close_frame_reaches_a_client_whose_socket_is_full(tmp_path: Path) -> None:
    # Each turn queues 900 frames of ~1 KB at once, below the queue's 1,000: the first turns fill
    # the kernel's buffers and pause the transport, a later one overflows the queue while it is paused.
    async with in_process(tmp_path / "d", send_queue_max=1000) as srv:
        async with StockClient(srv.url) as setup:
            image = await setup.new_image("c1")
        hub = srv.runtime.hub
        sock = await open_raw(srv.port, rcvbuf=4096)
        try:
            before = len(hub)
            loop = asyncio.get_running_loop()
            for i in range(12):  # queued, they run one after another
                request = {"type": "message_send_request",
                           "data": {"requestId": f"r{i}", "imageId": image["imageId"], "content": WORD * 900}}
                await loop.sock_sendall(sock, client_frame(json.dumps(request)))
            for _ in range(300):
                if len(hub) < before:
                    break
                await asyncio.sleep(0.05)
            assert len(hub) == before - 1, "the server did not drop the connection"
            await asyncio.sleep(2.5)  # longer than the endpoint waits for an ASGI close
            frames, code, reason = await read_until_close(sock, 20)
            assert (code, reason) == (1013, OVERFLOW_REASON), (frames, code, reason)
            assert frames > 1000  # what the socket and the transport held came first
        finally:
            sock.close()
