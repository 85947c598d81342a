"""What the Store contract cannot see about the DynamoDB store: the requests it sends (no Scan, few
writes), TTL, concurrency of the counters and conditional puts, and the single-table details."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import botocore.session
import pytest

from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.dynamodb_table import DEFAULT_EVENT_TTL_S, GSI_SPARSE, TABLE_DEFINITION
from agentvm.domain.models import (
    Agent,
    Checkpoint,
    Container,
    Image,
    LoggedEvent,
    ResourceVersion,
    Session,
    StoredMessage,
    Turn,
    TurnStatus,
    Usage,
)
from agentvm.errors import Conflict
from tests.support.dynamodb_calls import Calls


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def make_store(aws_env: None, aws_session: botocore.session.Session,
                     moto_endpoint: str) -> AsyncIterator[Callable[..., Awaitable[DynamoDBStore]]]:
    opened: list[DynamoDBStore] = []

    async def make(**options: Any) -> DynamoDBStore:
        store = DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", session=aws_session, endpoint_url=moto_endpoint,
                              **options)
        await store.open()
        await store.create_table()
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


@pytest.fixture
async def store(make_store: Callable[..., Awaitable[DynamoDBStore]]) -> DynamoDBStore:
    return await make_store()


def image(tenant: str, iid: str, container: str = "c1", created: int = 1,
          config: dict[str, Any] | None = None) -> tuple[Image, Session]:
    return (Image(tenant, iid, container, f"sess_{iid}", f"name {iid}", created, created, "d", "sys",
                  {"model": "m"} if config is None else config),
            Session(tenant, f"sess_{iid}", iid, container, created, created))


def text_turn_checkpoint(tenant: str, sid: str, iid: str, first_seq: int, n_events: int) -> Checkpoint:
    turn = Turn(tenant, "turn1", sid, iid, "c1", "m_user", TurnStatus.COMPLETED, 10, model="claude",
                usage=Usage(1200, 300, 0, 0), list_cost="0.0081", billed_cost="0.008505", started_at=11, ended_at=20)
    body = {"id": "m_asst", "role": "assistant", "subtype": "assistant", "content": "hello", "timestamp": 12}
    events = [LoggedEvent(first_seq + i, "text_delta", f'{{"seq":{first_seq + i}}}', 12 + i) for i in range(n_events)]
    return Checkpoint(tenant, sid, messages=[StoredMessage(sid, "m_asst", body, "turn1")], events=events,
                      turns=[turn])


def resource(tenant: str, rid: str, version: str, *, published: bool = False, name: str = "p") -> ResourceVersion:
    key = ".".join(f"{int(p):06d}" for p in version.split("."))
    return ResourceVersion(tenant, rid, "prompt", name, version, key, {"v": version}, f"sha256:{version}",
                           published=published)


async def raw_partition(store: DynamoDBStore, pk: str) -> list[dict[str, Any]]:
    resp = await store.client.query(TableName=store.table_name, KeyConditionExpression="PK = :pk",
                                    ExpressionAttributeValues={":pk": {"S": pk}})
    return list(resp["Items"])


async def sparse_index(store: DynamoDBStore) -> list[str]:
    resp = await store.client.scan(TableName=store.table_name, IndexName=GSI_SPARSE)  # test inspection only
    return sorted(i["SPK"]["S"].rsplit("#", 1)[0] + " " + i["SK"]["S"] for i in resp["Items"])


# ---- requests ------------------------------------------------------------------------------------


async def test_every_request_path_uses_keyed_reads_and_writes_and_never_scans(store: DynamoDBStore) -> None:
    calls = Calls(store)
    img, sess = image("t1", "i1")
    cp = text_turn_checkpoint("t1", "sess_i1", "i1", 1, 12)
    running = Turn("t1", "turn2", "sess_i1", "i1", "c1", "m2", TurnStatus.RUNNING, 30)
    agent = Agent("t1", "a1", "i1", "c1", "n", 1)
    first = resource("t1", "r1", "1.0.0", published=True)
    ops = {
        "create_container": await calls.ops(store.create_container(Container("t1", "c1", 1, 1))),
        "create_container again": await calls.ops(store.create_container(Container("t1", "c1", 1, 1))),
        "get_container": await calls.ops(store.get_container("t1", "c1")),
        "list_containers": await calls.ops(store.list_containers("t1")),
        "create_image": await calls.ops(store.create_image(img, sess)),
        "get_image": await calls.ops(store.get_image("t1", "i1")),
        "list_images": await calls.ops(store.list_images("t1")),
        "list_images of a container": await calls.ops(store.list_images("t1", "c1")),
        "update_image": await calls.ops(store.update_image("t1", "i1", name="x", description=None, updated_at=2)),
        "get_session": await calls.ops(store.get_session("t1", "sess_i1")),
        "create_session": await calls.ops(store.create_session(Session("t1", "sess_b", "i1", "c1", 3, 3, "b"))),
        "list_sessions": await calls.ops(store.list_sessions("t1", "i1")),
        "delete_session": await calls.ops(store.delete_session("t1", "sess_b")),
        "delete_session again": await calls.ops(store.delete_session("t1", "sess_b")),
        "put_agent": await calls.ops(store.put_agent(agent)),
        "put_agent again": await calls.ops(store.put_agent(Agent("t1", "a2", "i1", "c1", "n", 2))),
        "get_agent": await calls.ops(store.get_agent("t1", "a1")),
        "get_agent_for_image": await calls.ops(store.get_agent_for_image("t1", "i1")),
        "list_agents": await calls.ops(store.list_agents("t1")),
        "list_agents of a container": await calls.ops(store.list_agents("t1", "c1")),
        "reserve_seqs": await calls.ops(store.reserve_seqs("t1", "sess_i1", 100)),
        "commit": await calls.ops(store.commit(cp)),
        "commit a turn": await calls.ops(store.commit(Checkpoint("t1", "sess_i1", turns=[running]))),
        "commit nothing": await calls.ops(store.commit(Checkpoint("t1", "sess_i1"))),
        "list_messages": await calls.ops(store.list_messages("t1", "sess_i1")),
        "get_turn": await calls.ops(store.get_turn("t1", "turn1")),
        "list_turns": await calls.ops(store.list_turns("t1", "sess_i1")),
        "read_events": await calls.ops(store.read_events("t1", "sess_i1", 0)),
        "last_seq": await calls.ops(store.last_seq("t1", "sess_i1")),
        "list_unfinished_turns": await calls.ops(store.list_unfinished_turns()),
        "prune_events": await calls.ops(store.prune_events(older_than_ms=15)),
        "create_resource": await calls.ops(store.create_resource(first)),
        "add_resource_version": await calls.ops(store.add_resource_version(resource("t1", "r1", "1.1.0"))),
        "add_resource_version (publish)": await calls.ops(
            store.add_resource_version(resource("t1", "r1", "1.2.0", published=True))),
        "resource_versions": await calls.ops(store.resource_versions("t1", "r1")),
        "resource_versions of another tenant": await calls.ops(store.resource_versions("t2", "r1")),
        "find_resource": await calls.ops(store.find_resource("t2", "prompt", "p")),
        "list_resources": await calls.ops(store.list_resources("t2")),
        "delete_resource": await calls.ops(store.delete_resource("t1", "r1")),
        "delete_resource again": await calls.ops(store.delete_resource("t1", "r1")),
        "delete_agent": await calls.ops(store.delete_agent("t1", "a1")),
        "delete_image": await calls.ops(store.delete_image("t1", "i1")),
        "delete_image again": await calls.ops(store.delete_image("t1", "i1")),
    }
    assert ops == {
        "create_container": ["PutItem"],
        "create_container again": ["PutItem"],
        "get_container": ["GetItem"],
        "list_containers": ["Query"],
        "create_image": ["TransactWriteItems"],
        "get_image": ["GetItem"],
        "list_images": ["Query"],
        "list_images of a container": ["Query"],
        "update_image": ["UpdateItem"],
        "get_session": ["GetItem"],
        "create_session": ["TransactWriteItems"],  # the image checked; the session and its entry
        "list_sessions": ["Query"],
        "delete_session": ["GetItem", "DeleteItem", "Query", "BatchWriteItem"],
        "delete_session again": ["GetItem"],
        "put_agent": ["PutItem"],
        "put_agent again": ["PutItem"],  # the winner comes back with the failed condition
        "get_agent": ["Query", "GetItem"],
        "get_agent_for_image": ["GetItem"],
        "list_agents": ["Query"],
        "list_agents of a container": ["Query"],
        "reserve_seqs": ["Query", "UpdateItem"],
        "commit": ["BatchWriteItem"],
        "commit a turn": ["BatchWriteItem"],
        "commit nothing": [],
        "list_messages": ["Query"],
        "get_turn": ["Query", "GetItem"],
        "list_turns": ["Query"],
        "read_events": ["Query"],
        "last_seq": ["Query"],
        "list_unfinished_turns": ["Query"] * 16 + ["BatchGetItem"],
        # the session's blocks, then its newest block (cut down to its last event) and the rewrite
        "prune_events": ["Query"] * 8 + ["Query", "Query", "BatchWriteItem"],
        "create_resource": ["TransactWriteItems"],  # head, name, version, published name
        "add_resource_version": ["GetItem", "TransactWriteItems"],
        "add_resource_version (publish)": ["GetItem", "TransactWriteItems"],
        "resource_versions": ["Query"],
        "resource_versions of another tenant": ["Query", "Query", "Query"],  # own, GSI3, the owner's
        "find_resource": ["BatchGetItem", "Query"],
        "list_resources": ["Query", "Query", "BatchGetItem"],
        "delete_resource": ["Query", "BatchWriteItem", "TransactWriteItems"],
        "delete_resource again": ["Query"],
        "delete_agent": ["Query", "DeleteItem"],
        "delete_image": ["GetItem", "Query", "Query", "BatchWriteItem", "DeleteItem"],  # its sessions, then each
        "delete_image again": ["GetItem"],
    }
    assert not any("Scan" in name for names in ops.values() for name in names)


async def test_a_text_turn_checkpoint_is_one_batch_write_of_four_items(store: DynamoDBStore) -> None:
    await store.create_image(*image("t1", "i1"))
    calls = Calls(store)
    await store.commit(text_turn_checkpoint("t1", "sess_i1", "i1", 1, 12))
    [(name, params)] = calls.log
    assert name == "BatchWriteItem"
    [requests] = params["RequestItems"].values()
    assert [r["PutRequest"]["Item"]["SK"]["S"] for r in requests] == \
        ["MSG#~0000000000000012#m_asst", "EVB#00000000000000000012", "TURN#turn1",  # the events are one block
         "0000000000000012#sess_i1#m_asst"]  # the message's search item (SRCH#t1#197001)
    # however many events: still one block
    calls.log.clear()
    await store.commit(text_turn_checkpoint("t1", "sess_i1", "i1", 100, 140))
    assert [(n, len(next(iter(p["RequestItems"].values())))) for n, p in calls.log] == [("BatchWriteItem", 4)]
    assert [e.seq for e in await store.read_events("t1", "sess_i1", 0)] == [*range(1, 13), *range(100, 240)]


async def test_unprocessed_items_are_retried_with_backoff(store: DynamoDBStore,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    await store.create_image(*image("t1", "i1"))
    store.backoff_base_s = 0.001
    real = store.client.batch_write_item
    sizes: list[int] = []

    async def half_at_first(**kwargs: Any) -> Any:
        [(table, requests)] = kwargs["RequestItems"].items()
        sizes.append(len(requests))
        if len(sizes) > 2:
            return await real(**kwargs)
        keep, left = requests[: len(requests) // 2], requests[len(requests) // 2:]
        resp = await real(RequestItems={table: keep})
        return {**resp, "UnprocessedItems": {table: left}}

    monkeypatch.setattr(store.client, "batch_write_item", half_at_first)
    await store.commit(text_turn_checkpoint("t1", "sess_i1", "i1", 1, 12))
    assert sizes == [4, 2, 1]
    assert len(await store.read_events("t1", "sess_i1", 0)) == 12
    assert [m.message_id for m in await store.list_messages("t1", "sess_i1")] == ["m_asst"]

    async def never(**kwargs: Any) -> Any:
        [(table, requests)] = kwargs["RequestItems"].items()
        return {"UnprocessedItems": {table: requests}}

    monkeypatch.setattr(store.client, "batch_write_item", never)
    with pytest.raises(RuntimeError, match="left 1 items unprocessed after 8 attempts"):
        await store.commit(Checkpoint("t1", "sess_i1", events=[LoggedEvent(99, "x", "{}", 1)]))


# ---- TTL -----------------------------------------------------------------------------------------


async def test_events_carry_a_ttl_and_expired_events_are_not_read(
        make_store: Callable[..., Awaitable[DynamoDBStore]]) -> None:
    clock = Clock()
    store = await make_store(clock=clock)
    await store.create_image(*image("t1", "i1"))
    await store.commit(Checkpoint("t1", "sess_i1", events=[LoggedEvent(1, "x", "{}", 5), LoggedEvent(2, "y", "{}", 6)]))
    clock.now += 3600
    await store.commit(Checkpoint("t1", "sess_i1", events=[LoggedEvent(3, "z", "{}", 7)]))
    items = {i["SK"]["S"]: i for i in await raw_partition(store, "SESS#t1#sess_i1")}
    start = int(Clock().now)
    assert int(items["EVB#00000000000000000002"]["expires_at"]["N"]) == start + DEFAULT_EVENT_TTL_S
    assert int(items["EVB#00000000000000000003"]["expires_at"]["N"]) == start + 3600 + DEFAULT_EVENT_TTL_S
    assert "expires_at" not in items["SESS"]
    clock.now = start + DEFAULT_EVENT_TTL_S  # the first two have expired; DynamoDB has not deleted them yet
    assert [e.seq for e in await store.read_events("t1", "sess_i1", 0)] == [3]
    assert await store.last_seq("t1", "sess_i1") == 3
    clock.now = start + 3600 + DEFAULT_EVENT_TTL_S
    assert await store.read_events("t1", "sess_i1", 0) == []
    assert await store.last_seq("t1", "sess_i1") == 0
    # the expired log still never lets seqs go back
    assert await store.reserve_seqs("t1", "sess_i1", 10) == (4, 13)


async def test_the_event_ttl_is_configurable_and_limits_skip_expired_events(
        make_store: Callable[..., Awaitable[DynamoDBStore]]) -> None:
    clock = Clock()
    store = await make_store(clock=clock, event_ttl_s=60)
    await store.create_image(*image("t1", "i1"))
    await store.commit(Checkpoint("t1", "sess_i1", events=[LoggedEvent(s, "x", "{}", s) for s in range(1, 6)]))
    clock.now += 30
    await store.commit(Checkpoint("t1", "sess_i1", events=[LoggedEvent(s, "x", "{}", s) for s in range(6, 11)]))
    clock.now += 31
    assert [e.seq for e in await store.read_events("t1", "sess_i1", 0, limit=3)] == [6, 7, 8]
    assert [e.seq for e in await store.read_events("t1", "sess_i1", 7, limit=100)] == [8, 9, 10]


# ---- concurrency ---------------------------------------------------------------------------------


async def test_concurrent_seq_reservations_never_overlap(store: DynamoDBStore) -> None:
    await store.create_image(*image("t1", "i1"))
    ranges = await asyncio.gather(*(store.reserve_seqs("t1", "sess_i1", 10) for _ in range(20)))
    assert sorted(ranges) == [(1 + 10 * i, 10 * (i + 1)) for i in range(20)]
    # also when the log is ahead of every reservation (the compare-and-set path)
    await store.commit(Checkpoint("t1", "sess_i1", events=[LoggedEvent(5000, "x", "{}", 1)]))
    ranges = await asyncio.gather(*(store.reserve_seqs("t1", "sess_i1", 10) for _ in range(20)))
    assert sorted(ranges) == [(5001 + 10 * i, 5000 + 10 * (i + 1)) for i in range(20)]


async def test_concurrent_put_agent_registers_exactly_one(store: DynamoDBStore) -> None:
    await store.create_image(*image("t1", "i1"))
    agents = await asyncio.gather(*(store.put_agent(Agent("t1", f"a{i}", "i1", "c1", "n", i)) for i in range(10)))
    assert len({a.agent_id for a in agents}) == 1
    assert await store.get_agent_for_image("t1", "i1") == agents[0]
    assert await store.list_agents("t1") == [agents[0]]
    assert await store.get_agent("t1", agents[0].agent_id) == agents[0]


# ---- single-table details ------------------------------------------------------------------------


async def test_the_created_table_matches_table_definition(store: DynamoDBStore) -> None:
    desc = (await store.client.describe_table(TableName=store.table_name))["Table"]
    assert desc["KeySchema"] == TABLE_DEFINITION["KeySchema"]
    assert sorted(desc["AttributeDefinitions"], key=lambda a: a["AttributeName"]) == \
        sorted(TABLE_DEFINITION["AttributeDefinitions"], key=lambda a: a["AttributeName"])
    assert desc["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    def indexes(gsis: list[Any]) -> dict[str, Any]:
        return {g["IndexName"]: (g["KeySchema"], g["Projection"]) for g in gsis}

    assert indexes(desc["GlobalSecondaryIndexes"]) == indexes(TABLE_DEFINITION["GlobalSecondaryIndexes"])
    ttl = (await store.client.describe_time_to_live(TableName=store.table_name))["TimeToLiveDescription"]
    assert ttl["TimeToLiveStatus"] == "ENABLED" and ttl["AttributeName"] == "expires_at"


async def test_records_round_trip_exactly_with_ints_and_strings(store: DynamoDBStore) -> None:
    config = {"model": "m", "temperature": 0.7, "topP": 1.0, "maxTokens": 4096, "nested": {"a": [1, 2.5, "x", None,
              True, {"deep": -0.000001}]}, "unicode": "Grüße 👋", "big": 2**62}
    img, sess = image("t1", "i1", config=config, created=1_763_000_000_123)
    img.description, img.system_prompt = None, None
    await store.create_image(img, sess)
    got = await store.get_image("t1", "i1")
    assert got == img
    assert got is not None and type(got.config["maxTokens"]) is int and type(got.config["topP"]) is float
    assert type(got.created_at) is int
    assert (await store.list_images("t1")) == [img]
    turn = Turn("t1", "turn1", "sess_i1", "i1", "c1", "m1", TurnStatus.FAILED, 1_763_000_000_123, tier="container",
                model=None, usage=Usage(2**40, 7, 0, 1), list_cost="0.000000012345678901",
                billed_cost="1234567.890000000000001", error_code="upstream_error", error_message="boom",
                started_at=1_763_000_000_124, ended_at=None)
    await store.commit(Checkpoint("t1", "sess_i1", turns=[turn]))
    stored = await store.get_turn("t1", "turn1")
    assert stored == turn
    assert stored is not None and type(stored.usage.input_tokens) is int and stored.status is TurnStatus.FAILED


async def test_ids_with_key_separators_cannot_reach_another_tenant(store: DynamoDBStore) -> None:
    assert await store.create_container(Container("a#b", "c", 1, 1)) is True
    assert await store.create_container(Container("a", "b#c", 2, 2)) is True
    assert await store.get_container("a", "b#c") == Container("a", "b#c", 2, 2)
    assert await store.get_container("a#b", "c") == Container("a#b", "c", 1, 1)
    assert await store.get_container("a", "b%23c") is None
    assert [c.container_id for c in await store.list_containers("a")] == ["b#c"]


async def test_creating_an_existing_image_conflicts_and_keeps_the_seq_reservation(store: DynamoDBStore) -> None:
    await store.create_image(*image("t1", "i1"))
    assert await store.reserve_seqs("t1", "sess_i1", 100) == (1, 100)
    with pytest.raises(Conflict):
        await store.create_image(*image("t1", "i1", created=9))
    assert (await store.get_image("t1", "i1")).created_at == 1  # type: ignore[union-attr]
    assert await store.reserve_seqs("t1", "sess_i1", 100) == (101, 200)


async def test_reserving_for_an_unknown_session_records_nothing(store: DynamoDBStore) -> None:
    assert await store.reserve_seqs("t1", "sess_nope", 10) == (1, 10)
    assert await store.reserve_seqs("t1", "sess_nope", 10) == (1, 10)  # like SQLite: no session, no counter
    assert await raw_partition(store, "SESS#t1#sess_nope") == []
    assert await store.get_session("t1", "sess_nope") is None


async def test_messages_come_back_in_insertion_order_whatever_their_ids_and_timestamps(store: DynamoDBStore) -> None:
    await store.create_image(*image("t1", "i1"))
    ids = ["m_z", "m_a", "m_m", "m_b"]
    for n, mid in enumerate(ids):
        body = {"id": mid, "timestamp": 100 - n}
        await store.commit(Checkpoint("t1", "sess_i1", messages=[StoredMessage("sess_i1", mid, body, None)]))
    batch = [StoredMessage("sess_i1", mid, {"id": mid, "timestamp": 1}, "t") for mid in ("m_y", "m_c", "m_x")]
    await store.commit(Checkpoint("t1", "sess_i1", messages=[*batch, batch[0]]))  # a duplicate in one checkpoint
    got = await store.list_messages("t1", "sess_i1")
    assert [m.message_id for m in got] == [*ids, "m_y", "m_c", "m_x"]
    assert got[0].turn_id is None and got[-1].turn_id == "t" and got[0].body == {"id": "m_z", "timestamp": 100}


async def test_a_long_message_body_is_stored_compressed_and_read_back_exactly(store: DynamoDBStore) -> None:
    await store.create_image(*image("t1", "i1"))
    prose = " ".join(f"the answer to question {n} is in the data of the server" for n in range(40))  # ~2.2 KB
    long = {"id": "m_long", "role": "assistant", "timestamp": 5, "content": [{"type": "text", "text": prose}]}
    short = {"id": "m_short", "role": "user", "timestamp": 4, "content": "hello"}
    await store.commit(Checkpoint("t1", "sess_i1", messages=[StoredMessage("sess_i1", "m_short", short, None),
                                                             StoredMessage("sess_i1", "m_long", long, "t")]))
    items = {i["message_id"]["S"]: i for i in await raw_partition(store, "SESS#t1#sess_i1") if "message_id" in i}
    assert "body" in items["m_short"] and "bz" not in items["m_short"]
    assert "bz" in items["m_long"] and "body" not in items["m_long"]
    assert len(items["m_long"]["bz"]["B"]) < 1024 < len(prose)  # one write unit instead of three
    assert [m.body for m in await store.list_messages("t1", "sess_i1")] == [short, long]
    assert [m.body for m in await store.list_messages_since("t1", "sess_i1", 0)] == [short, long]


async def test_unfinished_turns_live_in_a_sparse_status_index(store: DynamoDBStore) -> None:
    for tenant in ("t1", "t2"):
        await store.create_image(*image(tenant, "i1"))
    turns = [Turn(tenant, f"turn{n}", "sess_i1", "i1", "c1", f"m{n}", status, created)
             for n, (tenant, status, created) in enumerate([
                 ("t1", TurnStatus.QUEUED, 30), ("t2", TurnStatus.RUNNING, 10), ("t1", TurnStatus.COMPLETED, 5),
                 ("t2", TurnStatus.INTERRUPTED, 6), ("t2", TurnStatus.QUEUED, 20)])]
    for t in turns:
        await store.commit(Checkpoint(t.tenant_id, "sess_i1", turns=[t]))
    assert [t.turn_id for t in await store.list_unfinished_turns()] == ["turn1", "turn4", "turn0"]
    assert await sparse_index(store) == ["EVLOG SESS", "EVLOG SESS",
                                         "TURN#queued TURN#turn0", "TURN#queued TURN#turn4", "TURN#running TURN#turn1"]
    turns[1].status = TurnStatus.COMPLETED
    turns[4].status = TurnStatus.RUNNING
    await store.commit(Checkpoint("t2", "sess_i1", turns=[turns[1], turns[4]]))
    assert [t.turn_id for t in await store.list_unfinished_turns()] == ["turn4", "turn0"]
    assert await sparse_index(store) == ["EVLOG SESS", "EVLOG SESS",
                                         "TURN#queued TURN#turn0", "TURN#running TURN#turn4"]


async def test_prune_keeps_the_newest_event_of_each_session_and_unlists_empty_logs(store: DynamoDBStore) -> None:
    for iid in ("i1", "i2", "i3"):
        await store.create_image(*image("t1", iid))
    await store.commit(Checkpoint("t1", "sess_i1", events=[LoggedEvent(s, "x", "{}", s * 100) for s in range(1, 6)]))
    await store.commit(Checkpoint("t1", "sess_i2", events=[LoggedEvent(7, "x", "{}", 100)]))
    assert await store.prune_events(older_than_ms=350) == 3
    assert [e.seq for e in await store.read_events("t1", "sess_i1", 0)] == [4, 5]
    assert [e.seq for e in await store.read_events("t1", "sess_i2", 0)] == [7]
    assert await sparse_index(store) == ["EVLOG SESS", "EVLOG SESS"]  # i3 has no events: it left the index
    assert await store.prune_events(older_than_ms=10_000) == 1
    assert await store.prune_events(older_than_ms=10_000) == 0
    assert await store.reserve_seqs("t1", "sess_i3", 10) == (1, 10)  # a reservation lists it again
    assert await sparse_index(store) == ["EVLOG SESS", "EVLOG SESS", "EVLOG SESS"]


async def test_delete_image_removes_a_large_session_in_batches(store: DynamoDBStore) -> None:
    await store.create_image(*image("t1", "i1"))
    await store.create_image(*image("t1", "i2"))
    await store.put_agent(Agent("t1", "a1", "i1", "c1", "n", 1))
    await store.commit(text_turn_checkpoint("t1", "sess_i1", "i1", 1, 1))
    for seq in range(2, 61):  # 60 checkpoints: 60 event blocks
        await store.commit(Checkpoint("t1", "sess_i1", events=[LoggedEvent(seq, "x", "{}", seq)]))
    await store.commit(text_turn_checkpoint("t1", "sess_i2", "i2", 1, 3))
    calls = Calls(store)
    assert await store.delete_image("t1", "i1") is True
    writes = [len(next(iter(p["RequestItems"].values()))) for n, p in calls.log if n == "BatchWriteItem"]
    assert writes == [25, 25, 16]  # session and its entry + 60 event blocks + message, its search item + turn + agent
    assert await raw_partition(store, "SESS#t1#sess_i1") == [] and await raw_partition(store, "IMG#t1#i1") == []
    assert await store.get_turn("t1", "turn1") is not None  # i2's turn1 is untouched
    assert len(await store.read_events("t1", "sess_i2", 0)) == 3
    assert [i.image_id for i in await store.list_images("t1", "c1")] == ["i2"]


async def test_open_reuses_one_client_and_close_releases_it(store: DynamoDBStore) -> None:
    client = store.client
    await store.open()
    assert store.client is client
    await store.close()
    with pytest.raises(RuntimeError, match="not open"):
        _ = store.client
    await store.close()
    await store.open()
    assert store.client is not client


# ---- resources -----------------------------------------------------------------------------------


async def test_resource_items_follow_the_documented_layout(store: DynamoDBStore) -> None:
    await store.create_resource(resource("t#1", "r1", "1.0.0", published=True, name="a#b"))
    head, version = await raw_partition(store, "RES#t%231#r1")
    assert (head["SK"]["S"], version["SK"]["S"]) == ("RES", "V#000001.000000.000000#1.0.0")
    assert head["G1PK"]["S"] == "TENANT#t%231#RES" and head["G1SK"]["S"] == "prompt#a%23b#t%231"
    assert head["G3PK"]["S"] == "PUBRES#r1" and head["revision"]["N"] == "1"
    [name] = await raw_partition(store, "RESNAME#t%231#prompt#a%23b")
    assert name["resource_id"]["S"] == "r1"
    [public] = await raw_partition(store, "PUBNAME#prompt#a%23b")
    assert public["G1PK"]["S"] == "PUBLIC#RES" and public["version"]["S"] == "1.0.0"
    await store.add_resource_version(resource("t#1", "r1", "2.0.0", name="a#b"))  # withdrawn
    assert await raw_partition(store, "PUBNAME#prompt#a%23b") == []
    head = next(i for i in await raw_partition(store, "RES#t%231#r1") if i["SK"]["S"] == "RES")
    assert "G3PK" not in head and head["version"]["S"] == "2.0.0" and head["revision"]["N"] == "2"


async def test_concurrent_versions_all_land_and_the_highest_is_listed(store: DynamoDBStore) -> None:
    await store.create_resource(resource("t1", "r1", "1.0.0", published=True))
    await asyncio.gather(*(store.add_resource_version(resource("t1", "r1", f"1.{n}.0", published=True))
                           for n in range(1, 10)))
    assert [v.version for v in await store.resource_versions("t2", "r1")] == [f"1.{n}.0" for n in range(9, -1, -1)]
    for tenant in ("t1", "t2"):  # the head and the published name both carry the highest version
        page, _ = await store.list_resources(tenant)
        assert [v.version for v in page] == ["1.9.0"]
    head = next(i for i in await raw_partition(store, "RES#t1#r1") if i["SK"]["S"] == "RES")
    assert head["revision"]["N"] == "10"
