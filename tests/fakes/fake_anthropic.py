"""A local fake of the Anthropic Messages API, good enough for the real `anthropic` SDK.

Standard library only: an asyncio HTTP/1.1 server (keep-alive, `Content-Length` or chunked request
bodies) serving `POST /v1/messages` as Anthropic does — SSE for `stream: true` (message_start,
content_block_start, ping, content_block_delta, content_block_stop, message_delta, message_stop),
a JSON message otherwise. Responses come from a queue of scripted `Reply` / `ErrorReply` objects;
when the queue is empty a short default text reply is served. Every request is recorded.
Responses enqueued with `match=` are served only to requests whose body contains that text (e.g. a
marker in the user message), before the shared queue: concurrent conversations stay scripted.

In tests (the server runs on its own thread, so it works from sync and async code alike):

    with FakeAnthropic() as fake:
        fake.enqueue(Reply([Text(["Hel", "lo"])]), ErrorReply.rate_limit())
        client = anthropic.AsyncAnthropic(api_key="k", base_url=fake.base_url)
        ...
        assert fake.requests[0].body["model"] == "claude-x"

Standalone: `python -m tests.fakes.fake_anthropic --port 0 --script replies.json` prints
`listening http://127.0.0.1:<port>` and serves until SIGINT/SIGTERM. A script is a JSON list of
responses in the format `response_from_json` reads. Control endpoints: `GET /_fake/requests`
(recorded requests), `POST /_fake/responses` (enqueue a JSON list), `POST /_fake/reset`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http
import itertools
import json
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Self

JSON = dict[str, Any]

DEFAULT_TEXT = "Hello from the fake Anthropic API."
_IDLE_TIMEOUT_S = 30.0
_SHUTDOWN_TIMEOUT_S = 5.0
_MAX_BODY = 32 * 1024 * 1024
_MAX_HEADERS = 100

_STATUS_BY_ERROR_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


# --- the script ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Text:
    """A text block streamed as one `text_delta` per chunk (a bare string is one chunk)."""

    chunks: Sequence[str]

    def __post_init__(self) -> None:
        if isinstance(self.chunks, str):
            object.__setattr__(self, "chunks", (self.chunks,))


@dataclass(frozen=True, slots=True)
class ToolUse:
    """A tool_use block. Its input JSON is streamed as `chunks` pieces after the empty first
    `input_json_delta` the real API sends; `partial_json` overrides the pieces verbatim."""

    id: str
    name: str
    input: JSON = field(default_factory=dict)
    chunks: int = 3
    partial_json: Sequence[str] | None = None

    def pieces(self) -> list[str]:
        if self.partial_json is not None:
            return list(self.partial_json)
        text = json.dumps(self.input)
        n = max(1, min(self.chunks, len(text)))
        size = -(-len(text) // n)
        return [text[i:i + size] for i in range(0, len(text), size)]


@dataclass(frozen=True, slots=True)
class Thinking:
    """A thinking block (`thinking_delta` per chunk, then one `signature_delta`)."""

    chunks: Sequence[str]
    signature: str = "sig_fake"

    def __post_init__(self) -> None:
        if isinstance(self.chunks, str):
            object.__setattr__(self, "chunks", (self.chunks,))


Block = Text | ToolUse | Thinking


@dataclass(frozen=True, slots=True)
class FakeUsage:
    input_tokens: int = 10
    output_tokens: int = 5
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    def as_json(self) -> JSON:
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "output_tokens": self.output_tokens,
        }


@dataclass(frozen=True, slots=True)
class Interrupt:
    """Fail a streamed reply once `after_deltas` content_block_delta events were sent (or just
    before message_delta when the reply has fewer deltas).

    kind "error": an `event: error` SSE event, then the stream ends (as the API does);
    "disconnect": the connection is cut (no chunked terminator); "truncate": the stream ends
    cleanly but early, without message_delta / message_stop; "malformed": `raw` is sent as is
    (by default an event whose `data:` line is cut mid-JSON; surrogate escapes such as "\\udcff"
    become raw bytes, for invalid UTF-8), then the stream goes on as scripted,
    so a client that skipped the bad event would see the reply complete. A non-streamed reply with
    an "error" interrupt is answered with that error's HTTP status; the other kinds cut it.
    """

    after_deltas: int = 0
    kind: Literal["error", "disconnect", "truncate", "malformed"] = "error"
    error_type: str = "overloaded_error"
    message: str = "Overloaded"
    raw: str = 'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, "delta": {"ty\n\n'


@dataclass(frozen=True, slots=True)
class Reply:
    """A successful message. `usage` is the final usage; message_start reports `start_usage`
    (default: `usage` with output_tokens=1). message_delta reports only output_tokens unless
    `delta_reports_input`, which adds the input and cache numbers of `usage`."""

    blocks: Sequence[Block] = (Text(DEFAULT_TEXT),)
    stop_reason: str | None = "end_turn"
    usage: FakeUsage = FakeUsage()
    start_usage: FakeUsage | None = None
    delta_reports_input: bool = False
    message_id: str | None = None
    model: str | None = None  # default: the model the request named
    interrupt: Interrupt | None = None
    delay_s: float = 0.0  # before the response head
    event_delay_s: float = 0.0  # between SSE events


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An HTTP error with Anthropic's error body."""

    status: int
    error_type: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def rate_limit(cls, retry_after_s: float = 1,
                   message: str = "Number of request tokens has exceeded your rate limit.") -> Self:
        return cls(429, "rate_limit_error", message, {"retry-after": str(retry_after_s)})

    @classmethod
    def overloaded(cls, message: str = "Overloaded", retry_after_s: float | None = None) -> Self:
        return cls(529, "overloaded_error", message,
                   {} if retry_after_s is None else {"retry-after": str(retry_after_s)})

    @classmethod
    def api_error(cls, message: str = "Internal server error", retry_after_s: float | None = None) -> Self:
        return cls(500, "api_error", message, {} if retry_after_s is None else {"retry-after": str(retry_after_s)})

    @classmethod
    def invalid_request(cls, message: str = "Invalid request") -> Self:
        return cls(400, "invalid_request_error", message)


@dataclass(frozen=True, slots=True)
class RawStream:
    """A recorded SSE stream served verbatim (`tests/fixtures/anthropic_streams`), one event per
    chunk. With `cut_after`, the connection is dropped once that many `content_block_delta`
    events were sent (no chunked terminator), as a network failure mid-stream would."""

    body: bytes
    cut_after: int | None = None

    def events(self) -> list[bytes]:
        return [e + b"\n\n" for e in self.body.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]


Response = Reply | ErrorReply | RawStream


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: JSON  # {} when the body was not a JSON object
    at: float = 0.0  # time.monotonic() when the request was read (retry gaps)

    @property
    def api_key(self) -> str | None:
        """The key sent as `x-api-key`, or else as `Authorization: Bearer` (what SDK 2.x sends)."""
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        scheme, _, token = self.headers.get("authorization", "").partition(" ")
        return token if scheme.lower() == "bearer" and token else None


def response_from_json(obj: JSON) -> Response:
    """A response from its JSON script form:

    {"error": {"status": 429, "type": "rate_limit_error", "message": "...", "headers": {...}}}
    {"blocks": [{"type": "text", "chunks": ["Hel", "lo"]} | {"type": "text", "text": "Hello"}
                | {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {...}, "chunks": 3}
                | {"type": "thinking", "chunks": ["..."]}],
     "stop_reason": "end_turn", "usage": {"input_tokens": 10, ...}, "start_usage": {...},
     "delta_reports_input": false, "message_id": "msg_1", "model": "m",
     "interrupt": {"after_deltas": 1, "kind": "error", "error_type": "...", "message": "...",
                   "raw": "(kind malformed: the bytes to send)"},
     "delay_s": 0, "event_delay_s": 0}
    """
    if "error" in obj:
        err = obj["error"]
        return ErrorReply(int(err["status"]), str(err["type"]), str(err["message"]),
                          {str(k): str(v) for k, v in err.get("headers", {}).items()})
    blocks: list[Block] = []
    for b in obj.get("blocks", [{"type": "text", "text": DEFAULT_TEXT}]):
        if b["type"] == "text":
            blocks.append(Text(b["chunks"] if "chunks" in b else b["text"]))
        elif b["type"] == "tool_use":
            blocks.append(ToolUse(b["id"], b["name"], b.get("input", {}), int(b.get("chunks", 3)),
                                  b.get("partial_json")))
        elif b["type"] == "thinking":
            blocks.append(Thinking(b["chunks"], b.get("signature", "sig_fake")))
        else:
            raise ValueError(f"unknown block type {b['type']!r}")
    interrupt = obj.get("interrupt")
    return Reply(
        blocks=blocks,
        stop_reason=obj.get("stop_reason", "end_turn"),
        usage=FakeUsage(**obj["usage"]) if "usage" in obj else FakeUsage(),
        start_usage=FakeUsage(**obj["start_usage"]) if "start_usage" in obj else None,
        delta_reports_input=bool(obj.get("delta_reports_input", False)),
        message_id=obj.get("message_id"),
        model=obj.get("model"),
        interrupt=Interrupt(**interrupt) if interrupt else None,
        delay_s=float(obj.get("delay_s", 0.0)),
        event_delay_s=float(obj.get("event_delay_s", 0.0)),
    )


# --- HTTP plumbing ---------------------------------------------------------------------------

class _BadRequest(Exception):
    pass


@dataclass(slots=True)
class _HttpRequest:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


async def _read_request(reader: asyncio.StreamReader) -> _HttpRequest | None:
    line = await reader.readline()
    while line in (b"\r\n", b"\n"):
        line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest(line[:100])
    method, target, version = parts
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if not raw:
            raise _BadRequest("EOF in headers")
        if raw in (b"\r\n", b"\n"):
            break
        name, sep, value = raw.decode("latin-1").partition(":")
        if not sep or len(headers) >= _MAX_HEADERS:
            raise _BadRequest("bad header")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        total = 0
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                break
            total += size
            if total > _MAX_BODY:
                raise _BadRequest("body too large")
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(chunks)
    else:
        length = int(headers.get("content-length", "0") or "0")
        if not 0 <= length <= _MAX_BODY:
            raise _BadRequest("bad content-length")
        body = await reader.readexactly(length)
    keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    return _HttpRequest(method.upper(), target, headers, body, keep_alive)


def _reason(status: int) -> str:
    if status == 529:
        return "Overloaded"
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_reason(status)}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _sse(event: str, data: JSON) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _error_body(error_type: str, message: str, request_id: str) -> JSON:
    return {"type": "error", "error": {"type": error_type, "message": message}, "request_id": request_id}


# --- the server ------------------------------------------------------------------------------

class FakeAnthropic:
    """The fake API server. `start()`/`stop()` (or `with`) run it on a thread with its own loop;
    `serve(stop)` runs it on the current loop. Scripting and inspection are thread-safe."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 default: Response | None = None) -> None:
        self._host = host
        self._port = port
        self._api_key = api_key  # when set, requests must carry it (x-api-key or Bearer)
        self._default = default or Reply()
        self._lock = threading.Lock()
        self._queue: deque[Response] = deque()
        self._routes: dict[str, deque[Response]] = {}  # match text -> its own queue
        self._requests: list[RecordedRequest] = []
        self._ids = {"msg": itertools.count(1), "req": itertools.count(1)}
        self._bound_port: int | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None

    # scripting and inspection

    def enqueue(self, *responses: Response, match: str | None = None) -> None:
        """Queue responses; with `match`, only for requests whose raw body contains that text."""
        with self._lock:
            if match is None:
                self._queue.extend(responses)
            else:
                self._routes.setdefault(match, deque()).extend(responses)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue) + sum(len(q) for q in self._routes.values())

    def _take(self, raw_body: bytes) -> Response:
        with self._lock:
            text = raw_body.decode("utf-8", "replace")
            for match, queue in self._routes.items():
                if queue and match in text:
                    return queue.popleft()
            return self._queue.popleft() if self._queue else self._default

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def last_request(self) -> RecordedRequest:
        with self._lock:
            if not self._requests:
                raise LookupError("no request received")
            return self._requests[-1]

    def reset(self) -> None:
        """Drop queued responses and recorded requests."""
        with self._lock:
            self._queue.clear()
            self._routes.clear()
            self._requests.clear()

    @property
    def port(self) -> int:
        if self._bound_port is None:
            raise RuntimeError("the fake Anthropic server is not running")
        return self._bound_port

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}"

    # lifecycle

    def start(self, timeout_s: float = 5.0) -> Self:
        """Serve on a background thread; returns once the socket is listening."""
        if self._thread is not None:
            raise RuntimeError("already started")
        ready = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop_event = asyncio.Event()
            await self.serve(self._stop_event, ready=lambda _port: ready.set())

        def run() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=run, name="fake-anthropic", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise TimeoutError("the fake Anthropic server did not start")
        if failure:
            raise RuntimeError("the fake Anthropic server failed to start") from failure[0]
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        thread, loop, stop_event = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        if loop is not None and stop_event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop already finished
                loop.call_soon_threadsafe(stop_event.set)
        thread.join(timeout_s)
        self._thread = self._loop = self._stop_event = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def serve(self, stop: asyncio.Event, *, ready: Callable[[int], None] | None = None) -> None:
        """Serve on the running loop until `stop` is set."""
        server = await asyncio.start_server(self._handle, self._host, self._port)
        self._bound_port = int(server.sockets[0].getsockname()[1])
        try:
            if ready is not None:
                ready(self._bound_port)
            await stop.wait()
        finally:
            server.close()
            handlers = list(self._handlers)
            for task in handlers:
                task.cancel()
            if handlers:
                await asyncio.wait(handlers, timeout=_SHUTDOWN_TIMEOUT_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), _SHUTDOWN_TIMEOUT_S)
            self._bound_port = None

    # connections

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while True:
                try:
                    request = await asyncio.wait_for(_read_request(reader), _IDLE_TIMEOUT_S)
                except (TimeoutError, asyncio.IncompleteReadError, _BadRequest, ValueError):
                    break
                if request is None:
                    break
                keep_alive = await self._respond(request, writer)
                if not (keep_alive and request.keep_alive):
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            return f"{prefix}_fake_{next(self._ids[prefix])}"

    async def _respond(self, request: _HttpRequest, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must not be reused."""
        path = request.target.split("?", 1)[0]
        request_id = self._next_id("req")
        if path.startswith("/_fake/"):
            return await self._control(request, path, writer)
        if path != "/v1/messages" or request.method != "POST":
            return await self._send_error(writer, ErrorReply(404, "not_found_error", f"Not found: {path}"),
                                          request_id)
        try:
            body = json.loads(request.body or b"null")
        except ValueError:
            body = None
        recorded = RecordedRequest(request.method, path, dict(request.headers),
                                   body if isinstance(body, dict) else {}, time.monotonic())
        with self._lock:
            self._requests.append(recorded)
        if self._api_key is not None and recorded.api_key != self._api_key:
            return await self._send_error(
                writer, ErrorReply(401, "authentication_error", "invalid x-api-key"), request_id)
        if not isinstance(body, dict):
            return await self._send_error(writer, ErrorReply.invalid_request("Body must be a JSON object"),
                                          request_id)
        for required in ("model", "max_tokens", "messages"):
            if required not in body:
                return await self._send_error(
                    writer, ErrorReply.invalid_request(f"{required}: Field required"), request_id)
        response = self._take(request.body)
        if isinstance(response, ErrorReply):
            return await self._send_error(writer, response, request_id)
        if isinstance(response, RawStream):
            return await self._send_raw(writer, response, request_id)
        if response.delay_s:
            await asyncio.sleep(response.delay_s)
        message_id = response.message_id or self._next_id("msg")
        model = response.model or str(body["model"])
        if body.get("stream"):
            return await self._send_stream(writer, response, message_id, model, request_id)
        return await self._send_message(writer, response, message_id, model, request_id)

    async def _send(self, writer: asyncio.StreamWriter, status: int, payload: JSON,
                    headers: dict[str, str] | None = None) -> bool:
        data = json.dumps(payload).encode()
        head = {"content-type": "application/json", "content-length": str(len(data)),
                "connection": "keep-alive", **(headers or {})}
        writer.write(_head(status, head) + data)
        await writer.drain()
        return True

    async def _send_error(self, writer: asyncio.StreamWriter, error: ErrorReply, request_id: str) -> bool:
        body = _error_body(error.error_type, error.message, request_id)
        return await self._send(writer, error.status, body, {"request-id": request_id, **error.headers})

    async def _send_message(self, writer: asyncio.StreamWriter, reply: Reply, message_id: str, model: str,
                            request_id: str) -> bool:
        if reply.interrupt is not None:
            if reply.interrupt.kind != "error":
                writer.transport.abort()
                return False
            error_type = reply.interrupt.error_type
            status = _STATUS_BY_ERROR_TYPE.get(error_type, 500)
            error = ErrorReply(status, error_type, reply.interrupt.message)
            return await self._send_error(writer, error, request_id)
        content: list[JSON] = []
        for block in reply.blocks:
            if isinstance(block, Text):
                content.append({"type": "text", "text": "".join(block.chunks)})
            elif isinstance(block, ToolUse):
                content.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
            else:
                content.append({"type": "thinking", "thinking": "".join(block.chunks),
                                "signature": block.signature})
        message = {"id": message_id, "type": "message", "role": "assistant", "model": model,
                   "content": content, "stop_reason": reply.stop_reason, "stop_sequence": None,
                   "usage": reply.usage.as_json()}
        return await self._send(writer, 200, message, {"request-id": request_id})

    def _stream_events(self, reply: Reply, message_id: str, model: str) -> list[tuple[str, JSON]]:
        start_usage = reply.start_usage or FakeUsage(
            reply.usage.input_tokens, 1, reply.usage.cache_read_input_tokens,
            reply.usage.cache_creation_input_tokens)
        events: list[tuple[str, JSON]] = [("message_start", {"type": "message_start", "message": {
            "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": start_usage.as_json()}})]

        def delta(index: int, payload: JSON) -> tuple[str, JSON]:
            return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": payload}

        for index, block in enumerate(reply.blocks):
            if isinstance(block, Text):
                start: JSON = {"type": "text", "text": ""}
                deltas = [delta(index, {"type": "text_delta", "text": c}) for c in block.chunks]
            elif isinstance(block, ToolUse):
                start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
                deltas = [delta(index, {"type": "input_json_delta", "partial_json": p})
                          for p in ["", *block.pieces()]]
            else:
                start = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [delta(index, {"type": "thinking_delta", "thinking": c}) for c in block.chunks]
                deltas.append(delta(index, {"type": "signature_delta", "signature": block.signature}))
            events.append(("content_block_start",
                           {"type": "content_block_start", "index": index, "content_block": start}))
            if index == 0:
                events.append(("ping", {"type": "ping"}))
            events.extend(deltas)
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        usage: JSON = {"output_tokens": reply.usage.output_tokens}
        if reply.delta_reports_input:
            usage = reply.usage.as_json()
        events.append(("message_delta", {"type": "message_delta", "usage": usage,
                                         "delta": {"stop_reason": reply.stop_reason, "stop_sequence": None}}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    async def _send_stream(self, writer: asyncio.StreamWriter, reply: Reply, message_id: str, model: str,
                           request_id: str) -> bool:
        writer.write(_head(200, {"content-type": "text/event-stream; charset=utf-8",
                                 "cache-control": "no-cache", "transfer-encoding": "chunked",
                                 "connection": "keep-alive", "request-id": request_id}))
        await writer.drain()
        interrupt = reply.interrupt
        deltas_sent = 0
        for name, data in self._stream_events(reply, message_id, model):
            if interrupt is not None and (
                    (name == "content_block_delta" and deltas_sent == interrupt.after_deltas)
                    or name == "message_delta"):
                if interrupt.kind == "disconnect":
                    writer.transport.abort()
                    return False
                if interrupt.kind == "error":
                    writer.write(_chunk(_sse("error", _error_body(interrupt.error_type, interrupt.message,
                                                                  request_id))))
                if interrupt.kind == "malformed":
                    writer.write(_chunk(interrupt.raw.encode("utf-8", "surrogateescape")))
                    await writer.drain()
                    interrupt = None  # sent once; the stream goes on as scripted
                else:
                    break
            if reply.event_delay_s:
                await asyncio.sleep(reply.event_delay_s)
            writer.write(_chunk(_sse(name, data)))
            await writer.drain()
            if name == "content_block_delta":
                deltas_sent += 1
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def _send_raw(self, writer: asyncio.StreamWriter, raw: RawStream, request_id: str) -> bool:
        writer.write(_head(200, {"content-type": "text/event-stream; charset=utf-8",
                                 "cache-control": "no-cache", "transfer-encoding": "chunked",
                                 "connection": "keep-alive", "request-id": request_id}))
        deltas = 0
        for event in raw.events():
            if raw.cut_after is not None and deltas >= raw.cut_after and b"content_block_delta" in event:
                await writer.drain()
                writer.transport.abort()
                return False
            writer.write(_chunk(event))
            await writer.drain()
            deltas += b"event: content_block_delta" in event
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def _control(self, request: _HttpRequest, path: str, writer: asyncio.StreamWriter) -> bool:
        if path == "/_fake/requests" and request.method == "GET":
            return await self._send(writer, 200, {"requests": [asdict(r) for r in self.requests]})
        if path == "/_fake/responses" and request.method == "POST":
            try:
                items = json.loads(request.body)
                responses = [response_from_json(item) for item in items]
            except (ValueError, TypeError, KeyError) as exc:
                return await self._send(writer, 400, {"error": f"bad script: {exc}"})
            self.enqueue(*responses)
            return await self._send(writer, 200, {"pending": self.pending})
        if path == "/_fake/reset" and request.method == "POST":
            self.reset()
            return await self._send(writer, 200, {"pending": 0})
        return await self._send(writer, 404, {"error": f"Not found: {path}"})


# --- standalone ------------------------------------------------------------------------------

def load_script(path: str) -> list[Response]:
    with open(path, encoding="utf-8") as f:
        items = json.load(f)
    if not isinstance(items, list):
        raise ValueError("a script is a JSON list of responses")
    return [response_from_json(item) for item in items]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A fake Anthropic Messages API on 127.0.0.1.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--script", help="a JSON file: a list of scripted responses")
    parser.add_argument("--api-key", help="reject requests that carry another key")
    args = parser.parse_args(argv)
    fake = FakeAnthropic(host=args.host, port=args.port, api_key=args.api_key)
    if args.script:
        fake.enqueue(*load_script(args.script))

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def ready(port: int) -> None:
            sys.stdout.write(f"listening http://{args.host}:{port}\n")
            sys.stdout.flush()

        await fake.serve(stop, ready=ready)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
