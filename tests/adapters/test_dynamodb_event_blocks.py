"""The DynamoDB event log as compressed blocks: one item for a checkpoint's events, split above the
item size limit, read after any seq, TTL, replays, pruning exactly like SQLite, and deletion."""

from __future__ import annotations

import base64
import itertools
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import botocore.session
import orjson
import pytest

from agentvm.adapters.aws.botocore_async import dummy_session
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.domain.models import Checkpoint, LoggedEvent, StoredMessage, Turn, TurnStatus
from tests.adapters.test_dynamodb_specifics import Calls, Clock, image, raw_partition
from tests.aws_fixtures import REGION

Item = dict[str, Any]
SESSION_PK = "SESS#t1#sess_i1"


@pytest.fixture
async def make_store(aws_env: None, aws_session: botocore.session.Session,
                     moto_endpoint: str) -> AsyncIterator[Callable[..., Awaitable[DynamoDBStore]]]:
    opened: list[DynamoDBStore] = []

    async def make(**options: Any) -> DynamoDBStore:
        options.setdefault("session", aws_session)
        store = DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", endpoint_url=moto_endpoint, **options)
        await store.open()
        await store.create_table()
        await store.create_image(*image("t1", "i1"))
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


@pytest.fixture
async def store(make_store: Callable[..., Awaitable[DynamoDBStore]]) -> DynamoDBStore:
    return await make_store()


def envelope(seq: int, type_: str = "text_delta", data: dict[str, Any] | None = None) -> str:
    """An event as the channel encodes it (~300 bytes for a text delta)."""
    return orjson.dumps({
        "type": type_, "timestamp": 1_795_348_133_184 + seq,
        "data": {"messageId": "msg_01TEXT", "delta": f"word{seq} "} if data is None else data,
        "source": "agent", "category": "stream", "intent": "notification",
        "context": {"containerId": "c1", "imageId": "img_mwrrx9gj_2ggj7367", "sessionId": "sess_mwrrx9gj_k70pm6z0",
                    "agentId": "agent_mwrrx9gr_7kku51ha"},
        "seq": seq}).decode()


def ev(seq: int, created: int | None = None, payload: str | None = None) -> LoggedEvent:
    return LoggedEvent(seq, "text_delta", envelope(seq) if payload is None else payload,
                       1_000 + seq if created is None else created)


def random_payload(seq: int, size: int, rnd: random.Random) -> str:
    """A tool result of about `size` bytes that does not compress (base64 of random bytes)."""
    content = base64.b64encode(rnd.randbytes(size * 3 // 4)).decode()
    return envelope(seq, "tool_result", {"toolUseId": "toolu_01", "content": content})


def item_bytes(item: Item) -> int:
    """DynamoDB's item size (names plus values; a number counted as its digits: an upper bound)."""
    def value(v: dict[str, Any]) -> int:
        [(kind, x)] = v.items()
        return len(x) if kind == "B" else len(str(x).encode())

    return sum(len(name.encode()) + value(v) for name, v in item.items())


async def event_items(store: DynamoDBStore, pk: str = SESSION_PK) -> dict[str, Item]:
    """The raw block items and parts (all pages: big blocks do not fit in one)."""
    params: dict[str, Any] = {"TableName": store.table_name, "KeyConditionExpression": "PK = :pk",
                              "ExpressionAttributeValues": {":pk": {"S": pk}}}
    items: dict[str, Item] = {}
    while True:
        resp = await store.client.query(**params)
        items.update((i["SK"]["S"], i) for i in resp["Items"] if i["SK"]["S"].startswith("EVB#"))
        if "LastEvaluatedKey" not in resp:
            return items
        params["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


async def seqs(store: DynamoDBStore, after: int = 0, limit: int = 10_000, sid: str = "sess_i1") -> list[int]:
    return [e.seq for e in await store.read_events("t1", sid, after, limit)]


# ---- writes --------------------------------------------------------------------------------------


async def test_a_checkpoint_of_30_events_is_one_put_request(
        make_store: Callable[..., Awaitable[DynamoDBStore]]) -> None:
    session = dummy_session(REGION)  # its own session: the handler must not see other tests' calls
    requests: list[list[Item]] = []

    def record(**kwargs: Any) -> None:
        body = orjson.loads(kwargs["params"]["body"])
        requests.append([r for rs in body["RequestItems"].values() for r in rs])

    session.register("before-call.dynamodb.BatchWriteItem", record)
    store = await make_store(session=session)
    await store.commit(Checkpoint("t1", "sess_i1", events=[ev(s) for s in range(1, 31)]))
    [[put]] = requests
    assert put["PutRequest"]["Item"]["SK"] == {"S": "EVB#00000000000000000030"}
    [block] = (await event_items(store)).values()
    assert {k: v for k, v in block.items() if k not in ("PK", "SK", "data", "expires_at")} == {
        "first_seq": {"N": "1"}, "last_seq": {"N": "30"}, "n": {"N": "30"}, "created_at": {"N": "1030"},
        "oldest_created_at": {"N": "1001"}}
    assert item_bytes(block) <= 2048  # ~9 KB of envelopes: 2 write units instead of 30
    # a whole text turn: message, events and turn in one request of three items
    requests.clear()
    turn = Turn("t1", "turn1", "sess_i1", "i1", "c1", "m_user", TurnStatus.COMPLETED, 10)
    message = StoredMessage("sess_i1", "m_asst", {"id": "m_asst", "timestamp": 12}, "turn1")
    await store.commit(Checkpoint("t1", "sess_i1", messages=[message], events=[ev(s) for s in range(31, 131)],
                                  turns=[turn]))
    assert [len(r) for r in requests] == [3]
    assert await seqs(store) == list(range(1, 131))


async def test_a_checkpoint_above_the_item_limit_is_split_and_a_big_event_continued_in_parts(
        store: DynamoDBStore) -> None:
    rnd = random.Random(7)
    big = {6: 1_000_000, 10: 200_000, 11: 200_000, 12: 250_000}
    events = [ev(s, payload=random_payload(s, big[s], rnd) if s in big else None) for s in range(1, 41)]
    await store.commit(Checkpoint("t1", "sess_i1", events=events))
    assert await store.read_events("t1", "sess_i1", 0) == events
    items = await event_items(store)
    assert all(item_bytes(i) < 400_000 and len(i["data"]["B"]) <= 300_000 for i in items.values())
    heads = {sk: i for sk, i in items.items() if len(sk) == len("EVB#00000000000000000001")}
    spans = sorted((int(i["first_seq"]["N"]), int(i["last_seq"]["N"]), int(i["n"]["N"])) for i in heads.values())
    assert sum(n for _, _, n in spans) == 40 and spans[0][0] == 1 and spans[-1][1] == 40
    assert all(last < first for (_, last, _), (first, _, _) in itertools.pairwise(spans))
    assert (6, 6, 1) in spans  # the 1 MB event alone, its ~760 KB of compressed data in 3 items
    assert sorted(sk for sk in items if sk.startswith("EVB#00000000000000000006")) == [
        "EVB#00000000000000000006", "EVB#00000000000000000006#0001", "EVB#00000000000000000006#0002"]
    assert heads["EVB#00000000000000000006"]["parts"] == {"N": "3"}
    # reads starting in, at and after the parted block
    assert await store.read_events("t1", "sess_i1", 5, limit=1) == [events[5]]
    assert await seqs(store, 6) == list(range(7, 41))
    assert await store.read_events("t1", "sess_i1", 9) == events[9:]
    # a newest block with parts: its last item is a part, whose key still gives the seq
    await store.commit(Checkpoint("t1", "sess_i1", events=[ev(50, payload=random_payload(50, 700_000, rnd))]))
    assert await store.last_seq("t1", "sess_i1") == 50
    assert await store.reserve_seqs("t1", "sess_i1", 10) == (51, 60)
    assert await store.delete_image("t1", "i1") is True
    assert await event_items(store) == {}


# ---- reads ---------------------------------------------------------------------------------------


async def test_read_events_after_any_seq_across_blocks_and_gaps_honours_the_limit(store: DynamoDBStore) -> None:
    batches = [list(range(1, 11)), list(range(11, 21)), list(range(25, 31)), [31]]
    for batch in batches:
        await store.commit(Checkpoint("t1", "sess_i1", events=[ev(s) for s in batch]))
    logged = [s for batch in batches for s in batch]
    for after in range(-1, 33):
        assert await seqs(store, after) == [s for s in logged if s > after], after
        for limit in (1, 3, 8, 15):
            assert await seqs(store, after, limit) == [s for s in logged if s > after][:limit], (after, limit)
    assert await store.read_events("t1", "sess_i1", 0, limit=0) == []
    got = await store.read_events("t1", "sess_i1", 12, limit=2)
    assert got == [ev(13), ev(14)]  # type, payload and created_at come back as written
    calls = Calls(store)
    assert await seqs(store, 5, 3) == [6, 7, 8]
    [(name, params)] = calls.log
    assert name == "Query" and params["Limit"] == 3
    assert await seqs(store, 0, 10_000, sid="sess_nope") == []
    assert await store.last_seq("t1", "sess_i1") == 31


async def test_replayed_checkpoints_rewrite_the_same_items_and_each_seq_is_read_once(
        make_store: Callable[..., Awaitable[DynamoDBStore]]) -> None:
    store = await make_store(clock=Clock())
    first = Checkpoint("t1", "sess_i1", events=[ev(s) for s in range(1, 6)])
    await store.commit(first)
    before = await raw_partition(store, SESSION_PK)
    await store.commit(first)
    assert await raw_partition(store, SESSION_PK) == before
    # a failed checkpoint's events come back ahead of newer ones: blocks 1-5 and 1-10 both exist
    await store.commit(Checkpoint("t1", "sess_i1", events=[ev(s) for s in range(1, 11)]))
    assert sorted(await event_items(store)) == ["EVB#00000000000000000005", "EVB#00000000000000000010"]
    assert await seqs(store) == list(range(1, 11))
    assert await seqs(store, 3) == list(range(4, 11))
    assert await seqs(store, 3, 4) == [4, 5, 6, 7]
    assert await seqs(store, 5) == list(range(6, 11))
    # a seq twice in one checkpoint: the first wins, like INSERT OR IGNORE
    await store.commit(Checkpoint("t1", "sess_i1", events=[ev(11, payload='{"a":1}'), ev(11, payload='{"b":2}')]))
    assert [e.payload for e in await store.read_events("t1", "sess_i1", 10)] == ['{"a":1}']


async def test_expired_blocks_are_not_read_parts_included(
        make_store: Callable[..., Awaitable[DynamoDBStore]]) -> None:
    clock = Clock()
    store = await make_store(clock=clock, event_ttl_s=60)
    await store.commit(Checkpoint("t1", "sess_i1", events=[ev(s) for s in range(1, 4)]))
    clock.now += 30
    big = ev(4, payload=random_payload(4, 500_000, random.Random(1)))
    await store.commit(Checkpoint("t1", "sess_i1", events=[big]))
    clock.now += 31  # the first block has expired; DynamoDB has not deleted it yet
    assert await store.read_events("t1", "sess_i1", 0) == [big]
    assert await store.last_seq("t1", "sess_i1") == 4
    clock.now += 30
    assert await store.read_events("t1", "sess_i1", 0) == []
    assert await store.last_seq("t1", "sess_i1") == 0
    assert await store.reserve_seqs("t1", "sess_i1", 10) == (5, 14)  # seqs still never go back


# ---- pruning -------------------------------------------------------------------------------------

#: Checkpoints per session as (seq, created_at) lists, and the cutoffs pruned with, in order.
PRUNE_SCENARIOS: dict[str, tuple[dict[str, list[list[tuple[int, int]]]], list[int]]] = {
    "old blocks go whole, the newest keeps its last event": (
        {"sess_i1": [[(1, 100), (2, 200), (3, 300)], [(4, 400), (5, 500)], [(6, 600)]],
         "sess_i2": [[(7, 100)], [(8, 150), (9, 900)]]},
        [250, 450, 10_000, 10_000]),
    "a block crossing the cutoff is cut": (
        {"sess_i1": [[(1, 100), (2, 200), (3, 300), (4, 400)], [(10, 1000)]]},
        [250, 350, 350]),
    "a block whose last event is older than an earlier one": (
        {"sess_i1": [[(1, 500), (2, 100)], [(3, 600)], [(4, 50), (5, 60)]]},
        [300, 550, 10_000]),
}


@pytest.mark.parametrize("scenario", sorted(PRUNE_SCENARIOS))
async def test_prune_removes_exactly_what_sqlite_removes(store: DynamoDBStore, tmp_path: Path,
                                                         scenario: str) -> None:
    sessions, cutoffs = PRUNE_SCENARIOS[scenario]
    sqlite = SqliteStore(tmp_path / "agentvm.db")
    await sqlite.open()
    try:
        for sid in sessions:
            if sid != "sess_i1":
                await store.create_image(*image("t1", sid.removeprefix("sess_")))
            await sqlite.create_image(*image("t1", sid.removeprefix("sess_")))
        for sid, checkpoints in sessions.items():
            for cp in checkpoints:
                for s in (store, sqlite):
                    await s.commit(Checkpoint("t1", sid, events=[ev(seq, created) for seq, created in cp]))
        ttl_before = {sk: i["expires_at"] for sk, i in (await event_items(store)).items()}
        for cutoff in cutoffs:
            assert await store.prune_events(cutoff) == await sqlite.prune_events(cutoff), cutoff
            for sid in sessions:
                assert await store.read_events("t1", sid, 0) == await sqlite.read_events("t1", sid, 0), (cutoff, sid)
                assert await store.last_seq("t1", sid) == await sqlite.last_seq("t1", sid)
        after = await event_items(store)
        assert all(i["expires_at"] == ttl_before[sk] for sk, i in after.items() if sk in ttl_before)
    finally:
        await sqlite.close()


async def test_prune_deletes_a_big_block_with_its_parts_and_cuts_the_newest_block_once(store: DynamoDBStore) -> None:
    rnd = random.Random(3)
    await store.commit(Checkpoint("t1", "sess_i1", events=[ev(1, 100, random_payload(1, 800_000, rnd))]))
    await store.commit(Checkpoint("t1", "sess_i1", events=[ev(s, 100 * s) for s in range(2, 6)]))
    assert len(await event_items(store)) == 4  # the big block's head and 2 parts, and the newest block
    calls = Calls(store)
    assert await store.prune_events(older_than_ms=10_000) == 4
    assert sorted(await event_items(store)) == ["EVB#00000000000000000005"]
    assert await seqs(store) == [5]
    writes = [next(iter(p["RequestItems"].values())) for n, p in calls.log if n == "BatchWriteItem"]
    assert [sorted(next(iter(r)) for r in w) for w in writes] == [["DeleteRequest"] * 3 + ["PutRequest"]]
    # cut down to its last event, the newest block costs no further write
    calls.log.clear()
    assert await store.prune_events(older_than_ms=10_000) == 0
    assert calls.take() == ["Query"] * 9
