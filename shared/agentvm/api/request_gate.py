"""The gate in front of the HTTP API: the caller is authenticated, and the body's size checked,
before anything reads the body (docs/tenancy.md, docs/reliability.md).

FastAPI reads and parses a JSON body before it resolves a route's dependencies, the caller among
them, so without the gate an unauthenticated client could make the server buffer any body it likes
(one 1 GiB upload took the server to 3.1 GB RSS) and learn from a 400 that its body was wrong. The
gate is a pure ASGI middleware:

1. It finds the route a request goes to and runs that route's own caller dependencies (the
   `principal_for`, `admin_for` or `key_caller` it declares with `Depends`) on the request's headers
   only: a failure answers 401/403 at once, the body unread. The answer is kept for the request, so
   the route's dependency gets it without a second lookup (`resolved_once`). A request that no
   route takes (an unknown path, a wrong method) needs a key like any other (`default_caller`); a
   route that declares no caller (`/api/v1/health`) and the public paths (`/health`, the OpenAPI
   document) need none.
2. A declared `Content-Length` over the route's limit answers 413 at once; a body without one
   (chunked) is counted while it streams and cut with a 413 when it passes the limit.

An early answer to a chunked body or one declared over 64 KiB carries `Connection: close`: the
server stops reading and closes, instead of draining (possibly gigabytes of) what the client still
sends; the client may see a reset after the answer. A smaller body is drained and the connection
kept.

3. A route named in `direct` whose endpoint takes the request alone (no dependency, no parameter)
   and answers a `Response` is called by the gate itself, its body still counted: the latency-bound
   token API routes skip the layers a request passes through after the gate (FastAPI's exception
   middleware and exit stack, the router, its request handler; ~0.1-0.2 ms a call). They catch their
   own errors (answered in their vendor's shape); anything else still reaches the application's
   outermost error handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi.routing import APIRoute
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentvm.errors import AgentVMError

T = TypeVar("T")
Resolver = Callable[[Request], Awaitable[Any]]

_FOUND_MAX = 4096  # paths whose route the gate remembers
_DRAIN_BYTES = 64 * 1024  # uvicorn's read buffer: a body this small costs nothing to read and drop
_RESOLVED = "agentvm.callers"  # scope key: the callers found for this request, by resolver


def error_response(exc: AgentVMError, *, close: bool = False) -> JSONResponse:
    """The one error shape of the HTTP API."""
    body: dict[str, Any] = {"error": {"code": exc.code, "message": exc.message}}
    if exc.field:
        body["error"]["field"] = exc.field
    return JSONResponse(body, status_code=exc.http_status, headers={"connection": "close"} if close else None)


def resolved_once(resolve: Callable[[Request], Awaitable[T]]) -> Callable[[Request], Awaitable[T]]:
    """`resolve` (a caller dependency) run at most once per request: the gate runs it before the
    body is read, the route's `Depends` then gets the same answer."""

    async def once(request: Request) -> T:
        found: dict[object, Any] = request.scope.setdefault(_RESOLVED, {})
        if resolve not in found:
            found[resolve] = await resolve(request)
        value: T = found[resolve]
        return value

    once.__name__ = getattr(resolve, "__name__", "caller")
    return once


@dataclass(frozen=True, slots=True)
class BodyLimit:
    """The largest body a route takes, and the error that refuses a larger one."""

    max_bytes: Callable[[], int]
    refuse: Callable[[int], AgentVMError]


class _Refused(Exception):
    """Raised to the application once the gate has answered 413 for a body cut mid-stream."""


class RequestGate:
    """Pure ASGI middleware; see the module docstring.

    `routes`: the API's routes, as its routers made them (read at request time: the gate is added
    before the routes are); `public`: paths that need no caller; `callers`: every caller dependency
    a route may declare (as wrapped by `resolved_once`); `default_caller`: what authenticates a
    request no route takes (None: nothing, an application without an API); `limits`: a limit by
    route path, else `default_limit`."""

    def __init__(self, app: ASGIApp, *, routes: Callable[[], Sequence[BaseRoute]], public: Collection[str],
                 callers: Collection[Resolver], default_caller: Resolver | None, default_limit: BodyLimit,
                 limits: Mapping[str, BodyLimit] | None = None, direct: Collection[str] = ()) -> None:
        self.app = app
        self._routes = routes
        self._public = frozenset(public)
        self._callers = frozenset(callers)
        self._default_caller = default_caller
        self._default_limit = default_limit
        self._limits = dict(limits or {})
        self._direct = frozenset(direct)
        self._apps: dict[int, ASGIApp] = {}  # id(route): what the gate passes its request to
        self._declared: dict[int, tuple[Resolver, ...]] = {}  # id(route): its caller dependencies
        # (method, path, root path): the route that takes it. Matching walks every route (~0.1 ms a
        # request, as much as the router's own match); bounded, as paths carry ids.
        self._found: dict[tuple[str, str, str], BaseRoute | None] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        # an early answer closes the connection unless the rest of the body is small enough to drain
        close = "transfer-encoding" in headers or (declared.isdigit() and int(declared) > _DRAIN_BYTES)
        route = self._route(scope)
        callers: tuple[Resolver, ...] = ()
        if route is not None:
            callers = self._callers_of(route)
        elif self._default_caller is not None and route_path(scope) not in self._public:
            callers = (self._default_caller,)
        request = Request(scope)  # no `receive`: a caller dependency that read the body would fail
        for caller in callers:
            try:
                await caller(request)
            except AgentVMError as exc:
                await error_response(exc, close=close)(scope, receive, send)
                return
        limit = self._limits.get(getattr(route, "path", ""), self._default_limit)
        max_bytes = limit.max_bytes()
        if declared.isdigit() and int(declared) > max_bytes:
            await error_response(limit.refuse(max_bytes), close=close)(scope, receive, send)
            return
        app = self.app if route is None else self._app_of(route)
        await _Counted(app, scope, receive, send, max_bytes, limit.refuse).run()

    def _route(self, scope: Scope) -> BaseRoute | None:
        """The route that takes the request; None when none takes it whole (404, 405)."""
        key = (scope.get("method", ""), scope["path"], scope.get("root_path", ""))
        if key in self._found:
            return self._found[key]
        found: BaseRoute | None = None
        for route in self._routes():
            match, _child = route.matches(scope)
            if match is Match.FULL:
                found = route
                break
        if len(self._found) >= _FOUND_MAX:
            self._found.clear()
        self._found[key] = found
        return found

    def _app_of(self, route: BaseRoute) -> ASGIApp:
        found = self._apps.get(id(route))
        if found is None:
            found = self.app
            if isinstance(route, APIRoute) and route.path in self._direct and _request_only(route):
                found = _direct_app(route.endpoint)
            self._apps[id(route)] = found
        return found

    def _callers_of(self, route: BaseRoute) -> tuple[Resolver, ...]:
        known = self._declared.get(id(route))
        if known is None:
            known = self._declared[id(route)] = tuple(self._walk(route))
        return known

    def _walk(self, route: BaseRoute) -> list[Resolver]:
        if not isinstance(route, APIRoute):
            return [] if self._default_caller is None else [self._default_caller]
        found: list[Resolver] = []
        pending = list(route.dependant.dependencies)
        while pending:
            dependency = pending.pop(0)
            if dependency.call in self._callers and dependency.call not in found:
                found.append(dependency.call)
            pending.extend(dependency.dependencies)
        return found


def _request_only(route: APIRoute) -> bool:
    """The endpoint takes the request and nothing else (nothing for FastAPI to resolve)."""
    d = route.dependant
    return (d.request_param_name is not None and not d.dependencies and not d.path_params and not d.query_params
            and not d.header_params and not d.cookie_params and not d.body_params and d.websocket_param_name is None
            and d.http_connection_param_name is None and d.response_param_name is None
            and d.background_tasks_param_name is None and d.security_scopes_param_name is None)


def _direct_app(endpoint: Callable[[Request], Awaitable[Response]]) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        response = await endpoint(Request(scope, receive, send))
        await response(scope, receive, send)
    return app


def route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class _Counted:
    """One request passed on with its body counted: past the limit, a 413 is answered (when no
    answer has started) and the application's further answer is dropped."""

    def __init__(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, max_bytes: int,
                 refuse: Callable[[int], AgentVMError]) -> None:
        self.app, self.scope, self._receive, self._send = app, scope, receive, send
        self.max_bytes, self.refuse = max_bytes, refuse
        self.received = 0
        self.started = self.refused = False

    async def run(self) -> None:
        try:
            await self.app(self.scope, self.receive, self.send)
        except _Refused:
            if not self.refused:
                raise

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.max_bytes:
                if not self.started:
                    self.refused = True
                    await error_response(self.refuse(self.max_bytes), close=True)(self.scope, self._receive,
                                                                                   self._send)
                raise _Refused
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return  # the 413 is the answer: what the application says after it is dropped
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)
