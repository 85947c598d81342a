"""API Gateway's WebSocket edge and the Lambda service, emulated in front of the real handler modules.

A client (the stock AgentX client, `StockClient`, `AgentVMClient`) connects to a real local WebSocket
URL; everything behind it is the cloud code path:

* every upgrade becomes a `$connect` event for `functions/ws_connect/handler.py`; a status other
  than 200 refuses the upgrade with that HTTP status, as API Gateway does;
* every inbound message becomes a `$default` MESSAGE event (binary ones base64-encoded), each its
  own invocation, run concurrently: API Gateway does not serialise one connection's frames;
* a closed socket becomes a `$disconnect` event (`disconnectStatusCode`, `disconnectReason`);
* outbound frames are what the handlers post with botocore's `apigatewaymanagementapi` to moto:
  they are read back from moto's management-API backend and written to the socket in the order
  they were posted. Posting to a connection that is not open (not yet accepted, closed, deleted)
  fails with `GoneException` (410) as on AWS; moto alone would accept it;
* the Lambda Invoke API (`POST /2015-03-31/functions/{name}/invocations`) is served by the edge's
  own HTTP server: `ws_default` starts `chat_turn` with an asynchronous invoke, answered 202 at once
  and run in a warm environment;
* an asynchronous invocation that fails (the handler raised, timed out, or its process died) goes to
  the function's OnFailure destination (`destinations`, as template.yaml wires them: `chat_turn` →
  `turn_failed`), invoked asynchronously with the invocation record Lambda sends
  (`requestContext.condition`, `requestPayload`, `responseContext`, `responsePayload`); the failure
  is still recorded in `errors`;
* handlers run in warm execution environments, one thread each, one invocation at a time; a
  function named in `processes` runs in child processes instead, set up as Lambda sets one up (its
  folder first on `sys.path`, only the environment variables given), so that its memory and CPU
  can be measured (`tests/support/lambda_process.py`).
  `agentvm.cloud.runtime` keeps one runtime and one event loop per thread, so a thread is an
  environment; `restart()` retires them all (a new deployment: new runtimes, cold caches) while
  the table and the open WebSocket connections stay.

API Gateway's own limits that clients can observe are emulated: messages above 128 KB close the
connection with 1009, posts above 128 KB fail with `PayloadTooLargeException` (413), a failing
`$default` invocation makes API Gateway send `{"message": "Internal server error", ...}`.
A handler exception is never swallowed: it is recorded in `errors` and fails the test when the
edge stops (`cloud_edge` raises `HandlerFailed` with every traceback).

The moto server must run in this process (`tests/aws_fixtures.py` `moto_endpoint`): the edge
checks that at start by posting a probe frame and reading it back from the backend.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import importlib.util
import itertools
import json
import logging
import queue
import secrets
import string
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Final
from urllib.parse import parse_qsl, quote, unquote

import uvicorn
from moto.apigatewaymanagementapi.models import ApiGatewayManagementApiBackend, apigatewaymanagementapi_backends
from moto.core.exceptions import JsonRESTError
from moto.core.models import DEFAULT_ACCOUNT_ID
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.support import aws_calls
from tests.support.lambda_process import ProcessEnvironments
from tests.support.servers import free_port

log = logging.getLogger(__name__)

REPO: Final = Path(__file__).resolve().parents[2]
FUNCTIONS: Final = REPO / "functions"
REGION: Final = "us-east-1"

#: API Gateway refuses WebSocket messages above 128 KB (the connection is closed with 1009) and
#: `post_to_connection` payloads above 128 KB (PayloadTooLargeException).
MAX_MESSAGE_BYTES: Final = 128 * 1024

#: Route key → handler module, as template.yaml wires them.
DEFAULT_ROUTES: Final[Mapping[str, Path]] = {
    "$connect": FUNCTIONS / "ws_connect" / "handler.py",
    "$default": FUNCTIONS / "ws_default" / "handler.py",
    "$disconnect": FUNCTIONS / "ws_disconnect" / "handler.py",
}
#: Lambda function name (without alias or ARN) → handler module, for the Invoke API.
DEFAULT_FUNCTIONS: Final[Mapping[str, Path]] = {
    "agentvm-chat-turn": FUNCTIONS / "chat_turn" / "handler.py",
    "agentvm-turn-failed": FUNCTIONS / "turn_failed" / "handler.py",
}
#: Function label → the function name of its OnFailure destination (async invokes), as template.yaml wires them.
DEFAULT_DESTINATIONS: Final[Mapping[str, str]] = {"chat_turn": "agentvm-turn-failed"}
#: Function timeouts of template.yaml (seconds); anything else gets the global 10 s.
TIMEOUTS: Final[Mapping[str, float]] = {"ws_default": 28, "chat_turn": 900}
#: API Gateway gives up on a route integration after 29 s.
INTEGRATION_TIMEOUT_S: Final = 29.0

_ALNUM = string.ascii_letters + string.digits


def aws_id() -> str:
    """An id shaped like API Gateway's connection and request ids: 15 base64 characters and `=`."""
    return "".join(secrets.choice(_ALNUM) for _ in range(15)) + "="


def function_label(path: Path) -> str:
    """`functions/chat_turn/handler.py` → `chat_turn`; a throwaway `echo.py` → `echo`."""
    return path.parent.name if path.name == "handler.py" else path.stem


class HandlerFailed(AssertionError):
    """Handlers raised (or misbehaved) while the edge ran; the message holds every traceback."""


@dataclass(frozen=True)
class HandlerError:
    function: str
    event: Any
    error: str  # the traceback, or what was wrong with the response

    def __str__(self) -> str:
        return f"--- {self.function} ({_summary(self.event)}):\n{self.error}"


def _summary(event: Any) -> str:
    if isinstance(event, dict):
        ctx = event.get("requestContext")
        if isinstance(ctx, dict):
            body = event.get("body")
            text = f" body={body[:200]!r}" if isinstance(body, str) else ""
            return f"{ctx.get('routeKey')} connection={ctx.get('connectionId')}{text}"
        return json.dumps(event)[:300]
    return repr(event)[:300]


@dataclass
class LambdaContext:
    """The parts of Lambda's context object that handlers and Powertools read."""

    function_name: str
    timeout_s: float
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    function_version: str = "$LATEST"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = ""
    log_group_name: str = ""
    log_stream_name: str = ""
    _deadline: float = 0.0

    def __post_init__(self) -> None:
        self._deadline = time.monotonic() + self.timeout_s
        self.invoked_function_arn = self.invoked_function_arn or (
            f"arn:aws:lambda:{REGION}:{DEFAULT_ACCOUNT_ID}:function:{self.function_name}")
        self.log_group_name = self.log_group_name or f"/aws/lambda/{self.function_name}"
        self.log_stream_name = self.log_stream_name or f"2026/11/22/[$LATEST]{uuid.uuid4().hex}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


# ---- warm execution environments -----------------------------------------------------------------

_Job = tuple[Future[Any], Path, Any, LambdaContext]


class Environments:
    """Warm Lambda execution environments: one thread each, one invocation at a time.

    Like Lambda, a new environment starts only when every existing one is busy (up to `limit`),
    imports the handler module on its first invocation of that function, and keeps module state,
    the `agentvm.cloud.runtime` runtime and its event loop for later invocations. Between
    invocations the environment's loop does not run (Lambda freezes it). `shutdown()` lets running
    invocations finish, then each environment closes its runtime and loop on its own thread.
    (A `ThreadPoolExecutor` has no per-thread teardown, which is why this is a small pool of its own.)
    """

    _ids = itertools.count(1)

    def __init__(self, limit: int = 8, on_frozen: Callable[[str, list[str]], None] | None = None) -> None:
        self.limit = limit
        self.on_frozen = on_frozen
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._queued = 0
        self._closed = False
        self.generation = next(self._ids)
        self.started = 0  # environments started so far (cold starts)

    def submit(self, path: Path, event: Any, context: LambdaContext) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("these environments were shut down")
            self._queued += 1
            self._jobs.put((fut, path, event, context))
            if self._queued > self._idle and len(self._threads) < self.limit:
                self.started += 1
                t = threading.Thread(target=self._environment, daemon=True,
                                     name=f"lambda-env-{self.generation}.{self.started}")
                self._threads.append(t)
                t.start()
        return fut

    def shutdown(self, timeout: float = 30.0) -> list[str]:
        """Retire every environment once the queued invocations are done (blocking); returns the
        names of environments that did not finish in time."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in threads if t.is_alive()]

    def _environment(self) -> None:
        modules: dict[Path, ModuleType] = {}
        with self._lock:
            self._idle += 1
        while True:
            job = self._jobs.get()
            with self._lock:
                self._idle -= 1
                if job is not None:
                    self._queued -= 1
            if job is None:
                break
            fut, path, event, context = job
            if not fut.set_running_or_notify_cancel():
                with self._lock:
                    self._idle += 1
                continue
            result: Any = None
            error: BaseException | None = None
            try:
                module = modules.get(path)
                if module is None:
                    module = modules[path] = _load(path)
                result = module.handler(event, context)
            except BaseException as exc:
                error = exc
            frozen = _pending_tasks()
            if frozen and self.on_frozen is not None:
                self.on_frozen(function_label(path), frozen)
            with self._lock:  # available again before anyone learns that the invocation returned
                self._idle += 1
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)
        _teardown_environment()


def load_handler(function: str) -> ModuleType:
    """Import `functions/<function>/handler.py` as a fresh module."""
    return _load(FUNCTIONS / function / "handler.py")


def _load(path: Path) -> ModuleType:
    """Import a handler module for one environment (each environment has its own module state)."""
    spec = importlib.util.spec_from_file_location(f"lambda_{function_label(path)}_{uuid.uuid4().hex[:8]}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load handler module {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _record_aws_calls(module, function_label(path))
    return module


def _record_aws_calls(module: ModuleType, label: str) -> None:
    """Its AWS calls are recorded as the function's (tests/support/aws_calls.py)."""
    handler = getattr(module, "handler", None)
    if not callable(handler):
        return

    @functools.wraps(handler)
    def recorded(event: Any, context: Any) -> Any:
        with aws_calls.invoking(label):
            return handler(event, context)

    module.handler = recorded  # type: ignore[attr-defined]


def _pending_tasks() -> list[str]:
    """Tasks still pending on this environment's loop after a handler returned: Lambda freezes
    them with the environment, and they run on only if a later invocation lands here."""
    from agentvm.cloud import runtime as cloud_runtime

    loop = getattr(getattr(cloud_runtime, "_env", None), "loop", None)
    if loop is None or loop.is_closed():
        return []
    return [repr(t) for t in asyncio.all_tasks(loop) if not t.done()]


def _teardown_environment() -> None:
    """Close this environment's cloud runtime and event loop (Lambda's shutdown phase)."""
    from agentvm.cloud import runtime as cloud_runtime

    env = getattr(cloud_runtime, "_env", None)  # the runtime's environment-local state
    rt = getattr(env, "runtime", None)
    loop: asyncio.AbstractEventLoop | None = getattr(env, "loop", None)
    try:
        if loop is not None and not loop.is_closed():
            loop.run_until_complete(_close_runtime(rt))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
    except Exception:
        log.exception("environment teardown failed")
    finally:
        cloud_runtime.reset()


async def _close_runtime(rt: Any) -> None:
    current = asyncio.current_task()
    leftovers = [t for t in asyncio.all_tasks() if t is not current]
    for t in leftovers:  # work a handler left behind; Lambda would freeze and then drop it
        t.cancel()
    await asyncio.gather(*leftovers, return_exceptions=True)
    if rt is None:
        return
    close = getattr(rt, "close", None)
    if callable(close):
        await close()
        return
    for name in ("gateway", "dispatcher", "lambda_dispatcher", "turn_queue", "secrets", "blobs",
                 "store"):  # cached clients, if created
        part = rt.__dict__.get(name) if name != "store" else getattr(rt, "store", None)
        part_close = getattr(part, "close", None)
        if callable(part_close):
            await part_close()


# ---- moto's management-API backend, made to behave like API Gateway's ------------------------------

class _Gone(JsonRESTError):
    code = 410

    def __init__(self, connection_id: str) -> None:
        super().__init__("GoneException", f"Connection {connection_id} is gone")


class _PayloadTooLarge(JsonRESTError):
    code = 413

    def __init__(self, size: int) -> None:
        super().__init__("PayloadTooLargeException",
                         f"Message of {size} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")


@dataclass
class _Posted:
    """What the backend received for one connection: frame sizes, in posting order (the bytes
    themselves are the backend's `connections[id].data`, concatenated)."""

    notify: Callable[[], None]
    on_delete: Callable[[], None]
    identity: tuple[float, str, str] = (0.0, "", "")  # connectedAt (s), source IP, user agent
    open: bool = True
    key: str | None = None  # the backend's key: moto keeps the id as it appears in the URL path
    sizes: list[int] = field(default_factory=list)
    taken: int = 0  # frames already handed to the socket
    offset: int = 0  # bytes already handed to the socket


class ManagementApi:
    """Patches moto's in-process `apigatewaymanagementapi` backend while at least one edge runs:

    * posting to, getting or deleting a connection that is not open raises `GoneException` (410);
      moto's own `connections` is a defaultdict that accepts any id;
    * posts above 128 KB raise `PayloadTooLargeException` (413);
    * every accepted post is appended by moto as usual, its size recorded and the edge notified,
      so the edge reads the frame back from the backend;
    * `DeleteConnection` closes the client's socket, as on AWS.
    """

    _instances: dict[tuple[str, str], ManagementApi] = {}
    _instances_lock = threading.Lock()

    def __init__(self, backend: ApiGatewayManagementApiBackend) -> None:
        self.backend = backend
        # re-entrant: moto's post_to_connection calls get_connection, which is patched too
        self._lock = threading.RLock()
        self._conns: dict[str, _Posted] = {}
        self._users = 0

    @classmethod
    def acquire(cls, account_id: str, region: str) -> ManagementApi:
        with cls._instances_lock:
            backend = apigatewaymanagementapi_backends[account_id][region]
            api = cls._instances.get((account_id, region))
            if api is None or api.backend is not backend:  # first use, or moto was reset
                api = cls._instances[(account_id, region)] = cls(backend)
            if api._users == 0:
                api._install()
            api._users += 1
            return api

    def release(self) -> None:
        with self._instances_lock:
            self._users -= 1
            if self._users == 0:
                self._uninstall()

    def _install(self) -> None:
        b: Any = self.backend
        b.post_to_connection = self._post_to_connection
        b.get_connection = self._get_connection
        b.delete_connection = self._delete_connection

    def _uninstall(self) -> None:
        for name in ("post_to_connection", "get_connection", "delete_connection"):
            self.backend.__dict__.pop(name, None)  # back to the class's methods

    # -- called by moto's request handlers, on werkzeug threads (the URL path id is percent-encoded)

    def _post_to_connection(self, data: bytes, connection_id: str) -> None:
        cid = unquote(connection_id)
        with self._lock:
            posted = self._open(cid)
            if len(data) > MAX_MESSAGE_BYTES:
                raise _PayloadTooLarge(len(data))
            ApiGatewayManagementApiBackend.post_to_connection(self.backend, data=data, connection_id=connection_id)
            posted.key = connection_id
            posted.sizes.append(len(data))
        posted.notify()

    def _get_connection(self, connection_id: str) -> Any:
        with self._lock:
            posted = self._open(unquote(connection_id))
            conn = ApiGatewayManagementApiBackend.get_connection(self.backend, connection_id)
            posted.key = connection_id
            conn.connected_at, conn.source_ip, conn.user_agent = posted.identity
            return conn

    def _delete_connection(self, connection_id: str) -> None:
        cid = unquote(connection_id)
        with self._lock:
            posted = self._open(cid)
            posted.open = False
        posted.on_delete()

    def _open(self, cid: str) -> _Posted:
        posted = self._conns.get(cid)
        if posted is None or not posted.open:
            raise _Gone(cid)
        return posted

    # -- called by the edge

    def connect(self, cid: str, *, notify: Callable[[], None], on_delete: Callable[[], None],
                identity: tuple[float, str, str] = (0.0, "", "")) -> None:
        with self._lock:
            self._conns[cid] = _Posted(notify, on_delete, identity)

    def gone(self, cid: str) -> None:
        with self._lock:
            posted = self._conns.get(cid)
            if posted is not None:
                posted.open = False

    def is_open(self, cid: str) -> bool:
        with self._lock:
            posted = self._conns.get(cid)
            return posted is not None and posted.open

    def take(self, cid: str) -> list[bytes]:
        """Frames posted since the last call, read from the backend, in posting order."""
        with self._lock:
            posted = self._conns.get(cid)
            if posted is None or posted.taken == len(posted.sizes):
                return []
            data = self._data(posted)
            out = []
            for size in posted.sizes[posted.taken:]:
                out.append(data[posted.offset:posted.offset + size])
                posted.offset += size
            posted.taken = len(posted.sizes)
            return out

    def frames(self, cid: str) -> list[bytes]:
        """Every frame posted to the connection, read from the backend."""
        with self._lock:
            posted = self._conns.get(cid)
            if posted is None:
                return []
            data, pos, out = self._data(posted), 0, []
            for size in posted.sizes:
                out.append(data[pos:pos + size])
                pos += size
            return out

    def forget(self, cids: list[str]) -> dict[str, list[bytes]]:
        """Drop the connections from the backend and from here; returns their frames."""
        kept: dict[str, list[bytes]] = {}
        for cid in cids:
            kept[cid] = self.frames(cid)
            with self._lock:
                posted = self._conns.pop(cid, None)
                if posted is not None and posted.key is not None:
                    self.backend.connections.pop(posted.key, None)
        return kept

    def _data(self, posted: _Posted) -> bytes:
        if posted.key is None:
            return b""
        conn = self.backend.connections.get(posted.key)  # .get: the defaultdict must not grow
        return conn.data if conn is not None else b""


# ---- the edge ---------------------------------------------------------------------------------------

_PROBED: list[tuple[str, ApiGatewayManagementApiBackend]] = []  # moto servers known to run in-process

@dataclass
class _Connection:
    id: str
    send: Callable[[dict[str, Any]], Any]
    connected_at: int
    source_ip: str
    user_agent: str
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    edge_frames: list[str] = field(default_factory=list)  # frames API Gateway itself sends
    closing: tuple[int, str] | None = None  # set when the edge closes the socket
    closed: bool = False


_HOP_BY_HOP = frozenset({"connection", "upgrade", "host", "content-length"})
_HEADER_CASE = {"sec-websocket-key": "Sec-WebSocket-Key", "sec-websocket-version": "Sec-WebSocket-Version",
                "sec-websocket-extensions": "Sec-WebSocket-Extensions",
                "sec-websocket-protocol": "Sec-WebSocket-Protocol", "x-amzn-trace-id": "X-Amzn-Trace-Id"}


def _header_name(name: str) -> str:
    """ASGI lowercases header names; API Gateway passes the client's spelling, which for the
    usual clients is the canonical one. Handlers must read headers case-insensitively anyway."""
    return _HEADER_CASE.get(name) or "-".join(part.capitalize() for part in name.split("-"))


class CloudEdge:
    """API Gateway's WebSocket edge plus the Lambda Invoke API, in front of handler modules.

    Use `cloud_edge(...)` (or `async with edge.running():`). `url` is the WebSocket URL for clients
    (with `?token=` when a token is given); `lambda_endpoint` and `ws_endpoint` are what the handlers'
    `AVM_LAMBDA_ENDPOINT_URL` and `AVM_WS_ENDPOINT` must name (`handler_env()` lists them).
    """

    def __init__(self, *, moto_endpoint: str, token: str | None = None, table_name: str | None = None,
                 routes: Mapping[str, Path] | None = None, functions: Mapping[str, Path] | None = None,
                 environments: int = 8, stage: str = "prod", region: str = REGION,
                 account_id: str = DEFAULT_ACCOUNT_ID, path: str = "/ws",
                 drain_timeout_s: int = 20, processes: Mapping[str, Mapping[str, str]] | None = None,
                 destinations: Mapping[str, str] | None = None) -> None:
        self.moto_endpoint = moto_endpoint.rstrip("/")
        self.token = token
        self.table_name = table_name
        self.routes = dict(DEFAULT_ROUTES if routes is None else routes)
        self.functions = dict(DEFAULT_FUNCTIONS if functions is None else functions)
        #: function label → OnFailure destination (a name in `functions`; others are not delivered)
        self.destinations = {label: name for label, name in
                             (DEFAULT_DESTINATIONS if destinations is None else destinations).items()
                             if name in self.functions}
        #: the invocation records sent to OnFailure destinations, in order
        self.failure_records: list[dict[str, Any]] = []
        self.stage = stage
        self.region = region
        self.account_id = account_id
        self.path = path
        self.drain_timeout_s = drain_timeout_s
        self.api_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(10))
        self.domain_name = f"{self.api_id}.execute-api.{region}.amazonaws.com"
        self.port = free_port()
        #: every invocation, in the order they were made: (function label, event or payload)
        self.invocations: list[tuple[str, Any]] = []
        #: handler exceptions and malformed responses; non-empty fails the test when the edge stops
        self.errors: list[HandlerError] = []
        #: (function, pending tasks) whenever a handler returned with work left on its loop
        self.frozen: list[tuple[str, list[str]]] = []
        self.environments = Environments(environments, self.frozen_append)
        #: function label → its environments as child processes, started with the environment given
        #: (`processes`): run as Lambda runs them, their memory and CPU measured (lambda_process.py)
        self.processes = {label: ProcessEnvironments(env, environments) for label, env in (processes or {}).items()}
        self._retired: list[Environments] = []
        self._retiring: list[asyncio.Task[None]] = []
        self._limit = environments
        self._connections: dict[str, _Connection] = {}
        self.closed_connections: dict[str, tuple[int, str]] = {}  # id → (disconnectStatusCode, reason)
        self._tasks: set[asyncio.Task[Any]] = set()  # invocations in flight
        self._route_tasks: set[asyncio.Task[Any]] = set()  # of them, WebSocket route invocations
        self._api: ManagementApi | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._all_ids: list[str] = []
        self._final_frames: dict[str, list[bytes]] = {}
        self._sockets: set[asyncio.Task[Any]] = set()
        self._serving: asyncio.Task[None] | None = None

    # -- what tests use

    @property
    def url(self) -> str:
        base = f"ws://127.0.0.1:{self.port}{self.path}"
        return f"{base}?token={quote(self.token, safe='')}" if self.token else base

    @property
    def lambda_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_endpoint(self) -> str:
        # moto's server routes `/@connections/{id}` without a stage prefix; on AWS this is
        # https://{api}.execute-api.{region}.amazonaws.com/{stage}
        return self.moto_endpoint

    def handler_env(self) -> dict[str, str]:
        """Environment variables the handlers need to reach this edge and moto."""
        env = {"AVM_WS_ENDPOINT": self.ws_endpoint, "AVM_LAMBDA_ENDPOINT_URL": self.lambda_endpoint,
               "AVM_AWS_ENDPOINT_URL": self.moto_endpoint}
        if self.table_name:
            env["AVM_TABLE_NAME"] = self.table_name
        return env

    def connection_ids(self) -> set[str]:
        """Ids of the currently open WebSocket connections."""
        return {cid for cid, c in self._connections.items() if not c.closed}

    def frames_posted(self, connection_id: str) -> list[Any]:
        """Every frame posted to the connection, read back from moto's backend (JSON-decoded where
        possible), in posting order."""
        if connection_id in self._final_frames:
            raws = self._final_frames[connection_id]
        else:
            assert self._api is not None, f"unknown connection {connection_id}"
            raws = self._api.frames(connection_id)
        out: list[Any] = []
        for raw in raws:
            try:
                out.append(json.loads(raw))
            except ValueError:
                out.append(raw.decode("utf-8", "replace"))
        return out

    def calls(self, function: str) -> list[Any]:
        """Events or payloads of one function's invocations."""
        return [ev for fn, ev in self.invocations if fn == function]

    async def settle(self, *, include_invokes: bool = False, quiet_s: float = 0.02, timeout: float = 10.0) -> None:
        """Wait until the frames clients have sent so far are handled: no route invocation in flight
        for `quiet_s` (frames still on the wire arrive meanwhile). With `include_invokes`, also
        wait for the functions invoked through the Invoke API (a running `chat_turn`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            busy = set(self._tasks) if include_invokes else set(self._route_tasks)
            if not busy:
                await asyncio.sleep(quiet_s)
                busy = set(self._tasks) if include_invokes else set(self._route_tasks)
                if not busy:
                    return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"{len(busy)} invocation(s) still running after {timeout} s")
            await asyncio.wait(busy, timeout=remaining)

    def restart(self) -> None:
        """A new deployment: every warm environment is retired (running invocations finish first)
        and later invocations start new ones, with new runtimes. The table and the open WebSocket
        connections stay."""
        old, self.environments = self.environments, Environments(self._limit, self.frozen_append)
        self._retired.append(old)
        loop = asyncio.get_running_loop()
        self._retiring.append(loop.create_task(asyncio.to_thread(self._retire, old)))

    def vanish(self, connection_id: str) -> None:
        """The client's network path is gone: posts answer GoneException, no $disconnect is sent
        (API Gateway does not guarantee one); the client's socket stays open."""
        assert self._api is not None, "the edge is not running"
        self._api.gone(connection_id)

    def drop(self, connection_id: str, code: int = 1001, reason: str = "Going away") -> None:
        """Close a connection from the edge (API Gateway's idle timeout closes with 1001)."""
        conn = self._connections.get(connection_id)
        if conn is None or conn.closed or conn.closing is not None:
            return
        conn.closing = (code, reason)
        self._spawn(self._close_socket(conn, code, reason))

    # -- lifecycle

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[CloudEdge]:
        await self.start()
        try:
            yield self
        finally:
            await self.stop()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._api = ManagementApi.acquire(self.account_id, self.region)
        try:
            await self._probe()
            config = uvicorn.Config(self._asgi, host="127.0.0.1", port=self.port, log_config=None, lifespan="off",
                                    interface="asgi3",
                                    access_log=False, ws="websockets-sansio", ws_max_size=MAX_MESSAGE_BYTES,
                                    ws_per_message_deflate=False, ws_ping_interval=None, loop="none",
                                    timeout_graceful_shutdown=self.drain_timeout_s)
            self._server = uvicorn.Server(config)
            # the test runner keeps its own signal handlers (Ctrl+C stops pytest, not just the edge)
            self._server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
            serving = self._loop.create_task(self._server.serve())
            for _ in range(500):
                if self._server.started or serving.done():
                    break
                await asyncio.sleep(0.01)
            if serving.done():
                serving.result()
            self._serving = serving
        except BaseException:
            self._api.release()
            self._api = None
            raise

    async def stop(self) -> None:
        """Close the sockets ($disconnect runs), wait for every invocation, retire the environments."""
        assert self._api is not None
        try:
            # Clients still connected are sent away first while the Invoke API still answers, so
            # that invocations in flight (and the chat_turns they start) can finish.
            for cid in self.connection_ids():
                self.drop(cid)
            await self._drain()
            await self._stop_server()
            await self._drain()
            await asyncio.gather(*self._retiring)
            self._retired.append(self.environments)
            await asyncio.to_thread(self._retire, self.environments)
            for processes in self.processes.values():
                await asyncio.to_thread(self._retire, processes)
        finally:
            self._final_frames.update(self._api.forget(self._all_ids))
            self._api.release()
            self._api = None

    async def _stop_server(self) -> None:
        """Stop uvicorn. Every socket is closed and every invocation finished by now, so this skips
        uvicorn's graceful shutdown (a 0.1 s main-loop tick plus a 0.1 s pause, per test)."""
        server, serving = self._server, self._serving
        if server is None or serving is None or serving.done():
            return
        listeners = list(getattr(server, "servers", []))
        state = getattr(server, "server_state", None)
        if not listeners or state is None:  # another uvicorn: its own graceful shutdown
            server.should_exit = True
            await asyncio.wait_for(serving, self.drain_timeout_s + 10)
            return
        for listener in listeners:
            listener.close()
        for connection in list(state.connections):  # idle keep-alive connections of the Invoke API
            connection.shutdown()
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        for listener in listeners:
            await listener.wait_closed()

    def frozen_append(self, function: str, tasks: list[str]) -> None:
        log.warning("%s returned with %d pending task(s): Lambda freezes them", function, len(tasks))
        self.frozen.append((function, tasks))

    def check(self) -> None:
        """Raise `HandlerFailed` with every recorded handler error."""
        if self.errors:
            raise HandlerFailed(f"{len(self.errors)} handler invocation(s) failed:\n"
                                + "\n".join(str(e) for e in self.errors))

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        while (self._tasks or self._sockets) and time.monotonic() < deadline:
            await asyncio.wait(self._tasks | self._sockets, timeout=max(0.0, deadline - time.monotonic()))
        for task in list(self._tasks):
            self.errors.append(HandlerError("edge", None, f"still running when the edge stopped: {task!r}"))
            task.cancel()

    def _retire(self, envs: Environments | ProcessEnvironments) -> None:
        stuck = envs.shutdown(self.drain_timeout_s)
        for name in stuck:
            self.errors.append(HandlerError(name, None, "environment still busy when retired"))

    async def _probe(self) -> None:
        """Check that moto's backend is this process's: post a frame and read it back."""
        from agentvm.adapters.aws.botocore_async import dummy_session

        assert self._api is not None
        if (self.moto_endpoint, self._api.backend) in _PROBED:
            return
        cid = aws_id()
        self._api.connect(cid, notify=lambda: None, on_delete=lambda: None)

        def post() -> None:
            client: Any = dummy_session(self.region).create_client(
                "apigatewaymanagementapi", endpoint_url=self.ws_endpoint, region_name=self.region)
            try:
                client.post_to_connection(ConnectionId=cid, Data=b'{"probe":true}')
            finally:
                client.close()

        try:
            await asyncio.to_thread(post)
            if self._api.frames(cid) != [b'{"probe":true}']:
                raise RuntimeError(f"moto at {self.moto_endpoint} does not run in this process: the edge cannot "
                                   "read posted frames from its backend")
        finally:
            self._api.forget([cid])
        _PROBED.append((self.moto_endpoint, self._api.backend))

    # -- invocations

    def _spawn(self, coro: Any, *, route: bool = False) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if route:
            self._route_tasks.add(task)
            task.add_done_callback(self._route_tasks.discard)
        return task

    async def _invoke(self, path: Path, event: Any, context: LambdaContext | None = None) -> tuple[bool, Any]:
        """Run a handler in a warm environment. (True, result) or (False, traceback)."""
        label = function_label(path)
        self.invocations.append((label, event))
        timeout = TIMEOUTS.get(label, 10.0)
        context = context or LambdaContext(f"agentvm-{label.replace('_', '-')}", timeout)
        started = time.monotonic()
        try:
            envs = self.processes.get(label, self.environments)
            result = await asyncio.wrap_future(envs.submit(path, event, context))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            tb = "".join(traceback.format_exception(exc))
            self.errors.append(HandlerError(label, event, tb))
            return False, tb
        elapsed = time.monotonic() - started
        if elapsed > timeout:
            msg = f"Task timed out after {timeout:.2f} seconds (ran {elapsed:.2f} s)"
            self.errors.append(HandlerError(label, event, msg))
            return False, msg
        return True, result

    def _event(self, conn: _Connection, route: str, event_type: str, **extra: Any) -> dict[str, Any]:
        now = int(time.time() * 1000)
        request_id = aws_id()
        ctx: dict[str, Any] = {
            "routeKey": route, "eventType": event_type, "extendedRequestId": request_id,
            "requestTime": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now / 1000)),
            "messageDirection": "IN", "stage": self.stage, "connectedAt": conn.connected_at,
            "requestTimeEpoch": now, "identity": {"sourceIp": conn.source_ip, "userAgent": conn.user_agent},
            "requestId": request_id, "domainName": self.domain_name, "connectionId": conn.id,
            "apiId": self.api_id,
        }
        ctx.update(extra)
        return {"requestContext": ctx}

    # -- the ASGI application: WebSockets on any path, the Lambda Invoke API over HTTP

    async def _asgi(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[dict[str, Any]], Any]
                    ) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        elif scope["type"] == "http":
            response = await self._http(Request(scope, receive))
            await response(scope, receive, send)  # type: ignore[arg-type]

    async def _websocket(self, scope: dict[str, Any], receive: Callable[[], Any],
                         send: Callable[[dict[str, Any]], Any]) -> None:
        assert self._api is not None
        task = asyncio.current_task()
        assert task is not None
        self._sockets.add(task)
        try:
            await self._serve_socket(scope, receive, send)
        finally:
            self._sockets.discard(task)

    async def _serve_socket(self, scope: dict[str, Any], receive: Callable[[], Any],
                            send: Callable[[dict[str, Any]], Any]) -> None:
        assert self._api is not None
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        headers: dict[str, str] = {}
        multi: dict[str, list[str]] = {}
        for raw_name, raw_value in scope["headers"]:
            name = raw_name.decode("latin-1").lower()
            if name in _HOP_BY_HOP:
                continue
            value = raw_value.decode("latin-1")
            canonical = _header_name(name)
            headers[canonical] = value
            multi.setdefault(canonical, []).append(value)
        client_ip = (scope.get("client") or ("127.0.0.1", 0))[0]
        for name, value in (("Host", self.domain_name), ("X-Amzn-Trace-Id", f"Root=1-{uuid.uuid4().hex[:8]}-"
                                                                           f"{uuid.uuid4().hex[:24]}"),
                            ("X-Forwarded-For", client_ip), ("X-Forwarded-Port", "443"),
                            ("X-Forwarded-Proto", "https")):
            headers[name] = value
            multi[name] = [value]
        conn = _Connection(aws_id(), send, int(time.time() * 1000), client_ip, headers.get("User-Agent", ""))
        self._all_ids.append(conn.id)
        event = self._event(conn, "$connect", "CONNECT")
        event["headers"] = headers
        event["multiValueHeaders"] = multi
        pairs = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        if pairs:
            event["queryStringParameters"] = dict(pairs)
            mq: dict[str, list[str]] = {}
            for k, v in pairs:
                mq.setdefault(k, []).append(v)
            event["multiValueQueryStringParameters"] = mq
        event["isBase64Encoded"] = False

        subprotocol: str | None = None
        connect = self.routes.get("$connect")
        if connect is not None:
            ok, result = await self._invoke(connect, event)
            if not ok:
                await self._deny(send, 500, json.dumps({"message": "Internal server error"}))
                return
            status = result.get("statusCode") if isinstance(result, dict) else None
            if not isinstance(status, int):
                self.errors.append(HandlerError("$connect", event, f"malformed Lambda proxy response: {result!r}"))
                await self._deny(send, 502, json.dumps({"message": "Internal server error"}))
                return
            if status != 200:
                body = result.get("body")
                await self._deny(send, status, body if isinstance(body, str) else "")
                return
            out_headers = result.get("headers") or {}
            subprotocol = next((v for k, v in out_headers.items() if k.lower() == "sec-websocket-protocol"), None)

        self._connections[conn.id] = conn
        loop = asyncio.get_running_loop()

        def notify() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the test is over
                loop.call_soon_threadsafe(conn.wake.set)

        def on_delete() -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.drop, conn.id, 1000, "Connection deleted")

        self._api.connect(conn.id, notify=notify, on_delete=on_delete,
                          identity=(conn.connected_at / 1000, conn.source_ip, conn.user_agent))
        await send({"type": "websocket.accept", "subprotocol": subprotocol})
        pump = loop.create_task(self._pump(conn))
        code, reason = 1006, ""
        try:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    code = int(message.get("code") or 1005)
                    reason = str(message.get("reason") or "")
                    break
                if message["type"] != "websocket.receive":
                    continue
                text, data = message.get("text"), message.get("bytes")
                default = self.routes.get("$default")
                if default is None:
                    continue
                if text is not None:
                    ev = self._event(conn, "$default", "MESSAGE", messageId=aws_id())
                    ev.update(body=text, isBase64Encoded=False)
                else:
                    ev = self._event(conn, "$default", "MESSAGE", messageId=aws_id())
                    ev.update(body=base64.b64encode(data or b"").decode(), isBase64Encoded=True)
                self._spawn(self._message(conn, default, ev), route=True)
        finally:
            conn.closed = True
            self._api.gone(conn.id)
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        if conn.closing is not None:
            code, reason = conn.closing
        elif code == 1009:
            reason = reason or "Message too big"
        else:
            reason = reason or "Client-side close frame status code"
        self.closed_connections[conn.id] = (code, reason)
        disconnect = self.routes.get("$disconnect")
        if disconnect is not None:
            ev = self._event(conn, "$disconnect", "DISCONNECT", disconnectStatusCode=code, disconnectReason=reason)
            ev["headers"] = {"Host": self.domain_name, "x-api-key": "", "X-Forwarded-For": ""}
            ev["multiValueHeaders"] = {"Host": [self.domain_name]}
            ev["isBase64Encoded"] = False
            await self._spawn(self._invoke(disconnect, ev), route=True)

    async def _deny(self, send: Callable[[dict[str, Any]], Any], status: int, body: str) -> None:
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "websocket.http.response.body", "body": body.encode()})

    async def _message(self, conn: _Connection, path: Path, event: dict[str, Any]) -> None:
        try:
            ok, _ = await asyncio.wait_for(self._invoke(path, event), INTEGRATION_TIMEOUT_S)
        except TimeoutError:
            ok, message = False, "Endpoint request timed out"
            self.errors.append(HandlerError(function_label(path), event, "integration timed out after 29 s"))
        else:
            message = "Internal server error"
        if not ok and not conn.closed:
            conn.edge_frames.append(json.dumps({"message": message, "connectionId": conn.id,
                                                "requestId": event["requestContext"]["requestId"]}))
            conn.wake.set()

    async def _pump(self, conn: _Connection) -> None:
        """Write the frames posted to the connection, in posting order, read from the backend."""
        assert self._api is not None
        while True:
            await conn.wake.wait()
            conn.wake.clear()
            frames: list[str | bytes] = []
            for raw in self._api.take(conn.id):
                try:
                    frames.append(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    frames.append(raw)
            frames.extend(conn.edge_frames)
            conn.edge_frames.clear()
            for frame in frames:
                if conn.closed or conn.closing is not None:
                    return
                key = "text" if isinstance(frame, str) else "bytes"
                try:
                    await conn.send({"type": "websocket.send", key: frame})
                except Exception:
                    return

    async def _close_socket(self, conn: _Connection, code: int, reason: str) -> None:
        assert self._api is not None
        self._api.gone(conn.id)
        with contextlib.suppress(Exception):
            await conn.send({"type": "websocket.close", "code": code, "reason": reason})

    async def _http(self, request: Request) -> Response:
        parts = request.url.path.strip("/").split("/")
        if request.method != "POST" or len(parts) != 4 or parts[:2] != ["2015-03-31", "functions"] \
                or parts[3] != "invocations":
            return JSONResponse({"message": f"no route for {request.method} {request.url.path}"}, 404)
        name = unquote(parts[2])
        base = name.split(":function:")[-1].split(":")[0]  # an ARN or name:qualifier → the name
        path = self.functions.get(base)
        if path is None:
            return _lambda_error(404, "ResourceNotFoundException", f"Function not found: {name}")
        raw = await request.body()
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            return _lambda_error(400, "InvalidRequestContentException", "Could not parse request body into json")
        kind = request.headers.get("x-amz-invocation-type", "RequestResponse")
        if kind == "DryRun":
            return Response(status_code=204)
        if kind == "Event":
            self._spawn(self._invoke_async(name, path, payload))
            return Response(status_code=202)
        ok, result = await self._spawn(self._invoke(path, payload))
        headers = {"X-Amz-Executed-Version": "$LATEST"}
        if not ok:
            headers["X-Amz-Function-Error"] = "Unhandled"
            return JSONResponse({"errorMessage": str(result).strip().splitlines()[-1],
                                 "errorType": "Exception", "stackTrace": []}, 200, headers)
        return Response(json.dumps(result).encode(), 200, headers, media_type="application/json")


    async def _invoke_async(self, name: str, path: Path, payload: Any) -> None:
        """An `Event` invocation; on failure (no retry: the template's MaximumRetryAttempts 0) the
        function's OnFailure destination gets Lambda's invocation record."""
        label = function_label(path)
        context = LambdaContext(f"agentvm-{label.replace('_', '-')}", TIMEOUTS.get(label, 10.0))
        ok, result = await self._invoke(path, payload, context)
        destination = self.destinations.get(label)
        if ok or destination is None:
            return
        record = self.failure_record(name, payload, context.aws_request_id, str(result))
        self.failure_records.append(record)
        await self._invoke_async(destination, self.functions[destination], record)

    def failure_record(self, name: str, payload: Any, request_id: str, error: str) -> dict[str, Any]:
        """What Lambda sends an OnFailure destination for a failed asynchronous invocation."""
        arn = name if name.startswith("arn:") else f"arn:aws:lambda:{self.region}:{self.account_id}:function:{name}"
        error_type, message = _function_error(error, request_id)
        return {
            "version": "1.0",
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
            "requestContext": {"requestId": request_id, "functionArn": arn, "condition": "RetriesExhausted",
                               "approximateInvokeCount": 1},
            "requestPayload": payload,
            "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
            "responsePayload": {"errorType": error_type, "errorMessage": message},
        }


def _function_error(error: str, request_id: str) -> tuple[str, str]:
    """Lambda's errorType and errorMessage for a failure as `_invoke` reports it (a traceback, a
    timeout, or the environment's process that died)."""
    if error.startswith("Task timed out"):
        return "Sandbox.Timedout", f"RequestId: {request_id} Error: {error.split(' (')[0]}"
    if "environment process exited" in error:
        return "Runtime.ExitError", f"RequestId: {request_id} Error: Runtime exited with error: signal: killed"
    last = error.strip().splitlines()[-1] if error.strip() else "Exception"
    error_type, _, message = last.partition(": ")
    return error_type.rsplit(".", 1)[-1], message


def _lambda_error(status: int, error_type: str, message: str) -> Response:
    return JSONResponse({"Type": "User", "message": message}, status, {"x-amzn-errortype": error_type})


@contextlib.asynccontextmanager
async def cloud_edge(*, moto_endpoint: str, check: bool = True, **options: Any) -> AsyncIterator[CloudEdge]:
    """Run a `CloudEdge` (options: see its constructor). On exit, after every invocation finished,
    raises `HandlerFailed` if a handler raised, unless `check=False` (inspect `edge.errors`)."""
    edge = CloudEdge(moto_endpoint=moto_endpoint, **options)
    async with edge.running():
        yield edge
    if check:
        edge.check()
