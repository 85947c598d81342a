"""The process's cache of session histories: a full read once, then only what was created since."""

from __future__ import annotations

import asyncio
from typing import Any

from agentvm.domain.models import StoredMessage
from agentvm.engine.history import SessionHistory
from agentvm.engine.history_cache import SKEW_MS, HistoryCache


def _msg(mid: str, ts: int, turn: str, role: str = "user") -> StoredMessage:
    return StoredMessage("s", mid, {"id": mid, "role": role, "subtype": role, "content": "x" * 10, "timestamp": ts},
                         turn)


class FakeMessages:
    """Messages with a creation time, stored in order; records each read."""

    def __init__(self) -> None:
        self.rows: list[StoredMessage] = []
        self.reads: list[Any] = []

    async def list_messages(self, tenant_id: str, session_id: str) -> list[StoredMessage]:
        self.reads.append("all")
        return list(self.rows)

    async def list_messages_since(self, tenant_id: str, session_id: str, since_ms: int) -> list[StoredMessage]:
        self.reads.append(since_ms)
        return [m for m in self.rows if m.body["timestamp"] >= since_ms]


def test_a_session_is_read_whole_once_then_topped_up_from_its_last_read() -> None:
    clock = [1000.0]
    cache, store = HistoryCache(1 << 20, clock=lambda: clock[0]), FakeMessages()
    store.rows = [_msg("u1", 999_000, "t1"), _msg("a1", 999_500, "t1", "assistant")]
    assert [m.message_id for m in asyncio.run(cache.read(store, "t", "s"))] == ["u1", "a1"]
    clock[0] = 1010.0
    store.rows.append(_msg("u2", 1_009_000, "t2"))
    got = asyncio.run(cache.read(store, "t", "s", expect={"u2"}))
    assert [m.message_id for m in got] == ["u1", "a1", "u2"]
    assert store.reads == ["all", 1_000_000 - SKEW_MS]
    assert (cache.full_reads, cache.top_ups, cache.misses) == (1, 1, 0)


def test_a_user_message_stored_late_is_caught_and_the_history_read_again() -> None:
    clock = [1000.0]
    cache, store = HistoryCache(1 << 20, clock=lambda: clock[0]), FakeMessages()
    store.rows = [_msg("u1", 999_000, "t1")]
    asyncio.run(cache.read(store, "t", "s"))
    clock[0] = 1100.0
    # created long before the last read, stored after it (a slow ws_default); its turn ran elsewhere
    store.rows += [_msg("u2", 990_000, "t2"), _msg("a2", 1_050_000, "t2", "assistant")]
    got = asyncio.run(cache.read(store, "t", "s"))
    assert [m.message_id for m in got] == ["u1", "u2", "a2"]
    assert (cache.full_reads, cache.top_ups, cache.misses) == (2, 1, 1)
    # the same when the late message is the one of the turn about to run
    clock[0] = 1200.0
    store.rows.append(_msg("u3", 900_000, "t3"))
    got = asyncio.run(cache.read(store, "t", "s", expect={"u3"}))
    assert got[-1].message_id == "u3" and cache.misses == 2


def test_messages_stored_by_this_process_join_the_cache_and_the_size_is_bounded() -> None:
    cache, store = HistoryCache(1000, clock=lambda: 1000.0), FakeMessages()
    store.rows = [_msg("u1", 999_000, "t1")]
    history = SessionHistory(store, "t", "s", cache=cache, recent=store)  # type: ignore[arg-type]
    asyncio.run(history.load())
    history.extend([_msg("a1", 999_100, "t1", "assistant")])
    assert [m.message_id for m in asyncio.run(cache.read(store, "t", "s"))] == ["u1", "a1"]
    assert 0 < cache.size <= 1000
    for n in range(5):  # other sessions push the least recently used out
        asyncio.run(cache.read(store, "t", f"other{n}"))
    assert cache.size <= 1000
    asyncio.run(cache.read(store, "t", "s"))
    assert store.reads.count("all") == 1 + 5 + 1
