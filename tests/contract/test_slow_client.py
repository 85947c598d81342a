"""A client that stops reading is closed once its bounded send queue overflows; memory stays bounded
and other connections are not slowed."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
from pathlib import Path

import pytest

from agentvm.api.ws_hub import OVERFLOW_REASON
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from tests.support.raw_ws import read_until_close
from tests.support.servers import in_process
from tests.support.stock_client import StockClient

LONG_REPLY = parse_script("""
rules:
  - match: "^flood"
    responses:
      - text: "%s"
""" % ("word " * 20_000))


def ws_frame(text: str) -> bytes:
    """A masked client text frame."""
    payload = text.encode()
    mask = os.urandom(4)
    header = bytearray([0x81])
    n = len(payload)
    if n < 126:
        header.append(0x80 | n)
    else:
        header += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    return bytes(header) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


@pytest.mark.local_only("the bounded send queue is avm serve's; in the cloud API Gateway buffers for the client")
async def test_a_client_that_stops_reading_is_closed_and_others_keep_going(tmp_path: Path) -> None:
    async with in_process(tmp_path / "d", driver=ScriptedDriver(LONG_REPLY), send_queue_max=200) as srv:
        async with StockClient(srv.url) as setup:
            image = await setup.new_image("c1")
        hub = srv.runtime.hub
        # a raw socket with a tiny receive buffer that completes the handshake and never reads again
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, ("127.0.0.1", srv.port))
        key = base64.b64encode(os.urandom(16)).decode()
        await loop.sock_sendall(sock, (f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                                       f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                                       "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = await asyncio.wait_for(loop.sock_recv(sock, 1024), 5)
        assert head.startswith(b"HTTP/1.1 101")
        baseline = len(hub)
        request = {"type": "message_send_request", "data": {"requestId": "r1", "imageId": image["imageId"],
                                                            "content": "flood me"}}
        await loop.sock_sendall(sock, ws_frame(json.dumps(request)))
        try:
            for _ in range(200):  # the server drops the connection once 200 frames are queued
                if len(hub) < baseline:
                    break
                await asyncio.sleep(0.05)
            assert len(hub) == baseline - 1
            # reading again, the client finds what was already buffered, then the close frame and its reason
            _frames, code, reason = await read_until_close(sock, 10)
            assert (code, reason) == (1013, OVERFLOW_REASON)
            # others are not slowed: a full turn on another connection completes promptly
            async with StockClient(srv.url) as other:
                other_image = await other.new_image("c2")
                events = await asyncio.wait_for(other.turn(other_image["imageId"], "hello"), 5)
                assert events[-1]["type"] == "turn_response"
            # the flooded turn itself still completes and is stored in full
            async with StockClient(srv.url) as checker:
                for _ in range(100):
                    history = (await checker.request("image_messages_request",
                                                     {"imageId": image["imageId"]}))["data"]["messages"]
                    if len(history) == 2:
                        break
                    await asyncio.sleep(0.1)
                assert history[1]["content"][0]["text"] == "word " * 20_000
        finally:
            sock.close()
