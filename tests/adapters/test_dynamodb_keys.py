"""The KeyStore on DynamoDB (moto server)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator

import botocore.session
import pytest

from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.auth.api_keys import Authenticator, new_key, verify
from agentvm.domain.models import Principal
from agentvm.errors import Conflict, Unauthorized

NOW = 1_700_000_000_000


@pytest.fixture
async def keys(aws_env: None, aws_session: botocore.session.Session, moto_endpoint: str) -> AsyncIterator[
        DynamoDBKeys]:
    store = DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", session=aws_session, endpoint_url=moto_endpoint)
    await store.open()
    await store.create_table()
    yield DynamoDBKeys(store)
    await store.close()


async def test_put_and_get_round_trip(keys: DynamoDBKeys) -> None:
    full, token = new_key("t1", ("admin", "user"), name="deploy bot", expires_at=NOW + 5000, now_ms=NOW)
    bare, _ = new_key("t1", now_ms=NOW)
    await keys.put_key(full)
    await keys.put_key(bare)
    assert await keys.get_key(full.key_id) == full
    assert await keys.get_key(bare.key_id) == bare
    assert await keys.get_key("avmk_ffffffffffff") is None
    got = await keys.get_key(full.key_id)
    assert got is not None and verify(got, token.split(".")[1], NOW)


async def test_put_never_overwrites(keys: DynamoDBKeys) -> None:
    key, _ = new_key("t1", now_ms=NOW)
    await keys.put_key(key)
    impostor = dataclasses.replace(key, tenant_id="t2", salt="0" * 32)
    with pytest.raises(Conflict) as info:
        await keys.put_key(impostor)
    assert info.value.field == "key_id"
    assert await keys.get_key(key.key_id) == key


async def test_list_is_newest_first_and_per_tenant(keys: DynamoDBKeys) -> None:
    mine = [new_key("t1", now_ms=NOW + i)[0] for i in (3, 1, 2)]
    theirs, _ = new_key("t2", now_ms=NOW + 10)
    # `#` in a tenant id is escaped inside the index key, and the id reads back unchanged.
    tricky, _ = new_key("t1#KEY", now_ms=NOW + 11)
    for key in [*mine, theirs, tricky]:
        await keys.put_key(key)
    assert [k.created_at for k in await keys.list_keys("t1")] == [NOW + 3, NOW + 2, NOW + 1]
    assert await keys.list_keys("t2") == [theirs]
    assert await keys.list_keys("t1#KEY") == [tricky]
    assert await keys.list_keys("nobody") == []


async def test_list_pages_through_many_keys(keys: DynamoDBKeys) -> None:
    # Big records make the index query answer in several 1 MB pages.
    for i in range(40):
        key, _ = new_key("t1", now_ms=NOW + i)
        await keys.put_key(dataclasses.replace(key, name="x" * 30_000))
    queries: list[str] = []
    keys.store.client.meta.events.register("before-call.dynamodb.Query", lambda **kw: queries.append("q"))
    listed = await keys.list_keys("t1")
    assert [k.created_at for k in listed] == [NOW + i for i in reversed(range(40))]
    assert len(queries) >= 2


async def test_revoke_keeps_the_first_time_and_isolates_tenants(keys: DynamoDBKeys) -> None:
    key, _ = new_key("t1", now_ms=NOW)
    await keys.put_key(key)
    assert await keys.revoke_key("t2", key.key_id, NOW + 1) is False  # another tenant's key reads as absent
    assert (await keys.get_key(key.key_id)) == key
    assert await keys.revoke_key("t1", "avmk_ffffffffffff", NOW + 1) is False
    assert await keys.get_key("avmk_ffffffffffff") is None  # a failed revoke creates nothing
    assert await keys.revoke_key("t1", key.key_id, NOW + 2) is True
    assert await keys.revoke_key("t1", key.key_id, NOW + 3) is True
    stored = await keys.get_key(key.key_id)
    assert stored == dataclasses.replace(key, revoked_at=NOW + 2)
    assert (await keys.list_keys("t1"))[0].revoked_at == NOW + 2


async def test_authenticator_on_dynamodb(keys: DynamoDBKeys) -> None:
    key, token = new_key("t1", now_ms=NOW)
    await keys.put_key(key)
    auth = Authenticator(keys)
    assert await auth.authenticate(token) == Principal("t1", key.key_id)
    await keys.revoke_key("t1", key.key_id, NOW)
    auth.invalidate(key.key_id)
    with pytest.raises(Unauthorized, match="API key revoked"):
        await auth.authenticate(token)
