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
import hashlib
import inspect
import logging
import random
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import orjson
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

if TYPE_CHECKING:
    import httpx

__all__ = [
    "AgentVMClient",
    "ClientClosed",
    "ClientError",
    "ConnectError",
    "ConnectionLost",
    "Event",
    "EventHandler",
    "Hook",
    "RequestFailed",
    "RequestTimeout",
    "TurnResult",
]

logger = logging.getLogger(__name__)

Event = dict[str, Any]
EventHandler = Callable[[Event], Awaitable[None] | None]
Hook = Callable[[], Awaitable[None] | None]

_MAX_MESSAGE_BYTES = 100 * 1024 * 1024  # the reference `ws` default (spec §1.2)
_PING_INTERVAL_S = 20.0
_PING_TIMEOUT_S = 20.0
_CLOSE_TIMEOUT_S = 2.0
_DRAIN_TIMEOUT_S = 2.0  # how long close() lets handlers finish events already received
_MIN_BACKOFF_S = 0.01  # never retry in a tight loop
_AUTH_REJECTED = frozenset({401, 403})
_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
# Fetching an event sent by reference: the receive loop waits for it (events stay in order), so this
# stays well below the ping timeout.
_REF_TIMEOUT_S = 10.0
_REF_KEYS = frozenset({"__ref", "requestId"})
_TRUNCATED_KEYS = frozenset({"__truncated", "bytes", "requestId"})
_HEX = frozenset("0123456789abcdef")
# Session events that do not show that a turn is under way.
_NOT_TURN_ACTIVITY = frozenset({"conversation_queued", "turn_response", "message_persisted", "user_message"})


# --------------------------------------------------------------------------------------------- errors


class ClientError(Exception):
    """Base of every error raised by `AgentVMClient`."""


class ConnectError(ClientError):
    """The server could not be reached, or it refused the WebSocket upgrade."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ConnectionLost(ClientError):
    """There is no usable connection, or it dropped before the answer arrived.

    A request that fails this way may or may not have reached the server; it is not resent.
    """


class ClientClosed(ConnectionLost):
    """`close()` was called."""


class RequestTimeout(ClientError, asyncio.TimeoutError):
    """No response (or, for `send_message`, no end of turn) within the timeout."""


class RequestFailed(ClientError):
    """The server answered with `data.error` set."""

    def __init__(self, message: str, response: Event) -> None:
        super().__init__(message)
        self.response = response


# --------------------------------------------------------------------------------------------- results


@dataclass(slots=True)
class TurnResult:
    """What `send_message` observed of one turn.

    `text` joins the text of the turn's LLM messages, separated by a blank line. `reason` is the
    `conversation_end` reason, `"error"` when `error_occurred` ended the turn, or None when the
    call did not wait. `turn` is the `turn_response` data (usage, cost, model, …) if it arrived.
    `session_id` is the session of the turn: the one asked for, else the one the server named in its
    response, else the one seen on the turn's events (None if none was seen).
    """

    image_id: str
    agent_id: str | None = None
    text: str = ""
    reason: str | None = None
    error: str | None = None
    error_code: str | None = None
    turn: dict[str, Any] | None = None
    queued: bool = False
    message_id: str | None = None
    session_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


# --------------------------------------------------------------------------------------------- helpers


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _request_id() -> str:
    return f"req_{_now_ms()}_" + "".join(secrets.choice(_ALPHABET) for _ in range(6))


def _data(event: Event) -> dict[str, Any]:
    data = event.get("data")
    return data if isinstance(data, dict) else {}


def _context_str(event: Event, key: str) -> str | None:
    ctx = event.get("context")
    if isinstance(ctx, dict):
        value = ctx.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _str_field(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


def _encode(obj: Any) -> str:
    return orjson.dumps(obj).decode()


class _Unavailable(Exception):
    """An event sent by reference could not be fetched, or failed its checks."""


def _stand_in(event: Event) -> str | None:
    """Whether `event` only stands for the real one: "ref" (sent by reference), "truncated", or None."""
    data = event.get("data")
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("__ref"), dict) and data.keys() <= _REF_KEYS:
        return "ref"
    if data.get("__truncated") is True and data.keys() <= _TRUNCATED_KEYS:
        return "truncated"
    return None


def _unavailable(event: Event, reason: str) -> Event:
    """What the caller gets for an event it cannot have: the response with `data.error` (so the request
    fails like any refused request), or a `system_error` in place of any other event."""
    request_id = _data(event).get("requestId")
    seq = event.get("seq")
    what = f"{event['type']} event" + (f" (seq {seq})" if isinstance(seq, int) else "")
    message = f"Cannot deliver the {what}: {reason}"
    if event.get("category") == "response":
        data: dict[str, Any] = {"error": message, "errorCode": "frame_unavailable"}
        if isinstance(request_id, str):
            data["requestId"] = request_id
        return {**event, "data": data}
    error: Event = {"type": "system_error", "timestamp": event.get("timestamp", _now_ms()), "source": "command",
                    "category": "error", "intent": "notification",
                    "data": {"message": message, "code": "frame_unavailable", "severity": "error",
                             "eventType": event["type"]}}
    if isinstance(request_id, str):
        error["data"]["requestId"] = request_id
    if isinstance(event.get("context"), dict):
        error["context"] = event["context"]
    return error


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


@dataclass(frozen=True, slots=True)
class _TurnInfo:
    ended: bool = False
    next_message_id: str | None = None


_NO_TURN_INFO = _TurnInfo()


class _TurnTracker:
    """Follows one session's turns from its event stream: where each ends, which queued message is next.

    A turn ends with `conversation_end` or `error_occurred`. If a server sends both for one failed
    turn (`error_occurred` and `conversation_end{reason:"error"}`, in either order, with no turn
    activity between them) they count as one end.
    """

    __slots__ = ("_last_end", "_queue", "image_id")

    def __init__(self, image_id: str | None = None) -> None:
        self.image_id = image_id  # the image the session belongs to
        self._queue: deque[str] = deque()
        self._last_end: str | None = None  # an error-kind end with no activity since

    def observe(self, event: Event) -> _TurnInfo:
        kind = event["type"]
        data = _data(event)
        if kind == "conversation_queued":
            message_id = _str_field(data, "messageId")
            if message_id is not None:
                self._queue.append(message_id)
            return _NO_TURN_INFO
        if kind in ("error_occurred", "conversation_end"):
            is_error = kind == "error_occurred" or data.get("reason") == "error"
            if is_error and self._last_end is not None and self._last_end != kind:
                self._last_end = None  # second half of one failed turn
                return _NO_TURN_INFO
            self._last_end = kind if is_error else None
            return _TurnInfo(ended=True, next_message_id=self._queue.popleft() if self._queue else None)
        if kind not in _NOT_TURN_ACTIVITY:
            self._last_end = None
        return _NO_TURN_INFO

    def is_queued(self, message_id: str) -> bool:
        return message_id in self._queue


class _TurnCollector:
    """Collects one `send_message` turn. Fed synchronously, in arrival order, from the receive loop.

    It sees every session event of its image and keeps those of its session: `session_id`, given by
    the caller or taken from the response; while unknown (a server that does not name it), any
    session's, until one is identified (the queue holding our message, or the turn's first event).

    Before the response only `conversation_queued` matters: the last one of our session is ours
    (queued messages are announced before the response, spec §3.9 rule 4), so the last one of each
    session is kept until the response says which session is ours. After the response the turn is
    ours at once, or, when queued, from the end of the turn that pops our message.
    """

    def __init__(self, client: AgentVMClient, image_id: str, session_id: str | None,
                 on_event: Callable[[Event], None] | None, grace: float) -> None:
        self._client = client
        self.image_id = image_id
        self.session_id = session_id
        self._on_event = on_event
        self._grace = grace
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.state = "sent"  # sent → (waiting) → running → grace → ended
        self.queued_events: dict[str, Event] = {}  # the last `conversation_queued` per session, before the response
        self.last_queued: Event | None = None  # the last one of any session
        self.message_id: str | None = None
        self.queued = False
        self.active = False
        self.parts: list[str] = []
        self.llm_message_ids: set[str] = set()
        self.reason: str | None = None
        self.error: str | None = None
        self.error_code: str | None = None
        self.turn: dict[str, Any] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # called from the receive loop -------------------------------------------------------------------

    def on_response(self, response: Event) -> None:
        data = _data(response)
        if data.get("error"):
            self._finish()
            return
        if self.session_id is None:
            self.session_id = _str_field(data, "sessionId")
        self.message_id = _str_field(data, "messageId")
        queued = self.last_queued if self.session_id is None else self.queued_events.get(self.session_id)
        self.queued_events, self.last_queued = {}, None
        if queued is not None:
            queued_id = _str_field(_data(queued), "messageId")
            if self.message_id is None or self.message_id == queued_id:
                self.message_id = queued_id
        # Which session's queue may hold our message: ours, else the announced one's, else any of the image.
        trackers = self._client._trackers
        if self.session_id is not None:
            candidates: list[str | None] = [self.session_id]
        elif queued is not None:
            candidates = [_context_str(queued, "sessionId")]
        else:
            candidates = [s for s, t in trackers.items() if t.image_id == self.image_id]
        for session_id in candidates:
            tracker = trackers.get(session_id) if session_id is not None else None
            if self.message_id is not None and tracker is not None and tracker.is_queued(self.message_id):
                self.session_id = session_id
                self.queued = True
                self.state = "waiting"
                if queued is not None:
                    self._emit(queued)
                return
        self.state = "running"

    def observe(self, event: Event, info: _TurnInfo, session_id: str) -> None:
        """`event` is a session event of this image; `info` what the session's tracker made of it."""
        kind = event["type"]
        if self.state == "sent":
            if kind == "conversation_queued":
                self.queued_events[session_id] = event
                self.last_queued = event
        elif self.session_id is not None and session_id != self.session_id:
            return  # another session of the image
        elif self.state == "waiting":
            if info.ended and info.next_message_id == self.message_id:
                self.state = "running"
        elif self.state == "running":
            self._observe_running(event, kind, info, session_id)
        elif self.state == "grace" and kind == "turn_response" and self._is_ours(event):
            self.turn = _data(event)
            self._emit(event)
            self._finish()

    def _observe_running(self, event: Event, kind: str, info: _TurnInfo, session_id: str) -> None:
        if kind in ("conversation_queued", "message_persisted", "user_message"):
            return  # about other messages (sent behind ours, or from another device)
        if kind == "turn_response":
            if self.active and self._is_ours(event):
                self.turn = _data(event)
                self._emit(event)
            return
        if kind not in _NOT_TURN_ACTIVITY:
            self.active = True
            if self.session_id is None:
                self.session_id = session_id  # the turn's first event: from now on, only this session
        data = _data(event)
        if kind == "message_start":
            llm_message_id = _str_field(data, "messageId")
            if llm_message_id is not None:
                self.llm_message_ids.add(llm_message_id)
        if kind == "message_start" or (kind == "text_delta" and not self.parts):
            self.parts.append("")
        if kind == "text_delta":
            text = data.get("text")
            if isinstance(text, str):
                self.parts[-1] += text
        elif kind == "error_occurred":
            self.error = _str_field(data, "message") or "unknown error"
            self.error_code = _str_field(data, "code")
        self._emit(event)
        if info.ended:
            self.reason = "error" if kind == "error_occurred" else (_str_field(data, "reason") or "completed")
            if self.turn is None and self._client._server_has_seq and self._grace > 0:
                # AgentVM ends each turn with turn_response; give it a moment to arrive.
                self.state = "grace"
                self._timer = asyncio.get_running_loop().call_later(self._grace, self._finish)
            else:
                self._finish()

    def _is_ours(self, event: Event) -> bool:
        """Whether a `turn_response` is this turn's. Its `messageId` names an LLM message of the turn
        (AgentVM) or, in other servers, possibly the user message; without one we cannot tell."""
        theirs = _str_field(_data(event), "messageId")
        return (theirs is None or not self.llm_message_ids or theirs in self.llm_message_ids
                or theirs == self.message_id)

    def _emit(self, event: Event) -> None:
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:
                logger.exception("send_message on_event callback raised")

    def _finish(self) -> None:
        self.state = "ended"
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.done.done():
            self.done.set_result(None)

    def fail(self, exc: BaseException) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.done.done():
            self.done.set_exception(exc)

    def result(self, agent_id: str | None) -> TurnResult:
        return TurnResult(
            image_id=self.image_id,
            agent_id=agent_id,
            text="\n\n".join(p for p in self.parts if p),
            reason=self.reason,
            error=self.error,
            error_code=self.error_code,
            turn=self.turn,
            queued=self.queued,
            message_id=self.message_id,
            session_id=self.session_id,
        )


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
    ) -> None:
        """`http_client` fetches events the server sends by reference (cloud only); by default one is
        created on first use and closed by `close()`."""
        self.url = url
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
        """Open the connection. Raises `ConnectError` if the server cannot be reached (no retry)."""
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
                    raise ConnectionLost(f"connection lost while sending {request_type}") from exc
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
                self.url,
                additional_headers=headers,
                open_timeout=self._connect_timeout,
                ping_interval=_PING_INTERVAL_S,
                ping_timeout=_PING_TIMEOUT_S,
                close_timeout=_CLOSE_TIMEOUT_S,
                max_size=_MAX_MESSAGE_BYTES,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            raise ConnectError(f"{self.url} refused the connection (HTTP {status})", status=status) from exc
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
            if not self._reconnect:
                self._give_up(ConnectionLost(f"connection to {self.url} lost ({reason})"))
                return
            logger.info("connection to %s lost (%s); reconnecting", self.url, reason)
            self._enqueue_hooks(self._disconnected_hooks, "disconnected hook")
            current = await self._reconnect_loop()
            if current is not None:
                self._enqueue_hooks(self._reconnected_hooks, "reconnected hook")

    async def _receive(self, ws: ClientConnection) -> str:
        try:
            async for raw in ws:
                try:
                    await self._handle_frame(ws, raw)
                except ConnectionClosed:
                    raise
                except Exception:
                    logger.exception("error while handling a frame")
        except ConnectionClosed as exc:
            return f"code {exc.rcvd.code}" if exc.rcvd is not None else "no close frame"
        return "closed by server"

    def _connection_dropped(self, ws: ClientConnection, reason: str) -> None:
        if self._ws is ws:
            self._ws = None
        self._set_ready(False)
        lost = ConnectionLost(f"connection lost before the response arrived ({reason})")
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
            except ConnectionClosed:
                self._ws = None
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
        if not isinstance(message, dict):
            return
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
            return await self._fetch_referenced(event)
        except _Unavailable as exc:  # the caller sees it (a failed response or a system_error)
            logger.info("cannot resolve the %s event sent by reference: %s", event["type"], exc)
            return _unavailable(event, f"fetching the copy the server sent by reference failed ({exc})")

    async def _fetch_referenced(self, event: Event) -> Event:
        import httpx

        ref = _data(event)["__ref"]
        url, size, digest = ref.get("url"), ref.get("bytes"), ref.get("sha256")
        if (not isinstance(url, str) or not url.startswith(("https://", "http://"))
                or not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= _MAX_MESSAGE_BYTES
                or not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX):
            raise _Unavailable("malformed reference")
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=_REF_TIMEOUT_S)
        body = bytearray()
        try:  # the URL is a credential for a while: it appears in no message
            async with asyncio.timeout(_REF_TIMEOUT_S), self._http.stream("GET", url) as resp:
                if resp.status_code != 200:
                    raise _Unavailable(f"HTTP {resp.status_code}")
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > size:
                        raise _Unavailable(f"more than the announced {size} bytes")
        except TimeoutError:
            raise _Unavailable(f"no answer within {_REF_TIMEOUT_S:g}s") from None
        except httpx.HTTPError as exc:
            raise _Unavailable(f"{type(exc).__name__} while fetching it") from None
        if len(body) != size:
            raise _Unavailable(f"{len(body)} bytes instead of the announced {size}")
        if hashlib.sha256(body).hexdigest() != digest:
            raise _Unavailable("its sha256 does not match")
        try:
            original = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise _Unavailable("it is not JSON") from None
        if not isinstance(original, dict) or original.get("type") != event["type"]:
            raise _Unavailable("it is not the announced event")
        return original

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
