"""An asyncio client for the AgentX WebSocket protocol, with AgentVM's resume extensions.

Wire behaviour follows the stock `agentxjs` remote client (spec §1.8): requests are command envelopes
correlated by `data.requestId`; every `{"__msgId","__payload"}` wrapper is ACKed before its payload
is processed; a response that carries `__subscriptions` makes the client subscribe to those sessions
before `request()` returns; matched responses are not dispatched to `on()` handlers.

AgentVM extensions handled here:

* every session event carries a per-session integer `seq`. The client remembers the last one seen
  per session and drops anything at or below it, so no event reaches a handler twice;
* when the socket drops (not after `close()`), the client reconnects with jittered exponential
  backoff and re-sends `subscribe` with `afterSeq` for every session it follows. The server replays
  what was missed, so handlers see every event exactly once, in order;
* `token` is sent as `Authorization: Bearer <token>` on the upgrade request;
* it asks for batched frames (`?frames=batch` on the URL; `batch_frames=False` does not): a frame may
  then hold a JSON array of events, handled one by one in order. Frames of one event are handled
  as ever, so a server that ignores the parameter works the same;
* in the cloud, an event too big for one frame arrives as a reference (`data: {"__ref": {url, bytes,
  sha256}}`, docs/protocol.md). The client fetches it, checks its size and hash, and handles the
  original event in its place, before any later event. If it cannot, a response carries
  `data.error` (so `request_ok` raises `RequestFailed`) and any other event becomes a `system_error`
  with `code: "frame_unavailable"`. A frame the server had to truncate (`data.__truncated`) is
  reported the same way.

Sessions: an image may have several sessions (the extra ones are created over HTTP). Every session
event carries `context.imageId` and `context.sessionId`; each session has its own `seq` sequence and
its own turn queue. `send_message(..., session_id=...)` and `messages(..., session_id=...)` send
`sessionId` to address one of them (without it: the image's primary session), and a turn is followed
on its own session only: the one asked for, else the `sessionId` of the `message_send_response`, else
(a server that omits it, such as the stock reference with one session per image) any session of the
image, until the turn's first event shows which.

Handlers run one at a time, in arrival order, on a dispatcher task of their own, so a handler may
itself `await client.request(...)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import orjson
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from agentvm_client.errors import (
    ClientClosed,
    ClientError,
    ConnectError,
    ConnectionLost,
    ConnectionRefused,
    RequestFailed,
    RequestTimeout,
)
from agentvm_client.frames import (
    _MAX_MESSAGE_BYTES,
    _REF_TIMEOUT_S,
    Event,
    EventHandler,
    Hook,
    _context_str,
    _data,
    _encode,
    _fetch_referenced,
    _now_ms,
    _request_id,
    _stand_in,
    _str_field,
    _Unavailable,
    _unavailable,
)
from agentvm_client.turns import TurnResult, _TurnCollector, _TurnTracker

if TYPE_CHECKING:
    import httpx

__all__ = ["AgentVMClient"]

logger = logging.getLogger(__name__)

_PING_INTERVAL_S = 20.0
_PING_TIMEOUT_S = 20.0
_CLOSE_TIMEOUT_S = 2.0
_DRAIN_TIMEOUT_S = 2.0  # how long close() lets handlers finish events already received
_MIN_BACKOFF_S = 0.01  # never retry in a tight loop
_AUTH_REJECTED = frozenset({401, 403})
_POLICY_VIOLATION = 1008  # the server's close when it refuses the client (its API key): not retried
_BATCH_QUERY = ("frames", "batch")  # docs/protocol.md, "Batched frames"


def _with_query(url: str, param: tuple[str, str]) -> str:
    """`url` with `name=value` added to its query string (kept as it is when it names `name` already)."""
    base, _, fragment = url.partition("#")
    query = base.partition("?")[2]
    if any(part.split("=", 1)[0] == param[0] for part in query.split("&") if part):
        return url
    joined = f"{base}{'&' if query else ('' if base.endswith('?') else '?')}{param[0]}={param[1]}"
    return f"{joined}#{fragment}" if fragment else joined


def _error_message(body: bytes | bytearray | None) -> str:
    """The message of an answer in the API's error shape (`{"error": {"message"}}`), or its text."""
    if not body:
        return ""
    try:
        error = orjson.loads(body).get("error")
        return str(error["message"])[:300] if isinstance(error, dict) and error.get("message") else ""
    except (orjson.JSONDecodeError, AttributeError):
        return bytes(body[:300]).decode("utf-8", "replace").strip()


def _refusal(exc: ConnectionClosed) -> ConnectionRefused | None:
    """The server's refusal of this client: a close 1008 with a reason (its API key, most often;
    `avm serve` and the turn hosts' front accept a bad key's upgrade and close it at once so that a
    browser can read why)."""
    rcvd = exc.rcvd
    if rcvd is None or rcvd.code != _POLICY_VIOLATION or not rcvd.reason:
        return None
    return ConnectionRefused(rcvd.reason, code=rcvd.code)


async def _call(fn: Callable[..., Awaitable[None] | None], *args: Any, what: str) -> None:
    """Run a sync or async callback; log (never raise) its exceptions."""
    try:
        result = fn(*args)
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("%s raised", what)


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[Event]
    ws: ClientConnection
    type: str
    on_response: Callable[[Event], None] | None


@dataclass(slots=True)
class _Registration:
    handler: Callable[..., Awaitable[None] | None]


# --------------------------------------------------------------------------------------------- client


class AgentVMClient:
    """An AgentX/AgentVM WebSocket client. Use `async with AgentVMClient(url) as client:`."""

    #: Seconds `send_message` waits after the end of a turn for its `turn_response` (AgentVM only).
    turn_response_grace: float = 1.0

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        context: Mapping[str, Any] | None = None,
        reconnect: bool = True,
        request_timeout: float = 30.0,
        max_reconnect_delay: float = 10.0,
        min_reconnect_delay: float = 0.5,
        connect_timeout: float = 10.0,
        http_client: httpx.AsyncClient | None = None,
        batch_frames: bool = True,
    ) -> None:
        """`http_client` fetches events the server sends by reference (cloud only); by default one is
        created on first use and closed by `close()`. `batch_frames`: ask for several events per
        frame (fewer frames, which the cloud bills)."""
        self.url = url
        self._batch_frames = batch_frames
        self._token = token
        self._context: dict[str, Any] = dict(context or {})
        self._reconnect = reconnect
        self._request_timeout = request_timeout
        self._max_reconnect_delay = max(max_reconnect_delay, _MIN_BACKOFF_S)
        self._min_reconnect_delay = min(max(min_reconnect_delay, _MIN_BACKOFF_S), self._max_reconnect_delay)
        self._connect_timeout = connect_timeout
        self._http = http_client
        self._own_http = http_client is None

        self._ws: ClientConnection | None = None
        self._ready = False  # `_ws` is open and every subscription has been (re)sent on it
        self._closed = False
        self._dead: ClientError | None = None  # set when the connection is gone for good
        self._state_waiters: set[asyncio.Future[None]] = set()
        self._run_task: asyncio.Task[None] | None = None
        self._dispatch_task: asyncio.Task[None] | None = None
        self._dispatch_queue: asyncio.Queue[Callable[[], Awaitable[None]] | None] = asyncio.Queue()
        self._connect_lock = asyncio.Lock()

        self._pending: dict[str, _Pending] = {}
        self._handlers: dict[str, list[_Registration]] = {}
        self._reconnected_hooks: list[_Registration] = []
        self._disconnected_hooks: list[_Registration] = []
        self._subscribed: dict[str, None] = {}  # ordered set of sessions to follow
        self._sent_subscribe: set[str] = set()  # sessions subscribed on the current connection
        self._last_seq: dict[str, int] = {}
        self._refusals: dict[ClientConnection, str] = {}  # a connection the server refused: why
        self._server_has_seq = False
        self._trackers: dict[str, _TurnTracker] = {}  # by sessionId
        self._collectors: dict[str, list[_TurnCollector]] = {}  # by imageId

    # ------------------------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        """True when requests can be sent right now."""
        return self._ready and not self._closed

    @property
    def subscriptions(self) -> tuple[str, ...]:
        """Sessions this client follows (explicitly, via `__subscriptions`, or by receiving events)."""
        return tuple(self._subscribed)

    @property
    def failed(self) -> ClientError | None:
        """Why the connection is gone for good (reconnect disabled, or refused on reconnect), else None."""
        return self._dead

    def last_seq(self, session_id: str) -> int | None:
        """The highest `seq` seen for a session, or None."""
        return self._last_seq.get(session_id)

    async def connect(self) -> None:
        """Open the connection. Raises `ConnectError` if the server cannot be reached or refuses the
        upgrade (no retry). A server that accepts the upgrade and closes it at once with 1008 (a bad
        key on `avm serve`) makes the first request raise `ConnectionRefused` with its reason (this
        call too, when the close arrives first)."""
        if self._closed:
            raise ClientClosed("client is closed")
        async with self._connect_lock:
            if self._run_task is not None:
                return
            ws = await self._open()
            if self._closed:
                await ws.close()
                raise ClientClosed("client closed while connecting")
            await self._start(ws)

    async def _start(self, ws: ClientConnection) -> None:
        self._ws = ws
        try:
            await self._resubscribe(ws)
        except ConnectionClosed as exc:
            self._ws = None
            refused = _refusal(exc)
            if refused is not None:
                raise refused from exc
            raise ConnectError(f"cannot connect to {self.url}: connection closed during setup") from exc
        self._set_ready(True)
        self._dispatch_task = asyncio.create_task(self._dispatch_loop(), name="agentvm-client-dispatch")
        self._run_task = asyncio.create_task(self._run(ws), name="agentvm-client-receive")

    async def close(self) -> None:
        """Close the connection and stop the background tasks. Idempotent.

        Pending requests and `send_message` waits fail with `ClientClosed`. Events already received
        are still handed to the handlers (for at most a couple of seconds).
        """
        if self._closed:
            return
        self._closed = True
        self._ready = False
        exc = ClientClosed("client closed")
        self._fail_pending(exc)
        self._fail_collectors(exc)
        self._notify_state()
        current = asyncio.current_task()
        ws, self._ws = self._ws, None
        if ws is not None:
            await ws.close()
        run_task, self._run_task = self._run_task, None
        if run_task is not None and run_task is not current:
            run_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run_task
        dispatch_task, self._dispatch_task = self._dispatch_task, None
        if dispatch_task is not None:
            self._dispatch_queue.put_nowait(None)
            if dispatch_task is not current:
                try:
                    await asyncio.wait_for(dispatch_task, _DRAIN_TIMEOUT_S)
                except TimeoutError:
                    logger.warning("event handlers still busy after %.1fs; cancelled", _DRAIN_TIMEOUT_S)
        http, self._http = self._http, None
        if http is not None and self._own_http:
            await http.aclose()

    # ------------------------------------------------------------------------------------- requests

    async def request(self, type: str, data: Mapping[str, Any] | None = None, *,
                      timeout: float | None = None) -> Event:
        """Send a command and return its whole response event (`res["data"]` holds the payload).

        `type` may omit the `_request` suffix. Does not raise on `data.error` (see `request_ok`).
        Raises `RequestTimeout`, `ConnectionLost` (dropped before the response) or `ClientClosed`.
        """
        return await self._request(type, data, limit=timeout)

    async def request_ok(self, type: str, data: Mapping[str, Any] | None = None, *,
                         timeout: float | None = None) -> Event:
        """Like `request`, but raises `RequestFailed` when the response carries `data.error`."""
        response = await self._request(type, data, limit=timeout)
        error = _data(response).get("error")
        if error:
            raise RequestFailed(str(error), response)
        return response

    async def _request(self, type: str, data: Mapping[str, Any] | None, *, limit: float | None,
                       on_response: Callable[[Event], None] | None = None) -> Event:
        if self._closed:
            raise ClientClosed("client is closed")
        request_type = type if type.endswith("_request") else f"{type}_request"
        request_id = _request_id()
        while request_id in self._pending:
            request_id = _request_id()
        payload: dict[str, Any] = {**self._context, **(data or {}), "requestId": request_id}
        frame = _encode({
            "type": request_type,
            "timestamp": _now_ms(),
            "data": payload,
            "source": "command",
            "category": "request",
            "intent": "request",
        })
        if limit is None:
            limit = self._request_timeout
        future: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(limit):
                ws = await self._wait_ready()
                self._pending[request_id] = _Pending(future, ws, request_type, on_response)
                try:
                    await ws.send(frame)
                except ConnectionClosed as exc:
                    seen = future.exception() if future.done() and not future.cancelled() else None
                    if isinstance(seen, ClientError):  # the receive task saw the close first: its reason
                        raise seen from exc
                    raise _refusal(exc) or ConnectionLost(f"connection lost while sending {request_type}") from exc
                return await future
        except TimeoutError as exc:
            if isinstance(exc, ClientError):
                raise
            raise RequestTimeout(f"Request timeout: {request_type} ({limit:g}s)") from None
        finally:
            self._pending.pop(request_id, None)

    async def _wait_ready(self) -> ClientConnection:
        while True:
            if self._closed:
                raise ClientClosed("client is closed")
            if isinstance(self._dead, ConnectionRefused):
                raise ConnectionRefused(self._dead.reason, code=self._dead.code)
            if self._dead is not None:
                raise ConnectionLost(str(self._dead))
            if self._run_task is None:
                raise ConnectionLost("not connected: call connect() first")
            if self._ready and self._ws is not None:
                return self._ws
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._state_waiters.add(waiter)
            try:
                await waiter
            finally:
                self._state_waiters.discard(waiter)

    # ------------------------------------------------------------------------------------- handlers

    def on(self, type: str, handler: EventHandler) -> Callable[[], None]:
        """Call `handler(event)` for each dispatched event of `type` (`"*"`: every event).

        Handlers may be sync or async; they run in arrival order, one at a time. Their exceptions
        are logged. Returns a function that removes this registration.
        """
        return self._register(self._handlers.setdefault(type, []), handler)

    def on_reconnected(self, hook: Hook) -> Callable[[], None]:
        """Call `hook()` after each successful reconnect (before the replayed events are handled)."""
        return self._register(self._reconnected_hooks, hook)

    def on_disconnected(self, hook: Hook) -> Callable[[], None]:
        """Call `hook()` when the connection drops (not after `close()`)."""
        return self._register(self._disconnected_hooks, hook)

    @staticmethod
    def _register(bucket: list[_Registration],
                  fn: Callable[..., Awaitable[None] | None]) -> Callable[[], None]:
        registration = _Registration(fn)
        bucket.append(registration)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                bucket.remove(registration)

        return remove

    # ------------------------------------------------------------------------------------- subscriptions

    async def subscribe(self, session_id: str) -> None:
        """Follow a session's events (also done automatically for `__subscriptions`).

        If events of the session were seen before, the frame carries `afterSeq` so nothing is missed.
        Survives reconnects. A no-op if already subscribed on the current connection.
        """
        if self._closed:
            raise ClientClosed("client is closed")
        self._subscribed.setdefault(session_id, None)
        ws = self._ws
        if self._ready and ws is not None and session_id not in self._sent_subscribe:
            with contextlib.suppress(ConnectionClosed):  # re-sent after the reconnect
                await self._send_subscribe(ws, session_id)

    async def _send_subscribe(self, ws: ClientConnection, session_id: str) -> None:
        frame: dict[str, Any] = {"type": "subscribe", "sessionId": session_id}
        last = self._last_seq.get(session_id)
        if last is not None:
            frame["afterSeq"] = last
        self._sent_subscribe.add(session_id)
        try:
            await ws.send(_encode(frame))
        except BaseException:
            self._sent_subscribe.discard(session_id)
            raise

    async def _resubscribe(self, ws: ClientConnection) -> None:
        """Send `subscribe` (with `afterSeq`) for every followed session on a fresh connection."""
        self._sent_subscribe = set()
        while True:
            todo = [s for s in self._subscribed if s not in self._sent_subscribe]
            if not todo:
                return
            for session_id in todo:
                await self._send_subscribe(ws, session_id)

    # ------------------------------------------------------------------------------------- send_message

    async def send_message(
        self,
        image_id: str,
        content: str | list[dict[str, Any]],
        *,
        session_id: str | None = None,
        wait: bool = True,
        timeout: float | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> TurnResult:
        """Send a user message to an image and (by default) wait for the end of its turn.

        `session_id` picks one of the image's sessions (None: its primary session). Only the events
        of the turn's session are collected (see the module docstring), so turns on several sessions
        of one image may run at once.
        Collects the turn's `text_delta` text until `conversation_end` or `error_occurred`, plus the
        `turn_response` data. A queued message (`conversation_queued`) is followed correctly: the
        turn that was running when it was sent is skipped. `on_event` is called synchronously for
        the `conversation_queued` event and for each event of the turn, in order; keep it quick.
        `timeout` bounds the whole turn (None: no limit); the send itself uses the request timeout.
        The turn survives reconnects (missed events are replayed).

        Raises `RequestFailed` if the server rejects the message, `RequestTimeout`, `ConnectionLost`.
        """
        collector = _TurnCollector(self, image_id, session_id, on_event, self.turn_response_grace)
        bucket = self._collectors.setdefault(image_id, [])
        bucket.append(collector)
        payload: dict[str, Any] = {"imageId": image_id, "content": content}
        if session_id is not None:
            payload["sessionId"] = session_id
        try:
            response = await self._request("message_send", payload, limit=None, on_response=collector.on_response)
            data = _data(response)
            if data.get("error"):
                raise RequestFailed(str(data["error"]), response)
            agent_id = _str_field(data, "agentId")
            if wait:
                try:
                    async with asyncio.timeout(timeout):
                        await collector.done
                except TimeoutError as exc:
                    if isinstance(exc, ClientError):
                        raise
                    where = image_id if collector.session_id is None else f"{image_id}/{collector.session_id}"
                    raise RequestTimeout(f"turn on {where} did not end within {timeout:g}s") from None
            return collector.result(agent_id)
        finally:
            collector.fail(ConnectionLost("turn abandoned"))
            if collector.done.done() and not collector.done.cancelled():
                collector.done.exception()  # mark retrieved
            with contextlib.suppress(ValueError):
                bucket.remove(collector)
            if not bucket:
                self._collectors.pop(image_id, None)

    async def messages(self, image_id: str, *, session_id: str | None = None) -> list[dict[str, Any]]:
        """The message history of an image's session (None: its primary session).

        Sends `image_messages_request` (with `sessionId` when given) and returns `data["messages"]`.
        Raises `RequestFailed` if the server refuses, `RequestTimeout`, `ConnectionLost`.
        """
        payload: dict[str, Any] = {"imageId": image_id}
        if session_id is not None:
            payload["sessionId"] = session_id
        response = await self.request_ok("image_messages", payload)
        messages = _data(response).get("messages")
        return list(messages) if isinstance(messages, list) else []

    # ------------------------------------------------------------------------------------- connection

    async def _open(self) -> ClientConnection:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        try:
            return await ws_connect(
                _with_query(self.url, _BATCH_QUERY) if self._batch_frames else self.url,
                additional_headers=headers,
                open_timeout=self._connect_timeout,
                ping_interval=_PING_INTERVAL_S,
                ping_timeout=_PING_TIMEOUT_S,
                close_timeout=_CLOSE_TIMEOUT_S,
                max_size=_MAX_MESSAGE_BYTES,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            why = _error_message(exc.response.body)
            raise ConnectError(f"{self.url} refused the connection (HTTP {status})" + (f": {why}" if why else ""),
                               status=status) from exc
        except TimeoutError as exc:
            raise ConnectError(f"cannot connect to {self.url}: timed out after {self._connect_timeout:g}s") \
                from exc
        except (OSError, WebSocketException) as exc:
            raise ConnectError(f"cannot connect to {self.url}: {str(exc) or type(exc).__name__}") from exc

    async def _run(self, ws: ClientConnection) -> None:
        try:
            await self._supervise(ws)
        except Exception as exc:  # a bug must not leave requests waiting on a dead task
            logger.exception("the connection task failed")
            self._give_up(ConnectionLost(f"connection task failed: {exc!r}"))
            ws_now, self._ws = self._ws, None
            if ws_now is not None:
                await ws_now.close()

    async def _supervise(self, ws: ClientConnection) -> None:
        """Receive on `ws`; when it drops, reconnect and carry on, until closed."""
        current: ClientConnection | None = ws
        while current is not None:
            reason = await self._receive(current)
            self._connection_dropped(current, reason)
            if self._closed:
                return
            if isinstance(reason, ConnectionRefused):  # refused again on a reconnect: say why, once
                self._give_up(reason)
                return
            if not self._reconnect:
                self._give_up(ConnectionLost(f"connection to {self.url} lost ({reason})"))
                return
            logger.info("connection to %s lost (%s); reconnecting", self.url, reason)
            self._enqueue_hooks(self._disconnected_hooks, "disconnected hook")
            current = await self._reconnect_loop()
            if current is not None:
                self._enqueue_hooks(self._reconnected_hooks, "reconnected hook")

    async def _receive(self, ws: ClientConnection) -> str | ConnectionRefused:
        """Handle `ws`'s frames until it closes; then why it closed (a refusal: the server's reason)."""
        code: int | None = None
        reason = "closed by server"
        try:
            async for raw in ws:
                try:
                    await self._handle_frame(ws, raw)
                except ConnectionClosed:
                    raise
                except Exception:
                    logger.exception("error while handling a frame")
        except ConnectionClosed as exc:
            if exc.rcvd is None:
                reason = "no close frame"
            else:
                code = exc.rcvd.code
                reason = f"code {code}: {exc.rcvd.reason}" if exc.rcvd.reason else f"code {code}"
                refused = _refusal(exc)
                if refused is not None:
                    self._refusals.setdefault(ws, refused.reason)
        refusal = self._refusals.pop(ws, None)
        if refusal is not None:
            return ConnectionRefused(refusal, code=code or _POLICY_VIOLATION)
        return reason

    def _connection_dropped(self, ws: ClientConnection, reason: str | ConnectionRefused) -> None:
        if self._ws is ws:
            self._ws = None
        self._set_ready(False)
        lost = reason if isinstance(reason, ConnectionRefused) else \
            ConnectionLost(f"connection lost before the response arrived ({reason})")
        for request_id, pending in list(self._pending.items()):
            if pending.ws is ws:
                del self._pending[request_id]
                if not pending.future.done():
                    pending.future.set_exception(lost)

    async def _reconnect_loop(self) -> ClientConnection | None:
        attempt = 0
        while not self._closed:
            ceiling = min(self._max_reconnect_delay, self._min_reconnect_delay * (2 ** min(attempt, 30)))
            await asyncio.sleep(random.uniform(ceiling / 2, ceiling))
            attempt += 1
            try:
                ws = await self._open()
            except ConnectError as exc:
                if exc.status in _AUTH_REJECTED:
                    self._give_up(ConnectionLost(f"reconnect refused: {exc}"))
                    return None
                logger.info("reconnect attempt %d failed: %s", attempt, exc)
                continue
            if self._closed:
                await ws.close()
                return None
            self._ws = ws
            try:
                await self._resubscribe(ws)
            except ConnectionClosed as exc:
                self._ws = None
                refused = _refusal(exc)
                if refused is not None:  # the upgrade was accepted, then closed 1008: the key is refused
                    self._give_up(refused)
                    return None
                continue
            self._set_ready(True)
            logger.info("reconnected to %s after %d attempt(s)", self.url, attempt)
            return ws
        return None

    def _give_up(self, exc: ClientError) -> None:
        self._dead = exc
        self._fail_pending(exc)
        self._fail_collectors(exc)
        self._notify_state()

    def _set_ready(self, ready: bool) -> None:
        self._ready = ready
        if ready:
            self._notify_state()

    def _notify_state(self) -> None:
        for waiter in self._state_waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _fail_pending(self, exc: ClientError) -> None:
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            if not entry.future.done():
                entry.future.set_exception(exc)

    def _fail_collectors(self, exc: ClientError) -> None:
        for bucket in self._collectors.values():
            for collector in bucket:
                collector.fail(exc)

    # ------------------------------------------------------------------------------------- inbound

    async def _handle_frame(self, ws: ClientConnection, raw: str | bytes) -> None:
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            logger.debug("ignoring a frame that is not JSON")
            return
        if isinstance(message, list):  # a batched frame: its events in order
            for item in message:
                if isinstance(item, dict):
                    await self._handle_message(ws, item)
            return
        if isinstance(message, dict):
            await self._handle_message(ws, message)

    async def _handle_message(self, ws: ClientConnection, message: dict[str, Any]) -> None:
        if "__msgId" in message and "__payload" in message:
            await ws.send(_encode({"__ack": message["__msgId"]}))  # ACK first, like the stock client
            payload = message["__payload"]
            if not isinstance(payload, str):
                logger.debug("ignoring a wrapper whose __payload is not a string")
                return
            try:
                message = orjson.loads(payload)
            except orjson.JSONDecodeError:
                logger.debug("ignoring a wrapper whose __payload is not JSON")
                return
            if not isinstance(message, dict):
                return
        if isinstance(message.get("type"), str):
            await self._handle_event(ws, message)

    async def _handle_event(self, ws: ClientConnection, event: Event) -> None:
        data = event.get("data")
        if event["type"] == "system_error" and isinstance(data, dict) and data.get("code") == "unauthorized":
            # the cloud's refusal: API Gateway cannot send a close code of AgentVM's, so the reason
            # comes first as this frame, then the connection is closed
            self._refusals[ws] = str(data.get("message") or "unauthorized")
        session_id = _context_str(event, "sessionId")
        seq = event.get("seq")
        if session_id is not None and isinstance(seq, int) and not isinstance(seq, bool):
            self._server_has_seq = True
            last = self._last_seq.get(session_id)
            if last is not None and seq <= last:
                logger.debug("dropping duplicate %s seq %d of %s", event["type"], seq, session_id)
                return
            self._last_seq[session_id] = seq
            self._subscribed.setdefault(session_id, None)  # the server delivers it: follow it

        stand_in = _stand_in(event)
        if stand_in is not None:  # resolved here, in the receive loop: no later event can overtake it
            event = await self._resolve(event) if stand_in == "ref" else _unavailable(
                event, f"it was too large ({_data(event).get('bytes')} bytes) and the server truncated it")

        data = _data(event)
        if event.get("category") == "response":
            request_id = data.get("requestId")
            pending = self._pending.pop(request_id, None) if isinstance(request_id, str) else None
            if pending is not None and not pending.future.done():
                try:  # subscribe before request() returns, like the stock client
                    await self._subscribe_listed(ws, data.get("__subscriptions"))
                finally:  # even if the socket dropped meanwhile: the subscriptions are re-sent
                    if pending.on_response is not None:
                        pending.on_response(event)
                    if not pending.future.done():
                        pending.future.set_result(event)
                return

        if event["type"] == "system_error":
            # The error response of our own request follows; its caller sees it there.
            ours = data.get("requestId") in self._pending
            logger.log(logging.DEBUG if ours else logging.WARNING, "server error: %s", data.get("message"))

        image_id = _context_str(event, "imageId")
        if image_id is not None and session_id is not None:
            tracker = self._trackers.get(session_id)
            if tracker is None:
                tracker = self._trackers[session_id] = _TurnTracker(image_id)
            info = tracker.observe(event)
            for collector in list(self._collectors.get(image_id, ())):
                collector.observe(event, info, session_id)

        self._dispatch_queue.put_nowait(lambda: self._deliver(event))

    async def _resolve(self, event: Event) -> Event:
        """The event a reference stands for, or the error that takes its place."""
        try:
            return await _fetch_referenced(event, self._ref_http)
        except _Unavailable as exc:  # the caller sees it (a failed response or a system_error)
            logger.info("cannot resolve the %s event sent by reference: %s", event["type"], exc)
            return _unavailable(event, f"fetching the copy the server sent by reference failed ({exc})")

    def _ref_http(self) -> httpx.AsyncClient:
        if self._http is None:
            import httpx

            self._http = httpx.AsyncClient(timeout=_REF_TIMEOUT_S)
        return self._http

    async def _subscribe_listed(self, ws: ClientConnection, sessions: Any) -> None:
        if not isinstance(sessions, list):
            return
        for session_id in sessions:
            if isinstance(session_id, str) and session_id:
                self._subscribed.setdefault(session_id, None)
                if session_id not in self._sent_subscribe:
                    await self._send_subscribe(ws, session_id)

    # ------------------------------------------------------------------------------------- dispatch

    def _enqueue_hooks(self, hooks: list[_Registration], what: str) -> None:
        async def run() -> None:
            for registration in list(hooks):
                await _call(registration.handler, what=what)

        if hooks:
            self._dispatch_queue.put_nowait(run)

    async def _deliver(self, event: Event) -> None:
        registrations = [*self._handlers.get(event["type"], ()), *self._handlers.get("*", ())]
        for registration in registrations:
            await _call(registration.handler, event, what=f"handler for {event['type']}")

    async def _dispatch_loop(self) -> None:
        while True:
            item = await self._dispatch_queue.get()
            if item is None:
                return
            await item()
