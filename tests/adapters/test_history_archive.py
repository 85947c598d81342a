"""Hot history with a TTL and its S3 archive (moto): which items expire, the archive the stream of TTL
removals writes, and the reads that merge it back. moto runs no TTL deletes: the stream records are
built, in the exact Lambda event format, from the items the store really wrote."""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import botocore.session
import orjson
import pytest
from botocore.exceptions import ClientError

from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.history_stream import archive_records
from agentvm.adapters.aws.s3_history_archive import S3HistoryArchive, decode_items, object_key
from agentvm.domain.models import Checkpoint, LoggedEvent, Session, StoredMessage, Turn, TurnStatus
from tests.adapters.conftest import bucket_keys
from tests.adapters.test_dynamodb_specifics import Clock, image
from tests.aws_fixtures import count_calls

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

NOW = 1_800_000_000
DAY = 86_400
TTL_IDENTITY = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}


def named(item: dict[str, Any]) -> str:
    """A message item by its id (its sort key is time-ordered: MSG#~<created>#<id>), others by their key."""
    return f"MSG#{item['message_id']['S']}" if "message_id" in item else str(item["SK"]["S"])


@pytest.fixture
async def make_store(aws_env: None, aws_session: botocore.session.Session,
                     moto_endpoint: str) -> AsyncIterator[Callable[..., Awaitable[DynamoDBStore]]]:
    opened: list[DynamoDBStore] = []

    async def make(**options: Any) -> DynamoDBStore:
        store = DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", session=aws_session, endpoint_url=moto_endpoint,
                              clock=Clock(NOW), **options)
        await store.open()
        await store.create_table()
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


@pytest.fixture
async def archive(session: botocore.session.Session, moto_endpoint: str,
                  bucket: str) -> AsyncIterator[S3HistoryArchive]:
    """On a session of its own, so a test can count its S3 requests (`count_calls` before first use)."""
    a = S3HistoryArchive(bucket, session=session, endpoint_url=moto_endpoint)
    yield a
    await a.close()


def turn_checkpoint(sid: str, n: int, *, seq: int) -> Checkpoint:
    """Turn `n` of a session: the user's message, the reply, two events and the finished turn."""
    at = 1_000 * n
    tid = f"turn{n}" if sid == "sess_i1" else f"turn_b{n}"  # turn ids are unique in a tenant
    user = {"id": f"m_u{n}", "role": "user", "subtype": "user", "content": f"question {n}", "timestamp": at}
    reply = {"id": f"m_a{n}", "role": "assistant", "subtype": "assistant", "content": f"answer {n}",
             "timestamp": at + 5}
    turn = Turn("t1", tid, sid, "i1", "c1", f"m_u{n}", TurnStatus.COMPLETED, at, model="claude",
                list_cost="0.001", billed_cost="0.00105", started_at=at + 1, ended_at=at + 9)
    return Checkpoint("t1", sid, messages=[StoredMessage(sid, f"m_u{n}", user, None),
                                           StoredMessage(sid, f"m_a{n}", reply, tid)],
                      events=[LoggedEvent(seq, "text_delta", '{"d":1}', at + 2),
                              LoggedEvent(seq + 1, "turn_end", '{"e":1}', at + 9)], turns=[turn])


async def raw(store: DynamoDBStore, pk: str) -> list[dict[str, Any]]:
    resp = await store.client.query(TableName=store.table_name, KeyConditionExpression="PK = :pk",
                                    ExpressionAttributeValues={":pk": {"S": pk}})
    return list(resp["Items"])


def lambda_json(item: dict[str, Any]) -> dict[str, Any]:
    """An item as a Lambda stream event carries it: binary values base64-encoded."""
    return {k: {"B": base64.b64encode(v["B"]).decode()} if "B" in v else v for k, v in item.items()}


def record(item: dict[str, Any], n: int, *, event: str = "REMOVE",
           identity: dict[str, str] | None = TTL_IDENTITY) -> dict[str, Any]:
    """One DynamoDB Stream record as Lambda delivers it (StreamViewType OLD_IMAGE)."""
    image_ = lambda_json(item)
    out: dict[str, Any] = {
        "eventID": f"{n:032x}", "eventName": event, "eventVersion": "1.1", "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": {"ApproximateCreationDateTime": NOW + 31 * DAY, "Keys": {"PK": item["PK"], "SK": item["SK"]},
                     "OldImage": image_, "SequenceNumber": f"{n:021d}", "SizeBytes": len(orjson.dumps(image_)),
                     "StreamViewType": "OLD_IMAGE"},
        "eventSourceARN": "arn:aws:dynamodb:us-east-1:123456789012:table/agentvm/stream/2026-01-01T00:00:00.000"}
    if identity is not None:
        out["userIdentity"] = identity
    return out


async def ttl_delete(store: DynamoDBStore, items: list[dict[str, Any]]) -> None:
    """What DynamoDB's TTL does to expired items (moto does not run it)."""
    for i in items:
        await store.client.delete_item(TableName=store.table_name, Key={"PK": i["PK"], "SK": i["SK"]})


async def two_sessions(store: DynamoDBStore) -> None:
    img, sess = image("t1", "i1")
    await store.create_image(img, sess)  # session sess_i1
    await store.create_session(Session("t1", "sess_b", "i1", "c1", 2, 2))
    for n in (1, 2, 3):
        await store.commit(turn_checkpoint("sess_i1", n, seq=10 * n))
    await store.commit(turn_checkpoint("sess_b", 1, seq=10))


def sk(item: dict[str, Any]) -> str:
    return str(item["SK"]["S"])


# ---- which items expire ----------------------------------------------------------------------------


async def test_messages_turns_and_search_items_expire_after_the_hot_window_and_the_session_never(
        make_store: Callable[..., Awaitable[DynamoDBStore]]) -> None:
    store = await make_store(history_hot_days=30)
    await two_sessions(store)
    expiry = {sk(i).split("#")[0]: i.get("expires_at", {}).get("N") for i in await raw(store, "SESS#t1#sess_i1")}
    assert expiry == {"MSG": str(NOW + 30 * DAY), "TURN": str(NOW + 30 * DAY),
                      "EVB": str(NOW + 48 * 3600),  # the event log keeps its own 48 h
                      "SESS": None}  # the session item never expires (module docs: why)
    search = await raw(store, "SRCH#t1#197001")
    assert len(search) == 8 and {i["expires_at"]["N"] for i in search} == {str(NOW + 30 * DAY)}
    entries = await raw(store, "IMG#t1#i1")
    assert sorted(sk(i) for i in entries) == ["IMG", "SESS#0000000000000001#sess_i1", "SESS#0000000000000002#sess_b"]
    assert not any("expires_at" in i for i in entries)


async def test_a_hot_window_of_0_keeps_history_forever(make_store: Callable[..., Awaitable[DynamoDBStore]]) -> None:
    store = await make_store()  # the adapter's default; the cloud's default (30) comes from Settings
    await two_sessions(store)
    items = await raw(store, "SESS#t1#sess_i1") + await raw(store, "SRCH#t1#197001")
    assert [sk(i) for i in items if "expires_at" in i] == ["EVB#00000000000000000011", "EVB#00000000000000000021",
                                                           "EVB#00000000000000000031"]


async def test_each_rewrite_of_a_turn_moves_its_expiry_on(make_store: Callable[..., Awaitable[DynamoDBStore]]) -> None:
    store = await make_store(history_hot_days=30)
    await two_sessions(store)
    clock = store._clock
    assert isinstance(clock, Clock)
    clock.now += 10 * DAY
    turn = await store.get_turn("t1", "turn1")
    assert turn is not None
    await store.commit(Checkpoint("t1", "sess_i1", turns=[turn]))
    by_sk = {named(i): i.get("expires_at", {}).get("N") for i in await raw(store, "SESS#t1#sess_i1")}
    assert by_sk["TURN#turn1"] == str(NOW + 40 * DAY)
    assert by_sk["TURN#turn2"] == by_sk["MSG#m_u1"] == str(NOW + 30 * DAY)  # written once, not refreshed


# ---- the archive -----------------------------------------------------------------------------------


async def test_ttl_removals_become_one_object_per_session_and_reads_merge_them_back(
        make_store: Callable[..., Awaitable[DynamoDBStore]], archive: S3HistoryArchive,
        session: botocore.session.Session, s3: S3Client, bucket: str) -> None:
    store = await make_store(history_hot_days=30, archive=archive)
    await two_sessions(store)
    messages, turns = await store.list_messages("t1", "sess_i1"), await store.list_turns("t1", "sess_i1")
    b_messages, b_turns = await store.list_messages("t1", "sess_b"), await store.list_turns("t1", "sess_b")
    assert [m.message_id for m in messages] == ["m_u1", "m_a1", "m_u2", "m_a2", "m_u3", "m_a3"]
    # TTL removes turns 1 and 2 of sess_i1 (turn 3 stays hot) and all of sess_b, with their events
    # and search items; the batch also holds a user's delete and an update, which are not TTL's
    a_items = [i for i in await raw(store, "SESS#t1#sess_i1") if not sk(i).endswith(("3", "31", "SESS"))]
    b_items = [i for i in await raw(store, "SESS#t1#sess_b") if sk(i) != "SESS"]
    search = [i for i in await raw(store, "SRCH#t1#197001") if "#m_u3" not in sk(i) and "#m_a3" not in sk(i)]
    assert len(a_items) == 8 and len(b_items) == 4 and len(search) == 6  # 4 msg + 2 turns + 2 event blocks
    expired = a_items + b_items + search
    records = [record(i, n) for n, i in enumerate(expired)]
    user_delete = record(a_items[0], 900, identity=None)
    update = record(a_items[1], 901, event="MODIFY")
    batch = [*records, user_delete, update]
    a_history = [i for i in a_items if sk(i).startswith(("MSG#", "TURN#"))]
    b_history = [i for i in b_items if sk(i).startswith(("MSG#", "TURN#"))]
    a_key = object_key("t1", "sess_i1", 1_000, [r["eventID"] for r in records[:8] if sk(expired[int(
        r["eventID"], 16)]).startswith(("MSG#", "TURN#"))])
    b_key = object_key("t1", "sess_b", 1_000, [f"{n:032x}" for n in range(8, 12)
                                               if sk(expired[n]).startswith(("MSG#", "TURN#"))])
    assert a_key.startswith("archive/t1/sess_i1/0000000000001000-") and a_key.endswith(".jsonl.gz")

    puts = count_calls(session, "s3", "PutObject")  # counters before the archive's client exists
    lists, gets = count_calls(session, "s3", "ListObjectsV2"), count_calls(session, "s3", "GetObject")
    out = await archive_records(batch, store, archive)
    assert out == {"sessions": 2, "items": 9, "objects": [a_key, b_key], "skipped": 0}
    assert len(puts) == 2  # one PUT per session of the batch, not one per item
    assert await bucket_keys(s3, bucket) == sorted([a_key, b_key])
    stored = await s3.get_object(Bucket=bucket, Key=a_key)
    assert decode_items(stored["Body"].read()) == a_history  # DynamoDB JSON, in the records' order
    assert [named(i) for i in a_history] == ["MSG#m_u1", "MSG#m_a1", "MSG#m_u2", "MSG#m_a2", "TURN#turn1", "TURN#turn2"]
    for sid in ("sess_i1", "sess_b"):  # the mark that makes reads look in the archive
        assert [i["archived_at"]["N"] for i in await raw(store, f"SESS#t1#{sid}") if "archived_at" in i] == [
            str(NOW * 1000)]

    # a retried batch writes the same keys again: no second object
    assert (await archive_records(batch, store, archive))["objects"] == [a_key, b_key]
    assert await bucket_keys(s3, bucket) == sorted([a_key, b_key])
    assert len(puts) == 4

    await ttl_delete(store, expired)
    assert (len(lists), len(gets)) == (0, 0)
    assert await store.list_messages("t1", "sess_i1") == messages  # archived and hot, merged in order
    assert (len(lists), len(gets)) == (1, 1)  # per archived session read: 1 LIST + 1 GET per object
    assert await store.list_turns("t1", "sess_i1") == turns
    assert await store.list_messages("t1", "sess_b") == b_messages and b_history  # wholly archived
    assert await store.list_turns("t1", "sess_b") == b_turns
    assert (len(lists), len(gets)) == (4, 4)


class RefusingArchive:
    """An archive no read may reach."""

    def __init__(self) -> None:
        self.reads = 0

    async def read_session(self, tenant_id: str, session_id: str) -> list[dict[str, Any]]:
        self.reads += 1
        return []

    async def delete_session(self, tenant_id: str, session_id: str) -> int:
        raise AssertionError("nothing was archived")


async def test_a_session_never_archived_costs_no_archive_request(
        make_store: Callable[..., Awaitable[DynamoDBStore]]) -> None:
    fake = RefusingArchive()
    store = await make_store(history_hot_days=30, archive=fake)
    await two_sessions(store)
    assert len(await store.list_messages("t1", "sess_i1")) == 6 and len(await store.list_turns("t1", "sess_i1")) == 3
    assert await store.delete_session("t1", "sess_b")
    assert fake.reads == 0
    assert await store.mark_archived("t1", "sess_i1")
    assert len(await store.list_messages("t1", "sess_i1")) == 6  # the hot items win; the archive is read once
    assert fake.reads == 1
    assert not await store.mark_archived("t1", "sess_none")  # no such session: nothing marked or created
    assert await raw(store, "SESS#t1#sess_none") == []


async def test_a_deleted_session_is_not_archived(make_store: Callable[..., Awaitable[DynamoDBStore]],
                                                 archive: S3HistoryArchive, s3: S3Client, bucket: str) -> None:
    store = await make_store(history_hot_days=30, archive=archive)
    await two_sessions(store)
    items = await raw(store, "SESS#t1#sess_b")
    assert await store.delete_session("t1", "sess_b")
    out = await archive_records([record(i, n) for n, i in enumerate(items)], store, archive)
    assert out == {"sessions": 1, "items": 0, "objects": [], "skipped": 1}
    assert await bucket_keys(s3, bucket) == []


async def test_deleting_a_session_or_its_image_deletes_its_archive(
        make_store: Callable[..., Awaitable[DynamoDBStore]], archive: S3HistoryArchive, s3: S3Client,
        bucket: str) -> None:
    store = await make_store(history_hot_days=30, archive=archive)
    await two_sessions(store)
    items = [i for sid in ("sess_i1", "sess_b") for i in await raw(store, f"SESS#t1#{sid}") if sk(i) != "SESS"]
    out = await archive_records([record(i, n) for n, i in enumerate(items)], store, archive)
    a_key, b_key = out["objects"]
    assert await bucket_keys(s3, bucket) == sorted([a_key, b_key])
    assert await store.delete_session("t1", "sess_b")
    assert await bucket_keys(s3, bucket) == [a_key]
    assert await store.delete_image("t1", "i1")
    assert await bucket_keys(s3, bucket) == []


async def test_a_failed_write_raises_so_the_batch_is_retried(
        make_store: Callable[..., Awaitable[DynamoDBStore]], session: botocore.session.Session,
        moto_endpoint: str) -> None:
    missing = S3HistoryArchive(f"agentvm-missing-{uuid.uuid4().hex[:8]}", session=session, endpoint_url=moto_endpoint)
    store = await make_store(history_hot_days=30, archive=missing)
    await two_sessions(store)
    items = await raw(store, "SESS#t1#sess_b")
    with pytest.raises(ClientError, match="NoSuchBucket"):
        await archive_records([record(i, n) for n, i in enumerate(items)], store, missing)
    await missing.close()


async def test_search_covers_the_hot_window_only(make_store: Callable[..., Awaitable[DynamoDBStore]]) -> None:
    from tests.support.dynamodb_calls import Calls

    forever, hot = await make_store(), await make_store(history_hot_days=30)
    for store in (forever, hot):
        await two_sessions(store)
    assert (forever._months_searched(), hot._months_searched()) == (24, 3)
    calls = Calls(hot)
    assert await hot.search_messages("t1", "nothing") == ([], None)
    assert calls.take() == ["Query"] * 3  # the month partitions a 30-day window (and TTL's lag) can touch
    calls = Calls(forever)
    assert await forever.search_messages("t1", "nothing") == ([], None)
    assert calls.take() == ["Query"] * 24


async def test_a_compressed_message_body_is_archived_as_json_text_and_read_back(
        make_store: Callable[..., Awaitable[DynamoDBStore]]) -> None:
    from agentvm.adapters.aws.s3_history_archive import decode_items, encode_items

    store = await make_store(history_hot_days=30)
    await store.create_image(*image("t1", "i1"))
    prose = " ".join(f"the answer to question {n} is in the data of the server" for n in range(40))
    body = {"id": "m_long", "role": "assistant", "timestamp": 5, "content": [{"type": "text", "text": prose}]}
    await store.commit(Checkpoint("t1", "sess_i1", messages=[StoredMessage("sess_i1", "m_long", body, None)]))
    [item] = [i for i in await raw(store, "SESS#t1#sess_i1") if "message_id" in i]
    assert "bz" in item  # the table keeps it compressed
    for image_ in (item, lambda_json(item)):  # as the store wrote it, and as a stream record carries it
        [archived] = decode_items(encode_items([image_]))
        assert "bz" not in archived and orjson.loads(archived["body"]["S"]) == body
        assert {k: v for k, v in archived.items() if k != "body"} == {k: v for k, v in image_.items() if k != "bz"}
