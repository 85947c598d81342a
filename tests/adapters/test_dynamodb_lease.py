"""The session publish lease on DynamoDB: exclusive, expiring, re-entrant, with seq blocks."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import botocore.session
import pytest

from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.domain.models import Image, Session


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(aws_env: None, aws_session: botocore.session.Session,
                moto_endpoint: str) -> AsyncIterator[DynamoDBStore]:
    clock = Clock()
    s = DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", session=aws_session, endpoint_url=moto_endpoint,
                      clock=clock)
    await s.open()
    await s.create_table()
    await s.create_image(Image("t1", "i1", "c1", "s1", "n", 1, 1), Session("t1", "s1", "i1", "c1", 1, 1))
    yield s
    await s.close()


async def test_lease_is_exclusive_reentrant_and_expires(store: DynamoDBStore) -> None:
    clock = store._clock
    assert isinstance(clock, Clock)
    assert await store.acquire_lease("t1", "s1", "turn-A", 30_000, seq_block=100) == (1, 100)
    assert await store.acquire_lease("t1", "s1", "ws-B", 30_000, seq_block=100) is None
    assert await store.acquire_lease("t1", "s1", "turn-A", 30_000, seq_block=100) == (101, 200)  # re-entrant
    assert await store.renew_lease("t1", "s1", "ws-B", 30_000) is False
    assert await store.renew_lease("t1", "s1", "turn-A", 30_000) is True
    clock.now += 31  # the holder died without releasing: the lease expires
    assert await store.acquire_lease("t1", "s1", "ws-B", 30_000, seq_block=10) == (201, 210)
    assert await store.release_lease("t1", "s1", "turn-A") is False  # no longer the owner
    assert await store.release_lease("t1", "s1", "ws-B") is True
    assert await store.acquire_lease("t1", "s1", "turn-C", 30_000, seq_block=10) == (211, 220)
    # seqs from the lease and from reserve_seqs never overlap
    assert await store.reserve_seqs("t1", "s1", 10) == (221, 230)


async def test_lease_of_another_tenant_or_a_missing_session_is_refused(store: DynamoDBStore) -> None:
    assert await store.acquire_lease("t2", "s1", "x", 30_000, seq_block=10) is None
    assert await store.acquire_lease("t1", "nope", "x", 30_000, seq_block=10) is None


async def test_concurrent_acquirers_get_exactly_one_lease(store: DynamoDBStore) -> None:
    results = await asyncio.gather(*(store.acquire_lease("t1", "s1", f"owner-{i}", 30_000, seq_block=10)
                                     for i in range(10)))
    assert sum(r is not None for r in results) == 1
