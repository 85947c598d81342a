"""A scripted streaming HTTP/1.1 server for the upstream fakes (standard library only).

Each request takes the next scripted `Stub` from a queue: a status, headers, and body pieces, each
sent as its own chunk of a chunked response (so a client sees them arrive separately), with an
optional `cut` that drops the connection before the terminating chunk, as a network failure
mid-stream would. Every request is recorded (method, path, lower-cased headers, raw body).
"""

from __future__ import annotations

import http
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


@dataclass(frozen=True, slots=True)
class Stub:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    pieces: tuple[bytes, ...] = ()
    cut: bool = False  # drop the connection after the pieces, without the terminating chunk
    delay_s: float = 0.0  # between pieces


@dataclass(frozen=True, slots=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


class StubServer:
    """`with StubServer() as server:` serves on 127.0.0.1 (a free port) on its own threads."""

    def __init__(self, default: Stub | None = None) -> None:
        self._queue: deque[Stub] = deque()
        self._default = default or Stub(404, {"content-type": "application/json"}, (b'{"error": "no stub"}',))
        self._lock = threading.Lock()
        self.requests: list[Recorded] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def enqueue(self, *stubs: Stub) -> None:
        with self._lock:
            self._queue.extend(stubs)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def _take(self, recorded: Recorded) -> Stub:
        with self._lock:
            self.requests.append(recorded)
            return self._queue.popleft() if self._queue else self._default

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                stub = server._take(Recorded(self.command, self.path, headers, raw))
                self.send_response(stub.status, http.HTTPStatus(stub.status).phrase
                                   if stub.status in http.HTTPStatus._value2member_map_ else "Unknown")
                for name, value in stub.headers.items():
                    self.send_header(name, value)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                try:
                    for piece in stub.pieces:
                        if stub.delay_s:
                            time.sleep(stub.delay_s)
                        if piece:
                            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                            self.wfile.flush()
                    if stub.cut:
                        self.close_connection = True
                        return
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

        return Handler
