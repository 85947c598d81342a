"""The protocol scenario suite runs once per backend:

* `local`: `avm serve`'s app in-process (uvicorn in the test's loop, SQLite);
* `cloud`: the Lambda handlers behind the emulated API Gateway edge (tests/support/cloud_edge.py),
  on DynamoDB and the management API of moto, authenticated with an API key;
* `cloud-host`: the same edge with the turn-host tier (AVM_TURN_QUEUE_URL, a moto SQS queue) and a
  turn host in this process (tests/support/turn_hosts.py) that runs every turn: at teardown no
  `chat_turn` was invoked.
* `cloud-hostws`: the turn-host tier with its own WebSocket front (WebSocketFront=LoadBalancer): the
  clients connect to the host in this process (tests/support/turn_hosts.py, `front=True`), which
  runs the route code of `ws_connect`/`ws_default`/`ws_disconnect` and every turn itself; the
  emulated edge only serves the Lambda Invoke API. At teardown no `chat_turn` and no `ws_default`
  was invoked.

Scenarios take `server` (or `make_server` for their own driver or settings) and use only the
common `Server` interface below. A scenario that is about the local process itself carries
`@pytest.mark.local_only("why")` and does not take `server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

import pytest

from agentvm.ports import Driver, Store
from tests.aws_fixtures import REGION, aws_env, aws_session, moto_endpoint
from tests.support.scripts import RecordingDriver, reference_driver
from tests.support.servers import InProcess, in_process
from tests.support.stock_client import StockClient

__all__ = ["aws_env", "aws_session", "moto_endpoint"]

BACKENDS = ["local", "cloud", "cloud-host", "cloud-hostws"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "local_only(reason): a scenario about the local process, not the protocol")


class Server(Protocol):
    """What scenarios may use of a backend."""

    backend: str

    @property
    def url(self) -> str:
        """WebSocket URL for clients (with the credentials the backend needs)."""
        ...

    @property
    def store(self) -> Store:
        """The backend's stored state, readable from the test's loop."""
        ...

    async def restart(self, *, driver: Driver | None = None) -> None:
        """A new server process (local) or new handler instances (cloud), same stored state;
        `driver` replaces the LLM driver from then on."""
        ...

    def connection_ids(self) -> set[str]:
        """Ids of the open WebSocket connections."""
        ...

    def drop(self, connection_id: str) -> None:
        """Close a connection from the server side (a network failure, an idle timeout)."""
        ...

    async def settle(self) -> None:
        """Let the server handle the frames clients sent so far (a `subscribe` has no answer)."""
        ...


MakeServer = Callable[..., contextlib.AbstractAsyncContextManager[Server]]


class LocalServer:
    backend = "local"

    def __init__(self, data_dir: Path, driver: Driver | None, settings: dict[str, Any]) -> None:
        self._data_dir = data_dir
        self._driver = driver
        self._settings = settings
        self._stack = contextlib.AsyncExitStack()
        self.srv: InProcess | None = None

    async def start(self) -> None:
        self.srv = await self._stack.enter_async_context(
            in_process(self._data_dir, driver=self._driver, **self._settings))

    async def stop(self) -> None:
        await self._stack.aclose()
        self.srv = None

    @property
    def _running(self) -> InProcess:
        assert self.srv is not None, "the server is not running"
        return self.srv

    @property
    def url(self) -> str:
        return self._running.url

    @property
    def store(self) -> Store:
        return self._running.runtime.store

    async def restart(self, *, driver: Driver | None = None) -> None:
        await self.stop()
        if driver is not None:
            self._driver = driver
        await self.start()

    def connection_ids(self) -> set[str]:
        return set(self._running.runtime.hub._conns)

    def drop(self, connection_id: str) -> None:
        self._running.runtime.hub._conns[connection_id].close("test: dropped by the server")

    async def settle(self) -> None:
        await asyncio.sleep(0.05)


class CloudServer:
    backend = "cloud"

    def __init__(self, edge: Any, store: Store, holder: _DriverHolder) -> None:
        self.edge = edge  # tests.support.cloud_edge.CloudEdge
        self._store = store
        self._holder = holder

    @property
    def url(self) -> str:
        return str(self.edge.url)

    @property
    def store(self) -> Store:
        return self._store

    async def restart(self, *, driver: Driver | None = None) -> None:
        if driver is not None:
            self._holder.driver = driver
        self.edge.restart()

    def connection_ids(self) -> set[str]:
        return set(self.edge.connection_ids())

    def drop(self, connection_id: str) -> None:
        self.edge.drop(connection_id)

    async def settle(self) -> None:
        await self.edge.settle()


class CloudHostServer(CloudServer):
    backend = "cloud-host"

    def __init__(self, edge: Any, store: Store, holder: _DriverHolder, host: Any) -> None:
        super().__init__(edge, store, holder)
        self.host = host  # tests.support.turn_hosts.InProcessHost

    async def restart(self, *, driver: Driver | None = None) -> None:
        """A new deployment: new handler environments, and a new turn host that registers before
        the old one drains (ECS's rolling update), so no turn falls back to `chat_turn`."""
        from tests.support.turn_hosts import InProcessHost

        await super().restart(driver=driver)
        old, self.host = self.host, await asyncio.to_thread(InProcessHost().start)
        await asyncio.to_thread(old.stop)


class CloudFrontServer(CloudHostServer):
    backend = "cloud-hostws"

    def __init__(self, edge: Any, store: Store, holder: _DriverHolder, host: Any, token: str) -> None:
        super().__init__(edge, store, holder, host)
        self._token = token

    @property
    def url(self) -> str:
        from urllib.parse import quote

        return f"ws://127.0.0.1:{os.environ['AVM_TURN_HOST_WS_PORT']}/ws?token={quote(self._token, safe='')}"

    async def restart(self, *, driver: Driver | None = None) -> None:
        """A new task behind the load balancer: the old host drains (its sockets are closed, as on a
        `local` restart), the new one listens on the same port (the load balancer's one URL)."""
        from tests.support.turn_hosts import InProcessHost

        if driver is not None:
            self._holder.driver = driver
        self.edge.restart()
        await asyncio.to_thread(self.host.stop)
        self.host = await asyncio.to_thread(InProcessHost(front=True).start)

    def connection_ids(self) -> set[str]:
        return set(self.host.front.sockets.ids())

    def drop(self, connection_id: str) -> None:
        from agentvm.protocol.frames import GOING_AWAY

        assert self.host.loop is not None
        asyncio.run_coroutine_threadsafe(self.host.front.sockets.close(connection_id, GOING_AWAY, "Going away"),
                                         self.host.loop).result(10)

    async def settle(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        await asyncio.sleep(0.02)
        while self.host.front.app._inflight:  # the frames received so far are handled
            assert loop.time() < deadline, "the host's front did not settle"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.02)


class _DriverHolder:
    def __init__(self, driver: Driver | None) -> None:
        self.driver = driver


@contextlib.asynccontextmanager
async def _local(request: pytest.FixtureRequest, driver: Driver | None, **settings: Any) -> AsyncIterator[Server]:
    base: Path = request.getfixturevalue("tmp_path")
    server = LocalServer(base / f"data-{uuid.uuid4().hex[:6]}", driver, settings)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def _cloud(request: pytest.FixtureRequest, driver: Driver | None, *, host: bool = False, front: bool = False,
                 **settings: Any) -> AsyncIterator[Server]:
    from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
    from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
    from agentvm.auth.api_keys import new_key
    from agentvm.cloud import runtime as cloud_runtime
    from tests.support.cloud_edge import cloud_edge

    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    request.getfixturevalue("aws_env")
    moto: str = request.getfixturevalue("moto_endpoint")
    for name in list(os.environ):  # nothing from the developer's shell reaches the handlers
        if name.startswith(("AVM_", "LLM_", "ANTHROPIC_")):
            monkeypatch.delenv(name)
    holder = _DriverHolder(driver)
    monkeypatch.setattr(cloud_runtime, "build_driver", lambda *args, **kwargs: holder.driver)
    table = f"agentvm-{uuid.uuid4().hex[:16]}"
    store = DynamoDBStore(table, endpoint_url=moto, region_name=REGION)
    await store.open()
    await store.create_table()
    key, token = new_key("local", ("user",), name="contract suite")
    await DynamoDBKeys(store).put_key(key)
    env = {"AVM_CHAT_TURN_FUNCTION": "agentvm-chat-turn:live", "AVM_RELIABLE_WRAPPER": "false",
           **{f"AVM_{name.upper()}": str(value) for name, value in settings.items()}}
    if host:
        from tests.support.turn_hosts import create_queue

        # poll 0: moto serves one request at a time, a long poll would hold every other call
        env.update(AVM_TURN_QUEUE_URL=create_queue(moto), AVM_TURN_HOST_POLL_S="0",
                   AVM_TURN_HOST_HEARTBEAT_S="1")
    if front:
        from tests.support.servers import free_port

        env.update(AVM_TURN_HOST_WS_PORT=str(free_port()), AVM_TURN_HOST_PEER_PORT=str(free_port()),
                   AVM_TURN_HOST_ADDRESS="127.0.0.1")
    try:
        async with cloud_edge(moto_endpoint=moto, token=token, table_name=table) as edge:
            for name, value in {**edge.handler_env(), **env}.items():
                monkeypatch.setenv(name, value)
            if not host:
                yield CloudServer(edge, store, holder)
                return
            async with _turn_host(edge, store, holder, token if front else None) as server:
                yield server
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def _turn_host(edge: Any, store: Store, holder: _DriverHolder, front_token: str | None) -> AsyncIterator[Server]:
    from tests.support.turn_hosts import InProcessHost, queue_depth

    if front_token is None:
        server = CloudHostServer(edge, store, holder, await asyncio.to_thread(InProcessHost().start))
    else:
        server = CloudFrontServer(edge, store, holder, await asyncio.to_thread(InProcessHost(front=True).start),
                                  front_token)
    try:
        yield server
        # every turn dispatched so far is run by the host before the assertion
        await edge.settle(include_invokes=True, timeout=30)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not (server.host.idle() and await asyncio.to_thread(queue_depth, edge.moto_endpoint,
                                                                   os.environ["AVM_TURN_QUEUE_URL"]) == 0):
            assert loop.time() < deadline, "the turn host did not become idle"
            await asyncio.sleep(0.05)
        await edge.settle(include_invokes=True, timeout=30)
        assert edge.calls("chat_turn") == [], "turns ran on chat_turn while a turn host took turns"
        if front_token is not None:
            assert edge.calls("ws_default") == [], "frames went through API Gateway, not the host's front"
        assert server.host.host is not None and server.host.host.counts.refused == 0
    finally:
        await asyncio.to_thread(server.host.stop)


@pytest.fixture(params=BACKENDS)
def make_server(request: pytest.FixtureRequest) -> MakeServer:
    """`async with make_server(driver=..., **settings) as server:` on this test's backend."""
    def make(driver: Driver | None = None, **settings: Any) -> contextlib.AbstractAsyncContextManager[Server]:
        if request.param == "local":
            return _local(request, driver, **settings)
        return _cloud(request, driver, host=request.param in ("cloud-host", "cloud-hostws"),
                      front=request.param == "cloud-hostws", **settings)

    return make


@pytest.fixture
def driver() -> RecordingDriver:
    return RecordingDriver(reference_driver())


@pytest.fixture
async def server(make_server: MakeServer, driver: RecordingDriver) -> AsyncIterator[Server]:
    async with make_server(driver=driver) as srv:
        yield srv


@pytest.fixture
async def client(server: Server) -> AsyncIterator[StockClient]:
    async with StockClient(server.url) as c:
        yield c
