"""Routers built when a request first needs them: a cold start builds only its own request's routes.

Building a FastAPI route is costly (its parameters' and body's validators, its dependencies read from
the endpoint's signature: ~2 ms of CPU each on a Lambda-sized machine), and a Lambda execution
environment often serves requests of one kind only. So the application registers each router with
the path prefixes it serves; a request whose path is under a prefix builds that router first (once),
before anything else looks at the routes (the gate authenticates by them). The OpenAPI document builds
every router. A router's routes outside its declared prefixes are refused when it is built (a test that
reads the document builds them all), so a route can never stay unreachable.

Groups are kept in the order they were added, which is the order their routes are matched in, whatever
order they were built in (the token API's routes first: docs/benchmarks.md, token API overhead).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fastapi import APIRouter, FastAPI
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from agentvm.api.request_gate import route_path


@dataclass(slots=True)
class _Group:
    prefixes: tuple[str, ...]
    build: Callable[[], Sequence[APIRouter]]
    entries: list[BaseRoute] = field(default_factory=list)  # what including its routers added to app.router
    routes: list[BaseRoute] = field(default_factory=list)  # its routers' own routes
    built: bool = False

    def covers(self, path: str) -> bool:
        return any(path == prefix or (prefix != "/" and path.startswith(prefix + "/")) for prefix in self.prefixes)


class RouteGroups:
    """The application's lazily built routers. `routes`: every built route, in the order of their
    groups (the list the request gate and the error handlers read)."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._groups: list[_Group] = []
        self._pending = 0
        self.routes: list[BaseRoute] = []

    def add(self, prefixes: Sequence[str], build: Callable[[], Sequence[APIRouter]]) -> None:
        """`build` makes the routers serving the paths under `prefixes` (a prefix names a path and every
        path below it; "/" names the root alone)."""
        if not prefixes or any(not p.startswith("/") or (p != "/" and p.endswith("/")) for p in prefixes):
            raise ValueError(f"route group prefixes must be absolute paths without a trailing /: {list(prefixes)}")
        self._groups.append(_Group(tuple(prefixes), build))
        self._pending += 1

    def need(self, path: str) -> None:
        """Build the groups serving `path` (if not built yet)."""
        if self._pending:
            for group in self._groups:
                if not group.built and group.covers(path):
                    self._build(group)

    def build_all(self) -> None:
        if self._pending:
            for group in self._groups:
                if not group.built:
                    self._build(group)

    def _build(self, group: _Group) -> None:
        routers = group.build()
        routes = self._app.router.routes
        for router in routers:
            for route in router.routes:
                path = getattr(route, "path", None)
                if path is not None and not group.covers(path):
                    raise ValueError(f"route {path} is outside its group's prefixes {list(group.prefixes)}")
            before = len(routes)
            self._app.include_router(router)
            group.routes.extend(router.routes)
            group.entries.extend(routes[before:])
            del routes[before:]
        group.built = True
        self._pending -= 1
        # the app's own routes (health, documentation) first, then every built group in the order added
        built = [g for g in self._groups if g.built]
        grouped = {id(entry) for g in built for entry in g.entries}
        routes[:] = [r for r in routes if id(r) not in grouped] + [entry for g in built for entry in g.entries]
        self.routes[:] = [route for g in built for route in g.routes]


class BuildRoutes:
    """ASGI middleware: builds the route groups a request's path needs before anything reads the
    routes (added outside the request gate)."""

    def __init__(self, app: ASGIApp, *, groups: RouteGroups) -> None:
        self.app = app
        self._groups = groups

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            self._groups.need(route_path(scope))
        await self.app(scope, receive, send)
