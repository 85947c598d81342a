"""A raw HTTP/1.1 client for uploads a server may refuse early: the body is streamed from an
iterable while the answer is read at the same time, and sending stops as soon as the answer is in
(or the server resets the connection). httpx writes the whole body before it reads, so it cannot
show what a server answers to a 512 MiB upload after its first bytes."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any


def zeros(total: int, chunk: int = 1 << 16) -> Iterator[bytes]:
    """`total` zero bytes in pieces of `chunk`, made on the fly (one piece held, whatever the total)."""
    piece = bytes(chunk)
    whole, rest = divmod(total, chunk)
    for _ in range(whole):
        yield piece
    if rest:
        yield piece[:rest]


@dataclass
class Answer:
    status: int | None  # None: the connection was reset before an answer came
    headers: dict[str, str]
    body: bytes
    sent: int  # body bytes the client managed to hand to the kernel

    def json(self) -> Any:
        return json.loads(self.body)


def _parse(data: bytes | bytearray) -> tuple[int, dict[str, str], bytes] | None:
    """The answer in `data`, once it is all there."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = data[:end].decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    body = data[end + 4:]
    length = int(headers.get("content-length", "0"))
    if len(body) < length:
        return None
    return int(lines[0].split()[1]), headers, bytes(body[:length])


async def upload(port: int, method: str, path: str, body: Iterable[bytes] = (), *,
                 headers: dict[str, str] | None = None, length: int | None = None,
                 timeout: float = 30.0) -> Answer:
    """Send `body` chunked, or with `Content-Length: length` when given (the body may be shorter:
    the server is expected to answer before it is all sent). Runs in a thread of its own."""
    head = [f"{method} {path} HTTP/1.1", f"host: 127.0.0.1:{port}", "content-type: application/json"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    head.append(f"content-length: {length}" if length is not None else "transfer-encoding: chunked")
    return await asyncio.to_thread(_upload, port, ("\r\n".join(head) + "\r\n\r\n").encode(), body,
                                   length is None, timeout)


def _upload(port: int, head: bytes, body: Iterable[bytes], chunked: bool, timeout: float) -> Answer:
    """Blocking sockets on purpose: after a reset, `recv` still returns what arrived before it
    (asyncio's transports drop it once a send has failed)."""
    received = bytearray()
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:

        def take_available() -> bool:
            """Read what has arrived without waiting; True once the connection is over."""
            while select.select([sock], [], [], 0)[0]:
                try:
                    data = sock.recv(1 << 16)
                except ConnectionError:
                    return True
                if not data:
                    return True
                received.extend(data)
            return False

        try:
            sock.sendall(head)
            for chunk in body:
                if take_available() or _parse(received) is not None:
                    break
                sock.sendall(chunk if not chunked else b"%x\r\n%b\r\n" % (len(chunk), chunk))
                sent += len(chunk)
            else:
                if chunked:
                    sock.sendall(b"0\r\n\r\n")
        except (ConnectionError, TimeoutError):
            pass  # the server closed while we were sending: its answer may have arrived before
        deadline = time.monotonic() + timeout
        while _parse(received) is None and time.monotonic() < deadline:
            try:
                data = sock.recv(1 << 16)
            except (ConnectionError, TimeoutError):
                break
            if not data:
                break
            received.extend(data)
    parsed = _parse(received)
    if parsed is None:
        return Answer(None, {}, b"", sent)
    return Answer(*parsed, sent)
