"""The operator's usage export read as a stream: every tenant's records of a time range, in GSI2 key
order (`{ended}#{tenant}#{record}`), never more than a few pages in memory.

A month's records are 8 GSI2 partitions (`USAGEMON#{yyyy-mm}#{shard}`, dynamodb_usage.py), each one
sorted by its key. Each shard is read a page of `page_size` items at a time (a Query with `Limit`;
DynamoDB also ends a page at 1 MB), with its next page fetched while the current one is consumed, and
the shards are merged on their sort key: at most 2 pages per shard are held, 16 pages in all, whatever
the month's size. Months follow one another (their time ranges do not overlap)."""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

from agentvm.adapters.aws.dynamodb_items import SHARDS, Item, _s, _ts
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.dynamodb_table import GSI_CONTAINER
from agentvm.domain.usage import UsageRecord

#: Items per Query page of the stream (about 1 KB each: DynamoDB's own 1 MB page holds about as many).
EXPORT_PAGE: Final = 1000

Page = tuple[list[Item], Item | None]


class _Shard:
    """One GSI2 partition read page by page, the next page always on its way."""

    def __init__(self, store: DynamoDBStore, params: Mapping[str, Any], page_size: int) -> None:
        self._store = store
        self._params = {**params, "Limit": page_size}
        self.items: deque[Item] = deque()
        self._next: asyncio.Task[Page] | None = asyncio.ensure_future(self._fetch(None))

    async def _fetch(self, start: Item | None) -> Page:
        params = dict(self._params)
        if start is not None:
            params["ExclusiveStartKey"] = start
        resp = await self._store.client.query(TableName=self._store.table_name, **params)
        return list(resp.get("Items", [])), resp.get("LastEvaluatedKey")

    async def fill(self) -> bool:
        """Make `items` non-empty from the next pages; False when the partition is read to its end."""
        while not self.items and self._next is not None:
            items, last = await self._next
            self._next = asyncio.ensure_future(self._fetch(last)) if last else None
            self.items.extend(items)
        return bool(self.items)

    def cancel(self) -> None:
        if self._next is not None:
            self._next.cancel()
            self._next = None


async def stream_all(store: DynamoDBStore, months: list[str], since_ms: int, until_ms: int,
                     record: Callable[[Item], UsageRecord], shard_pk: Callable[[str, int], str],
                     page_size: int | None = None) -> AsyncIterator[UsageRecord]:
    """Every tenant's records with since_ms <= ended_at < until_ms, in GSI2 key order (pages of
    `page_size` items, EXPORT_PAGE by default)."""
    page_size = page_size or EXPORT_PAGE
    bounds = {":lo": _s(_ts(since_ms)), ":hi": _s(_ts(until_ms))}
    for month in months:
        shards = [_Shard(store, {"IndexName": GSI_CONTAINER,
                                 "KeyConditionExpression": "G2PK = :pk AND G2SK BETWEEN :lo AND :hi",
                                 "ExpressionAttributeValues": {":pk": _s(shard_pk(month, s)), **bounds}}, page_size)
                  for s in range(SHARDS)]
        try:
            heap: list[tuple[str, int]] = []
            for i, shard in enumerate(shards):
                if await shard.fill():
                    heap.append((shard.items[0]["G2SK"]["S"], i))
            heapq.heapify(heap)
            while heap:
                _key, i = heap[0]
                shard = shards[i]
                yield record(shard.items.popleft())
                if await shard.fill():
                    heapq.heapreplace(heap, (shard.items[0]["G2SK"]["S"], i))
                else:
                    heapq.heappop(heap)
        finally:
            for shard in shards:
                shard.cancel()
