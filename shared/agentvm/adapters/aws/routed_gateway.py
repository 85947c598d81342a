"""The Gateway port when turn hosts terminate WebSockets themselves (template.yaml `WebSocketFront`).

A connection id says where its socket is (domain/turn_hosts.py): `h-<host id>-…` is a socket on a
turn host's front, anything else an API Gateway connection (both fronts coexist during a
migration). A frame goes

* to a socket of this process's own front straight to it (`local`: no network call);
* to another host's socket as `POST /@connections/{id}` to that host's private address and port,
  as its registry item (TURNHOST/HOST#<id>) names them, with the random token of that item
  (`Authorization: Bearer …`; the peer refuses anything else);
* to API Gateway's management API as before (`api`, created on first use).

Gone as on API Gateway: False when the socket is closed, when the host is not registered any more
(a dead host's sockets died with it: its record lapses three heartbeats after its last one, as of
the listing) or nothing listens at its address. A peer that does not answer in time raises: the
frame is lost, the subscription kept (cloud_fanout.py); one that does not even accept a connection
within `connect_s` is skipped (raises at once) for `unreachable_s`. The directory is listed
at most once per `cache_s` (a host unknown to the listing gets one early re-listing, at most once
per `relist_s`). Frame content is never logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import quote

from agentvm.domain.turn_hosts import TurnHostRecord, host_of
from agentvm.ids import now_ms
from agentvm.ports import TurnHostDirectory
from agentvm.protocol.frames import POLICY_VIOLATION

log = logging.getLogger(__name__)


class FrameGateway(Protocol):
    async def post(self, connection_id: str, frame: str) -> bool: ...
    async def delete_connection(self, connection_id: str) -> bool: ...


class LocalSockets(Protocol):
    """The sockets of this process's own front (turnhost/front.py)."""

    host_id: str

    async def post(self, connection_id: str, frame: str) -> bool: ...
    async def close(self, connection_id: str, code: int, reason: str) -> bool: ...


class PeerRefused(Exception):
    """A peer host refused a post (not a gone connection: a bad token or a broken peer)."""


class RoutedGateway:
    def __init__(self, api: Callable[[], FrameGateway], directory: TurnHostDirectory, *,
                 local: LocalSockets | None = None, timeout_s: float = 5.0, connect_s: float = 1.0,
                 cache_s: float = 2.0, relist_s: float = 0.5, unreachable_s: float = 30.0) -> None:
        self._api_factory = api
        self._api: FrameGateway | None = None
        self.directory = directory
        self.local = local
        self.timeout_s = timeout_s
        self.connect_s = connect_s
        self.unreachable_s = unreachable_s
        self._unreachable: dict[str, float] = {}  # host id → until when posts to it fail at once
        self.cache_s = cache_s
        self.relist_s = relist_s
        self._hosts: dict[str, TurnHostRecord] = {}
        self._listed_at: float | None = None
        self._listed_wall_ms = 0
        self._lock = asyncio.Lock()
        self._http: Any = None  # httpx.AsyncClient, created on first use on the loop that uses it
        #: posts by route, for metrics and tests: "local" | "peer" | "api"
        self.counts: dict[str, int] = {"local": 0, "peer": 0, "api": 0}

    @property
    def api(self) -> FrameGateway:
        if self._api is None:
            self._api = self._api_factory()
        return self._api

    async def post(self, connection_id: str, frame: str) -> bool:
        host = host_of(connection_id)
        if host is None:
            self.counts["api"] += 1
            return await self.api.post(connection_id, frame)
        if self.local is not None and host == self.local.host_id:
            self.counts["local"] += 1
            return await self.local.post(connection_id, frame)
        self.counts["peer"] += 1
        return await self._peer("POST", host, connection_id, frame.encode())

    async def delete_connection(self, connection_id: str) -> bool:
        """Close a connection (the refused handshake): a host's socket with 1008 and no reason of the
        handshake's (it said why in a frame first)."""
        host = host_of(connection_id)
        if host is None:
            return await self.api.delete_connection(connection_id)
        if self.local is not None and host == self.local.host_id:
            return await self.local.close(connection_id, POLICY_VIOLATION, "unauthorized")
        return await self._peer("DELETE", host, connection_id, b"")

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        close = getattr(self._api, "close", None)
        if callable(close):
            await close()

    async def _peer(self, method: str, host_id: str, connection_id: str, body: bytes) -> bool:
        import httpx

        peer = await self._find(host_id)
        if peer is None or not peer.address or not peer.token:
            return False  # not registered (any more): its sockets are gone with it
        blocked = self._unreachable.get(host_id)
        if blocked is not None and time.monotonic() < blocked:
            raise PeerRefused(f"turn host {host_id} is not reachable from here")
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s, connect=self.connect_s))
        url = f"http://{peer.address}:{peer.port}/@connections/{quote(connection_id, safe='')}"
        try:
            res = await self._http.request(method, url, content=body,
                                           headers={"authorization": f"Bearer {peer.token}"})
        except httpx.ConnectError:
            return False  # refused: nothing listens there, the host is gone
        except httpx.ConnectTimeout:
            # no answer at all: no route from this process (a function outside the VPC) or a host
            # that just died; the subscription is kept (its record lapses if the host is dead), and
            # the next posts to that host fail at once for a while instead of waiting each
            self._unreachable[host_id] = time.monotonic() + self.unreachable_s
            raise PeerRefused(f"turn host {host_id} did not answer within {self.connect_s:g} s") from None
        if res.status_code in (200, 204):
            return True
        if res.status_code == 410:
            return False
        raise PeerRefused(f"turn host {host_id} answered {res.status_code} to a frame post")

    async def _find(self, host_id: str) -> TurnHostRecord | None:
        async with self._lock:
            now = time.monotonic()
            at = self._listed_at
            stale = at is None or now - at >= self.cache_s
            if stale or (host_id not in self._hosts and now - at >= self.relist_s):  # type: ignore[operator]
                self._hosts = {h.host_id: h for h in await self.directory.list_hosts()}
                self._listed_at, self._listed_wall_ms = now, now_ms()
        peer = self._hosts.get(host_id)
        # judged as of the listing, not of each post (a live host's `until` is three heartbeats ahead
        # of its last one, possibly less than the cache's age: hosting/turn_tiers.py)
        return peer if peer is not None and peer.until_ms > self._listed_wall_ms else None


