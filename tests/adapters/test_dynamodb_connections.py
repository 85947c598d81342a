"""The cloud ConnectionRegistry on DynamoDB (moto server)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import botocore.session
import pytest

from agentvm.adapters.aws.dynamodb_connections import DynamoDBConnections
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.domain.models import ConnectionRecord, Subscription


@pytest.fixture
async def registry(aws_env: None, aws_session: botocore.session.Session, moto_endpoint: str) -> AsyncIterator[
        DynamoDBConnections]:
    store = DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", session=aws_session, endpoint_url=moto_endpoint)
    await store.open()
    await store.create_table()
    yield DynamoDBConnections(store)
    await store.close()


async def test_connections_subscriptions_and_watches(registry: DynamoDBConnections) -> None:
    await registry.put_connection(ConnectionRecord("c1", "t1", "key_1", 100))
    await registry.put_connection(ConnectionRecord("c2", "t1", None, 200))
    assert await registry.get_connection("c1") == ConnectionRecord("c1", "t1", "key_1", 100)
    assert await registry.get_connection("nope") is None

    await registry.put_subscription("t1", "s1", Subscription("c1"))
    await registry.put_subscription("t1", "s1", Subscription("c2", after_seq=7, replayed_seq=9, pending=True))
    await registry.put_subscription("t2", "s1", Subscription("c9"))  # same session id, other tenant
    subs = sorted(await registry.subscribers("t1", "s1"), key=lambda s: s.connection_id)
    assert subs == [Subscription("c1"), Subscription("c2", 7, 9, True)]
    await registry.put_subscription("t1", "s1", Subscription("c2", after_seq=7, replayed_seq=12))  # overwrite
    assert Subscription("c2", 7, 12, False) in await registry.subscribers("t1", "s1")

    await registry.watch("t1", "user#1", "c1")
    await registry.watch("t1", "user#1", "c2")
    assert sorted(await registry.watchers("t1", "user#1")) == ["c1", "c2"]
    assert await registry.watchers("t2", "user#1") == []

    await registry.delete_connection("c2")
    assert await registry.get_connection("c2") is None
    assert [s.connection_id for s in await registry.subscribers("t1", "s1")] == ["c1"]
    assert await registry.watchers("t1", "user#1") == ["c1"]
    assert [s.connection_id for s in await registry.subscribers("t2", "s1")] == ["c9"]


async def test_expired_records_are_not_returned(registry: DynamoDBConnections) -> None:
    registry.ttl_s = -1  # written already expired: DynamoDB deletes lazily, reads must not see them
    await registry.put_connection(ConnectionRecord("c1", "t1", None, int(time.time())))
    await registry.put_subscription("t1", "s1", Subscription("c1"))
    await registry.watch("t1", "u1", "c1")
    assert await registry.get_connection("c1") is None
    assert await registry.subscribers("t1", "s1") == []
    assert await registry.watchers("t1", "u1") == []


async def test_a_tenant_scoped_registry_never_touches_connection_records(registry: DynamoDBConnections) -> None:
    """The container task's registry (adapters/aws/tenant_scope.py): only its tenant's SUBS#/WATCH# items."""
    await registry.put_connection(ConnectionRecord("c1", "t1", None, 100))
    await registry.put_subscription("t1", "s1", Subscription("c1", 0))  # ws_default: both items
    scoped = DynamoDBConnections(registry.store, tenant_scope="t1")
    await scoped.put_subscription("t1", "s1", Subscription("c1", 0, 7, False, 7))
    assert [s.replayed_seq for s in await scoped.subscribers("t1", "s1")] == [7]
    for refused in (scoped.put_subscription("t2", "s1", Subscription("c1", 0)), scoped.subscribers("t2", "s1"),
                    scoped.get_connection("c1"), scoped.put_connection(ConnectionRecord("c9", "t2", None, 1)),
                    scoped.authenticate("c1", "t2", None)):
        with pytest.raises(PermissionError, match="scoped to one tenant"):
            await refused
    # gone: the subscription it saw goes, the connection record stays for $disconnect / the TTL
    await scoped.delete_connection("c1")
    assert await scoped.subscribers("t1", "s1") == []
    record = await registry.get_connection("c1")
    assert record is not None and record.tenant_id == "t1"


async def test_a_batched_connection_is_marked_on_its_record_and_its_subscriptions(
        registry: DynamoDBConnections) -> None:
    await registry.put_connection(ConnectionRecord("cb", "t1", None, 100, batch=True))
    await registry.put_connection(ConnectionRecord("cs", "t1", None, 100))
    await registry.put_subscription("t1", "s1", Subscription("cb", since_seq=4, batch=True))
    await registry.put_subscription("t1", "s1", Subscription("cs"))
    assert await registry.get_connection("cb") == ConnectionRecord("cb", "t1", None, 100, frozenset({"s1"}),
                                                                 batch=True)
    assert (await registry.get_connection("cs")).batch is False  # type: ignore[union-attr]
    assert sorted(await registry.subscribers("t1", "s1"), key=lambda s: s.connection_id) == [
        Subscription("cb", since_seq=4, batch=True), Subscription("cs")]
