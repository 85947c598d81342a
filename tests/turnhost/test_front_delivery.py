"""Frame delivery with the turn hosts' own fronts, in one process: the routed gateway (API Gateway
ids to the management API, this host's ids to its sockets, another host's to that host's internal
endpoint with its token), the internal endpoint's authentication (fail closed), the per-socket
queue (a client that stops reading is closed with 1013), and the local-first dispatch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from agentvm.adapters.aws.routed_gateway import PeerRefused, RoutedGateway
from agentvm.domain.turn_hosts import TurnHostRecord, host_connection_id, host_of
from agentvm.ids import now_ms
from agentvm.protocol.frames import TRY_AGAIN_LATER
from agentvm.turnhost.front import HostSockets
from agentvm.turnhost.peers import PeerEndpoint
from tests.support.servers import free_port
from tests.turnhost.fakes import Directory

TOKEN = "t" * 43


class FakeSocket:
    """What HostSockets uses of a Starlette WebSocket; `blocked` holds every send (a client that stopped reading)."""

    def __init__(self, *, blocked: bool = False) -> None:
        self.sent: list[str] = []
        self.closed: tuple[int, str] | None = None
        self.release = asyncio.Event()
        if not blocked:
            self.release.set()

    async def send_text(self, text: str) -> None:
        await self.release.wait()
        self.sent.append(text)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = (code, reason)


class FakeApi:
    def __init__(self) -> None:
        self.posts: list[tuple[str, str]] = []
        self.deleted: list[str] = []

    async def post(self, connection_id: str, frame: str) -> bool:
        self.posts.append((connection_id, frame))
        return True

    async def delete_connection(self, connection_id: str) -> bool:
        self.deleted.append(connection_id)
        return True


@contextlib.asynccontextmanager
async def peer(sockets: HostSockets, token: str, **options: Any) -> AsyncIterator[tuple[int, PeerEndpoint]]:
    port = free_port()
    endpoint = PeerEndpoint(sockets, token, **options)
    server = uvicorn.Server(uvicorn.Config(endpoint, host="127.0.0.1", port=port, log_config=None, lifespan="off"))
    task = asyncio.create_task(server.serve())
    deadline = asyncio.get_running_loop().time() + 10
    while not server.started:
        assert asyncio.get_running_loop().time() < deadline and not task.done()
        await asyncio.sleep(0.01)
    try:
        yield port, endpoint
    finally:
        server.should_exit = True
        await task


def record(host_id: str, port: int, token: str = TOKEN, *, until_ms: int | None = None) -> TurnHostRecord:
    return TurnHostRecord(host_id, until_ms or now_ms() + 30_000, 10, 0, True, "127.0.0.1", port, token)


def test_host_connection_ids_name_their_host_and_api_gateway_ids_none() -> None:
    cid = host_connection_id("host-abc-1", "0123abcd")
    assert cid == "h-host-abc-1-0123abcd" and host_of(cid) == "host-abc-1"
    assert host_of("Ab3dEfGhIjKlMn0=") is None and host_of("h-") is None and host_of("h-x") is None


async def test_frames_go_to_api_gateway_to_this_hosts_socket_or_to_the_other_host() -> None:
    here, there = HostSockets("host-a"), HostSockets("host-b")
    mine, theirs = FakeSocket(), FakeSocket()
    here._open("h-host-a-1", mine)  # type: ignore[arg-type]
    there._open("h-host-b-1", theirs)  # type: ignore[arg-type]
    async with peer(there, TOKEN) as (port, endpoint):
        api, directory = FakeApi(), Directory([record("host-b", port)])
        gateway = RoutedGateway(lambda: api, directory, local=here, relist_s=0.0)
        try:
            assert await gateway.post("Ab3dEfGhIjKlMn0=", "to-api")
            assert await gateway.post("h-host-a-1", "to-mine")
            assert await gateway.post("h-host-b-1", "to-theirs")
            assert not await gateway.post("h-host-b-2", "no such socket")  # 410 from B: gone
            assert not await gateway.post("h-host-c-1", "no such host")  # not registered: gone
            assert await gateway.delete_connection("h-host-b-1")
            await asyncio.sleep(0.1)  # the pumps write
        finally:
            await gateway.close()
        assert api.posts == [("Ab3dEfGhIjKlMn0=", "to-api")]
        assert mine.sent == ["to-mine"] and theirs.sent == ["to-theirs"]
        assert theirs.closed == (1008, "unauthorized")
        assert gateway.counts == {"api": 1, "local": 1, "peer": 3}
        assert endpoint.counts == {"posted": 1, "gone": 1, "closed": 1, "refused": 0}
        assert directory.lists == 2  # one listing, one early re-listing for the unknown host


async def test_the_internal_endpoint_refuses_without_the_hosts_token_and_delivers_nothing() -> None:
    there = HostSockets("host-b")
    theirs = FakeSocket()
    there._open("h-host-b-1", theirs)  # type: ignore[arg-type]
    async with peer(there, TOKEN) as (port, endpoint):
        stale = RoutedGateway(FakeApi, Directory([record("host-b", port, token="not-" + TOKEN)]))
        try:
            with pytest.raises(PeerRefused, match="host-b answered 401"):
                await stale.post("h-host-b-1", "forged")
        finally:
            await stale.close()
        assert endpoint.counts["refused"] == 1
    async with peer(there, "") as (port, endpoint):  # no token configured: everything is refused
        empty = RoutedGateway(FakeApi, Directory([record("host-b", port, token="x")]))
        try:
            with pytest.raises(PeerRefused):
                await empty.post("h-host-b-1", "forged")
        finally:
            await empty.close()
    await asyncio.sleep(0.05)
    assert theirs.sent == [] and theirs.closed is None


async def test_the_internal_endpoint_refuses_a_frame_above_its_limit_and_delivers_nothing() -> None:
    there = HostSockets("host-b")
    theirs = FakeSocket()
    there._open("h-host-b-1", theirs)  # type: ignore[arg-type]
    async with peer(there, TOKEN, max_bytes=1024) as (port, endpoint):
        gateway = RoutedGateway(FakeApi, Directory([record("host-b", port)]))
        try:
            with pytest.raises(PeerRefused, match="host-b answered 413"):
                await gateway.post("h-host-b-1", "x" * 1025)
            assert await gateway.post("h-host-b-1", "y" * 1024)  # at the limit: delivered
        finally:
            await gateway.close()
        assert endpoint.counts["posted"] == 1
    await asyncio.sleep(0.05)
    assert theirs.sent == ["y" * 1024]


async def test_a_host_that_is_gone_or_expired_as_of_the_listing_means_its_sockets_are_gone() -> None:
    port = free_port()  # nothing listens there
    directory = Directory([record("host-b", port), record("host-c", port, until_ms=now_ms() - 1)])
    gateway = RoutedGateway(FakeApi, directory)
    try:
        assert not await gateway.post("h-host-b-1", "x")  # connection refused
        assert not await gateway.post("h-host-c-1", "x")  # its record lapsed
    finally:
        await gateway.close()


async def test_a_client_that_stops_reading_is_closed_with_1013_once_its_queue_is_full() -> None:
    sockets = HostSockets("host-a", max_queue=2)
    slow = FakeSocket(blocked=True)
    sockets._open("h-host-a-1", slow)  # type: ignore[arg-type]
    results = [await sockets.post("h-host-a-1", f"f{i}") for i in range(4)]
    # f0..f2 fill the queue (max_queue and the close marker's place), f3 overflows
    assert results == [True, True, True, False]
    assert not await sockets.post("h-host-a-1", "after")
    await asyncio.sleep(0.05)
    assert slow.closed == (TRY_AGAIN_LATER, "client too slow")
    assert not await sockets.close("h-host-a-1", 1000, "")


async def test_local_first_dispatch_runs_on_the_host_with_room_else_hands_on() -> None:
    from agentvm.domain.models import LeaseHandoff
    from agentvm.turnhost.host import HostOptions, TurnHost
    from agentvm.turnhost.local_dispatch import LocalFirstDispatcher
    from tests.turnhost.fakes import Dispatches, Queue

    release = asyncio.Event()
    ran: list[tuple[str, LeaseHandoff | None]] = []

    async def run_session(tenant_id: str, session_id: str, handoff: LeaseHandoff | None) -> list[Any]:
        ran.append((session_id, handoff))
        await release.wait()
        return []

    class Cpu:
        vcpus = 1.0

        def fraction(self) -> float:
            return 0.0

        def sample(self) -> None:
            return None

    fallback = Dispatches()
    host = TurnHost("host-a", queue=Queue(), directory=Directory(), fallback=Dispatches(), run_session=run_session,
                    cpu=Cpu(), options=HostOptions(capacity=1, heartbeat_s=0.2, poll_s=0))  # type: ignore[arg-type]
    dispatch = LocalFirstDispatcher(host, fallback)
    await dispatch.start_turns("t", "s-before")  # not serving yet: handed on
    serving = asyncio.create_task(host.serve())
    deadline = asyncio.get_running_loop().time() + 10
    while not host.registered:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    first, second = LeaseHandoff("ws:a/turn-1", 3), LeaseHandoff("ws:b/turn-2", 5)
    await dispatch.start_turns("t", "s1", handoff=first)  # room: here, with the lease handed on
    await dispatch.start_turns("t", "s1")  # its run is going: joined
    await dispatch.start_turns("t", "s1", handoff=second)  # a lease handed on meanwhile: run after it
    await dispatch.start_turns("t", "s2", handoff=second)  # full: handed on, with its handoff
    await asyncio.sleep(0.01)
    assert ran == [("s1", first)] and dispatch.counts == {"here": 3, "elsewhere": 2}
    assert (host.counts.local, host.counts.joined, host.counts.received) == (2, 1, 0)
    release.set()
    host.stop()
    assert await serving
    assert ran == [("s1", first), ("s1", second)]
    assert fallback.started == [("t", "s-before"), ("t", "s2")] and fallback.handoffs == [None, second]


async def test_a_host_that_does_not_answer_is_skipped_for_a_while_and_its_subscribers_kept() -> None:
    import httpx

    attempts: list[str] = []

    def no_answer(request: httpx.Request) -> httpx.Response:
        attempts.append(str(request.url))
        raise httpx.ConnectTimeout("no route", request=request)

    gateway = RoutedGateway(FakeApi, Directory([record("host-b", 1)]), unreachable_s=60)
    gateway._http = httpx.AsyncClient(transport=httpx.MockTransport(no_answer))
    try:
        for _ in range(3):  # raises (the fan-out keeps the subscription), never False (gone)
            with pytest.raises(PeerRefused, match="host-b"):
                await gateway.post("h-host-b-1", "x")
    finally:
        await gateway.close()
    assert attempts == ["http://127.0.0.1:1/@connections/h-host-b-1"]  # one wait, then at once
