"""A WebSocket client on a raw socket, for clients that misbehave on purpose (one that stops
reading): the handshake, masked text frames, and reading what the server sent up to its close frame."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import time


def client_frame(text: str | bytes) -> bytes:
    """A masked client text frame (`bytes`: sent as they are, UTF-8 or not)."""
    payload = text.encode() if isinstance(text, str) else text
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        header = bytes([0x81, 0x80 | n])
    elif n < 1 << 16:
        header = bytes([0x81, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        header = bytes([0x81, 0x80 | 127]) + n.to_bytes(8, "big")
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def open_raw(port: int, *, path: str = "/ws", rcvbuf: int = 4096) -> socket.socket:
    """A non-blocking socket with a small receive buffer that has completed the handshake and read
    nothing past it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        await loop.sock_sendall(sock, (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                                       f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                                       "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 1), 5)  # byte by byte: never past the head
            if not chunk:
                raise ConnectionError("the server closed the connection during the handshake")
            head += chunk
        if not head.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(f"the handshake failed: {head[:200]!r}")
    except BaseException:
        sock.close()
        raise
    return sock


async def read_until_close(sock: socket.socket, timeout: float) -> tuple[int, int | None, str | None]:
    """Read the server's frames: (data frames, close code, close reason), up to the close frame;
    (frames, None, None) at EOF, on a reset or after `timeout` seconds without one."""
    loop = asyncio.get_running_loop()
    buf = bytearray()
    frames = pos = 0
    deadline = time.monotonic() + timeout
    while True:
        while len(buf) - pos >= 2:
            b0, n, head = buf[pos], buf[pos + 1] & 0x7F, 2
            if n >= 126:
                head = 4 if n == 126 else 10
                if len(buf) - pos < head:
                    break
                n = int.from_bytes(buf[pos + 2:pos + head], "big")
            if len(buf) - pos < head + n:
                break
            body = bytes(buf[pos + head:pos + head + n])
            pos += head + n
            opcode = b0 & 0x0F
            if opcode == 0x8:
                code = int.from_bytes(body[:2], "big") if len(body) >= 2 else None
                return frames, code, body[2:].decode(errors="replace")
            if opcode in (0x1, 0x2):
                frames += 1
        if pos > 1 << 20:
            del buf[:pos]
            pos = 0
        left = deadline - time.monotonic()
        if left <= 0:
            return frames, None, None
        try:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), left)
        except (TimeoutError, OSError):
            return frames, None, None
        if not chunk:
            return frames, None, None
        buf += chunk
