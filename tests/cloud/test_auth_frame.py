"""The first-frame `auth` in the cloud: `$connect` without credentials is accepted unauthenticated,
and its first frame must be `{"type": "auth", "headers": {"Authorization": "Bearer <key>"}}` within
AVM_AUTH_TIMEOUT_S (docs/tenancy.md). The real handlers run behind the emulated API Gateway edge
(tests/support/cloud_edge.py), against DynamoDB and the management API on moto."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from agentvm.adapters.aws.dynamodb_connections import DynamoDBConnections
from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.auth.api_keys import new_key
from agentvm.cloud import runtime as cloud_runtime
from agentvm.domain.models import ConnectionRecord
from agentvm.drivers.scripted import ScriptedDriver
from tests.aws_fixtures import moto_table, put_new_key, without_agentvm_env
from tests.support.cloud_edge import CloudEdge, cloud_edge
from tests.support.stock_client import StockClient

TENANT = "acme"
AUTH_TIMEOUT_S = 0.5


@dataclass
class Cloud:
    edge: CloudEdge
    store: DynamoDBStore
    token: str
    key_id: str

    @property
    def registry(self) -> DynamoDBConnections:
        return DynamoDBConnections(self.store)


@pytest.fixture
async def cloud(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cloud]:
    without_agentvm_env(monkeypatch)
    driver = ScriptedDriver()
    monkeypatch.setattr(cloud_runtime, "build_driver", lambda *args, **kwargs: driver)
    async with moto_table(moto_endpoint) as store:
        key, token = await put_new_key(store, TENANT)
        # no token: the edge's URL carries no credentials, as a browser's upgrade
        async with cloud_edge(moto_endpoint=moto_endpoint, token=None, table_name=store.table_name) as edge:
            for name, value in {**edge.handler_env(), "AVM_CHAT_TURN_FUNCTION": "agentvm-chat-turn:live",
                                "AVM_RELIABLE_WRAPPER": "false", "AVM_AUTH_TIMEOUT_S": str(AUTH_TIMEOUT_S)}.items():
                monkeypatch.setenv(name, value)
            yield Cloud(edge, store, token, key.key_id)


def auth(token: str) -> dict[str, Any]:
    return {"type": "auth", "headers": {"Authorization": f"Bearer {token}"}}


async def only_connection(cloud: Cloud, before: set[str]) -> str:
    [cid] = cloud.edge.connection_ids() - before
    return cid


async def refused(cloud: Cloud, client: StockClient, cid: str, reason: str, *, within_s: float) -> None:
    """The connection got a system_error with the reason, then was deleted (socket and record)."""
    await asyncio.wait_for(client.closed.wait(), within_s)
    await cloud.edge.settle()
    errors = [f for f in cloud.edge.frames_posted(cid) if isinstance(f, dict) and f.get("type") == "system_error"]
    assert [e["data"]["code"] for e in errors] == ["unauthorized"], cloud.edge.frames_posted(cid)
    assert errors[0]["data"]["message"].startswith(reason), errors[0]
    assert cloud.edge.closed_connections[cid] == (1000, "Connection deleted")
    assert await cloud.registry.get_connection(cid) is None


async def test_a_first_auth_frame_authenticates_and_the_next_frames_run_under_its_tenant(cloud: Cloud) -> None:
    before = cloud.edge.connection_ids()
    async with StockClient(cloud.edge.url) as client:
        cid = await only_connection(cloud, before)
        pending = await cloud.registry.get_connection(cid)
        assert pending is not None and not pending.authenticated and pending.tenant_id == ""
        # sent without waiting: API Gateway runs the two frames concurrently, the request waits for the auth
        await client.send_raw(auth(cloud.token))
        image = await client.new_image("user-1", name="Helper")
        record = await cloud.registry.get_connection(cid)
        assert record is not None and record.authenticated
        assert (record.tenant_id, record.key_id) == (TENANT, cloud.key_id)
        events = await client.turn(image["imageId"], "hello there", timeout=20)
        assert events[-1]["type"] == "turn_response"
        # a later auth frame is ignored, as on avm serve
        await client.send_raw(auth("avmk_000000000000.nope"))
        await client.request("container_list_request")
        await cloud.edge.settle(include_invokes=True)
    # everything was written under the key's tenant
    assert await cloud.store.get_image(TENANT, image["imageId"]) is not None
    assert [c.container_id for c in await cloud.store.list_containers(TENANT)] == ["user-1"]
    assert "nope" not in json.dumps(cloud.edge.frames_posted(cid))
    # the auth frame was answered with nothing
    assert client.events[0]["type"] in ("container_created", "container_create_response")
    assert not any(e["type"] == "system_error" for e in client.events)


async def test_a_frame_that_overtakes_the_auth_frame_waits_for_it(cloud: Cloud) -> None:
    before = cloud.edge.connection_ids()
    async with StockClient(cloud.edge.url) as client:
        cid = await only_connection(cloud, before)

        async def authenticate_later() -> float:
            await asyncio.sleep(0.3)
            assert await cloud.registry.authenticate(cid, TENANT, cloud.key_id)
            return asyncio.get_running_loop().time()

        # the request's invocation finds the connection unauthenticated; the auth lands 0.3 s later
        late = asyncio.get_running_loop().create_task(authenticate_later())
        answer = await client.request("container_list_request")
        answered = asyncio.get_running_loop().time()
        assert answer["type"] == "container_list_response" and "error" not in answer["data"]
        assert answered >= await late


async def test_any_other_first_frame_gets_an_error_and_the_connection_is_deleted(cloud: Cloud) -> None:
    before = cloud.edge.connection_ids()
    async with StockClient(cloud.edge.url) as client:
        cid = await only_connection(cloud, before)
        await client.send_raw({"type": "container_list_request", "data": {"requestId": "r1"}})
        await refused(cloud, client, cid, "API key required: send", within_s=AUTH_TIMEOUT_S + 5)
    assert not any(e.get("type") == "container_list_response" for e in client.events)


async def test_a_first_frame_that_is_not_json_is_refused(cloud: Cloud) -> None:
    before = cloud.edge.connection_ids()
    async with StockClient(cloud.edge.url) as client:
        cid = await only_connection(cloud, before)
        await client.send_raw("{not json")
        await refused(cloud, client, cid, "API key required: the first frame is not JSON",
                      within_s=AUTH_TIMEOUT_S + 5)


@pytest.mark.parametrize(("frame", "reason"), [
    (auth("avmk_000000000000.nope"), "API key not valid"),
    ({"type": "auth", "headers": "Bearer x"}, "API key required: send"),
    ({"type": "auth", "headers": {"Authorization": "Basic eDp5"}}, "API key required"),
], ids=["bad-key", "malformed", "no-bearer"])
async def test_a_bad_auth_frame_is_refused_at_once(cloud: Cloud, frame: dict[str, Any], reason: str) -> None:
    before = cloud.edge.connection_ids()
    async with StockClient(cloud.edge.url) as client:
        cid = await only_connection(cloud, before)
        await client.send_raw(frame)
        # refused for what the frame holds, not for a missed deadline (that reason would be "no auth
        # frame within …"); the time allowed is generous only for a loaded machine
        await refused(cloud, client, cid, reason, within_s=AUTH_TIMEOUT_S + 5)


async def test_an_auth_frame_after_the_deadline_is_refused(cloud: Cloud) -> None:
    before = cloud.edge.connection_ids()
    async with StockClient(cloud.edge.url) as client:
        cid = await only_connection(cloud, before)
        await asyncio.sleep(AUTH_TIMEOUT_S + 0.2)
        await client.send_raw(auth(cloud.token))
        await refused(cloud, client, cid, f"API key required: no auth frame within {AUTH_TIMEOUT_S:g} s", within_s=5)


async def test_an_auth_frame_received_in_time_authenticates_however_late_it_is_handled(
        cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline judges when API Gateway received the frame (`requestTimeEpoch`), not when a loaded
    function got to it: a slow read of the connection's record must not refuse a client that was on time."""
    before = cloud.edge.connection_ids()
    async with StockClient(cloud.edge.url) as client:
        cid = await only_connection(cloud, before)
        read = DynamoDBConnections.get_connection

        async def slow(self: DynamoDBConnections, connection_id: str) -> ConnectionRecord | None:
            await asyncio.sleep(AUTH_TIMEOUT_S + 0.3)
            return await read(self, connection_id)

        monkeypatch.setattr(DynamoDBConnections, "get_connection", slow)
        await client.send_raw(auth(cloud.token))
        await cloud.edge.settle(include_invokes=True)
        monkeypatch.setattr(DynamoDBConnections, "get_connection", read)
        record = await cloud.registry.get_connection(cid)
        assert record is not None and record.authenticated and record.tenant_id == TENANT
        assert (await client.request("container_list_request"))["type"] == "container_list_response"
        assert not any(e["type"] == "system_error" for e in client.events)


async def test_a_bad_key_on_the_upgrade_is_still_refused_at_connect(cloud: Cloud) -> None:
    for url in (f"{cloud.edge.url}?token=avmk_000000000000.nope", f"{cloud.edge.url}?token={cloud.token[:-3]}AAA"):
        with pytest.raises(InvalidStatus) as info:
            async with connect(url):
                pass
        assert info.value.response.status_code == 401
    # a good key on the upgrade needs no auth frame
    async with StockClient(f"{cloud.edge.url}?token={cloud.token}") as client:
        assert (await client.request("container_list_request"))["type"] == "container_list_response"


async def test_the_first_of_two_auth_frames_wins(cloud: Cloud) -> None:
    other_key, _other_token = new_key("other-tenant")
    await DynamoDBKeys(cloud.store).put_key(other_key)
    record = ConnectionRecord(f"c{uuid.uuid4().hex[:8]}=", "", None, 1, authenticated=False)
    await cloud.registry.put_connection(record)
    assert await cloud.registry.authenticate(record.connection_id, TENANT, cloud.key_id) is True
    assert await cloud.registry.authenticate(record.connection_id, "other-tenant", other_key.key_id) is False
    got = await cloud.registry.get_connection(record.connection_id)
    assert got is not None and got.authenticated and (got.tenant_id, got.key_id) == (TENANT, cloud.key_id)
    # a connection that is gone cannot be authenticated
    assert await cloud.registry.authenticate("never-connected=", TENANT, cloud.key_id) is False
