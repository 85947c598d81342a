"""`Store.search_messages`: full-text search of a tenant's messages, on every adapter (SQLite FTS5,
DynamoDB month partitions ranked in windows), plus what each adapter does on its own (the SQLite
migration that indexes existing messages, the DynamoDB items, requests and windows)."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.local.sqlite_schema import MIGRATIONS
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.domain.message_text import (
    MAX_TEXT_BYTES,
    TOOL_PREVIEW_CHARS,
    match_expression,
    search_cursor,
    searchable_text,
)
from agentvm.domain.models import Checkpoint, Image, SearchHit, Session, StoredMessage
from agentvm.errors import InvalidRequest
from agentvm.ports import Store
from tests.support.dynamodb_calls import Calls

DAY_MS = 86_400_000
NOW_MS = int(time.time() * 1000)




def image(tenant: str, iid: str, created: int = 1) -> tuple[Image, Session]:
    return (Image(tenant, iid, "c1", f"sess_{iid}", f"name {iid}", created, created, None, "sys", {}),
            Session(tenant, f"sess_{iid}", iid, "c1", created, created))


def user(sid: str, mid: str, text: Any, ts: int) -> StoredMessage:
    return StoredMessage(sid, mid, {"id": mid, "role": "user", "subtype": "user", "content": text, "timestamp": ts})


def assistant(sid: str, mid: str, text: str, ts: int) -> StoredMessage:
    return StoredMessage(sid, mid, {"id": mid, "role": "assistant", "subtype": "assistant",
                                    "content": [{"type": "text", "text": text}], "timestamp": ts})


async def put(store: Store, tenant: str, sid: str, *messages: StoredMessage) -> None:
    await store.commit(Checkpoint(tenant, sid, messages=list(messages)))


async def everything(store: Store, tenant: str, q: str, limit: int) -> list[list[SearchHit]]:
    """Every page of a search, following the cursors."""
    pages: list[list[SearchHit]] = []
    cursor: str | None = None
    while True:
        hits, cursor = await store.search_messages(tenant, q, limit=limit, cursor=cursor)
        assert len(hits) <= limit
        pages.append(hits)
        if cursor is None:
            return pages
        assert len(pages) < 100


# ---- the contract --------------------------------------------------------------------------------


async def test_a_word_of_an_old_message_is_found_ranked_and_highlighted(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    old = NOW_MS - 100 * DAY_MS  # another month than the rest
    await put(store, "t1", "sess_i1",
              user("sess_i1", "m_old", "We planned the trip to Zanzibar & <Pemba> last spring.", old),
              assistant("sess_i1", "m_old_r", "You said: zanzibar, ZANZIBAR, Zanzibar!", old + 1))
    for i in range(5):
        await put(store, "t1", "sess_i1", user("sess_i1", f"m{i}", f"something else entirely, turn {i}",
                                               NOW_MS - (4 - i) * 60_000))
    hits, cursor = await store.search_messages("t1", "zanzibar", limit=10)
    assert cursor is None
    assert [h.message_id for h in hits] == ["m_old_r", "m_old"]  # three occurrences rank first
    best, other = hits
    assert (best.session_id, best.image_id, best.role, best.subtype, best.timestamp) == (
        "sess_i1", "i1", "assistant", "assistant", old + 1)
    assert best.snippet == "You said: <mark>zanzibar</mark>, <mark>ZANZIBAR</mark>, <mark>Zanzibar</mark>!"
    assert other.snippet == "We planned the trip to <mark>Zanzibar</mark> &amp; &lt;Pemba&gt; last spring."
    assert best.score > other.score > 0
    # stemmed and folded, every word required, in any order
    assert [h.message_id for h in (await store.search_messages("t1", "TRIPS planning"))[0]] == ["m_old"]
    assert (await store.search_messages("t1", "zanzibar mainland"))[0] == []
    assert [h.message_id for h in (await store.search_messages("t1", "turn 3"))[0]] == ["m3"]


async def test_another_tenant_never_sees_the_word(store: Store) -> None:
    # the same ids in both tenants: isolation is by tenant, not by id
    await store.create_image(*image("t1", "i1"))
    await store.create_image(*image("t2", "i1"))
    await put(store, "t1", "sess_i1", user("sess_i1", "m1", "the secret word is quokka", NOW_MS))
    await put(store, "t2", "sess_i1", user("sess_i1", "m1", "tenant two talks about wombats", NOW_MS))
    assert [h.message_id for h in (await store.search_messages("t1", "quokka"))[0]] == ["m1"]
    assert await store.search_messages("t2", "quokka") == ([], None)
    assert await store.search_messages("t1", "wombats") == ([], None)
    assert await store.search_messages("t3", "quokka") == ([], None)
    [hit] = (await store.search_messages("t2", "wombat"))[0]
    assert "wombats" in hit.snippet and "quokka" not in hit.snippet


async def test_messages_of_deleted_sessions_and_images_are_gone(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    await store.create_image(*image("t1", "i2"))
    assert await store.create_session(Session("t1", "sess_b", "i1", "c1", 5, 5, "b"))
    await put(store, "t1", "sess_i1", user("sess_i1", "m1", "kumquat in the primary session", NOW_MS - 3))
    await put(store, "t1", "sess_b", user("sess_b", "m1", "kumquat in the second session", NOW_MS - 2),
              assistant("sess_b", "m2", "kumquat indeed", NOW_MS - 1))
    await put(store, "t1", "sess_i2", user("sess_i2", "m1", "kumquat in another image", NOW_MS))
    assert len((await store.search_messages("t1", "kumquat"))[0]) == 4
    assert await store.delete_session("t1", "sess_b")
    assert sorted(h.session_id for h in (await store.search_messages("t1", "kumquat"))[0]) == ["sess_i1", "sess_i2"]
    assert await store.delete_image("t1", "i1")
    assert [h.session_id for h in (await store.search_messages("t1", "kumquat"))[0]] == ["sess_i2"]
    # a late checkpoint of a deleted session (a turn that was still running) is never found either
    await put(store, "t1", "sess_b", user("sess_b", "m9", "kumquat after the delete", NOW_MS + 1))
    assert [h.session_id for h in (await store.search_messages("t1", "kumquat"))[0]] == ["sess_i2"]


async def test_pages_are_disjoint_and_complete(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    # 14 matches over three months, between messages that do not match
    times = [NOW_MS - d * DAY_MS - i for d in (0, 40, 80) for i in range(6)]
    for n, ts in enumerate(times):
        text = f"papaya number {n}" if n % 5 else f"guava number {n}"
        await put(store, "t1", "sess_i1", user("sess_i1", f"m{n:02d}", text, ts))
    expected = sorted(f"m{n:02d}" for n in range(len(times)) if n % 5)
    assert len(expected) == 14
    setups: list[dict[str, int]] = [{}]
    if isinstance(store, DynamoDBStore):  # small windows: pages end inside windows and across months
        setups += [{"search_window_items": 4}, {"search_window_items": 3, "search_budget_items": 3}]
    for setup in setups:
        for name, value in setup.items():
            setattr(store, name, value)
        for limit in (1, 3, 5, 14, 20):
            pages = await everything(store, "t1", "papaya", limit)
            ids = [h.message_id for page in pages for h in page]
            assert sorted(ids) == expected, (setup, limit)  # each hit exactly once
            if not isinstance(store, DynamoDBStore) or "search_budget_items" not in setup:
                assert all(len(page) == limit for page in pages[:-1]), (setup, limit)  # full pages


async def test_query_syntax_is_plain_words(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    await put(store, "t1", "sess_i1",
              user("sess_i1", "m1", 'she typed foo" OR NOT (* into the box', NOW_MS - 2),
              user("sess_i1", "m2", "foo alone", NOW_MS - 1),
              user("sess_i1", "m3", "text:colon NEAR(a b) and a star*", NOW_MS))
    assert [h.message_id for h in (await store.search_messages("t1", 'foo" OR NOT (*'))[0]] == ["m1"]
    for q in ['"', "*", "(", ")", "OR", "NOT foo", "foo AND", "^foo", "text:colon", "NEAR(a b)", "star*", "-foo",
              "{text}: foo", "'", "\\", "\x00", "🦘"]:
        hits, _ = await store.search_messages("t1", q)  # never an FTS syntax error
        for h in hits:
            assert h.message_id in {"m1", "m2", "m3"}
    assert (await store.search_messages("t1", "NOT foo"))[0][0].message_id == "m1"  # "not" is a word
    assert [h.message_id for h in (await store.search_messages("t1", "text:colon"))[0]] == ["m3"]
    assert await store.search_messages("t1", "!!! ...") == ([], None)  # no word: nothing matches


async def test_a_bad_cursor_is_refused(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    await put(store, "t1", "sess_i1", *(user("sess_i1", f"m{i}", f"lychee {i}", NOW_MS + i) for i in range(3)))
    hits, cursor = await store.search_messages("t1", "lychee", limit=1)
    assert len(hits) == 1 and cursor is not None
    for bad in ["nope", "", "e30", "bnVsbA", cursor[:-3], cursor + "x", "eyJvIjotMSwicSI6MH0"]:
        with pytest.raises(InvalidRequest) as info:
            await store.search_messages("t1", "lychee", cursor=bad)
        assert (info.value.field, info.value.message) == ("cursor", "cursor: not a cursor of this list")
    with pytest.raises(InvalidRequest, match="not a cursor of this list"):  # another query's cursor
        await store.search_messages("t1", "durian", cursor=cursor)
    assert len((await store.search_messages("t1", "LYCHEE", limit=1, cursor=cursor))[0]) == 1  # same words


async def test_what_is_searchable(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    call = {"id": "m3", "role": "assistant", "subtype": "tool-call", "timestamp": NOW_MS + 3, "parentId": "m2",
            "toolCall": {"type": "tool-call", "id": "toolu_1", "name": "bash", "input": {"command": "grep mango x"}}}
    result = {"id": "m4", "role": "tool", "subtype": "tool-result", "toolCallId": "toolu_1", "timestamp": NOW_MS + 4,
              "toolResult": {"type": "tool-result", "id": "toolu_1", "name": "bash",
                             "output": {"type": "text", "value": "x: mango chutney"}}}
    error = {"id": "m5", "role": "error", "subtype": "error", "content": "mango overloaded", "timestamp": NOW_MS + 5}
    parts = [{"type": "text", "text": "a mango picture"}, {"type": "image", "data": "aGk=", "mediaType": "image/png",
                                                            "name": "mango.png"}]
    messages = [user("sess_i1", "m1", parts, NOW_MS + 1), assistant("sess_i1", "m2", "I see a mango", NOW_MS + 2),
                StoredMessage("sess_i1", "m3", call), StoredMessage("sess_i1", "m4", result),
                StoredMessage("sess_i1", "m5", error)]
    await put(store, "t1", "sess_i1", *messages)
    await put(store, "t1", "sess_i1", *messages)  # a replayed checkpoint: indexed once
    hits, _ = await store.search_messages("t1", "mango")
    assert sorted((h.message_id, h.role, h.subtype) for h in hits) == [
        ("m1", "user", "user"), ("m2", "assistant", "assistant"), ("m3", "assistant", "tool-call"),
        ("m4", "tool", "tool-result")]
    assert [h.message_id for h in (await store.search_messages("t1", "chutney"))[0]] == ["m4"]
    assert (await store.search_messages("t1", "overloaded"))[0] == []  # the runtime's error text is not
    assert (await store.search_messages("t1", "aGk"))[0] == []  # nor attachment data


# ---- text extraction and queries ---------------------------------------------------------------


def test_searchable_text_is_bounded_and_keeps_the_conversation() -> None:
    assert searchable_text({"role": "user", "subtype": "user", "content": "hi there"}) == "hi there"
    assert searchable_text({"subtype": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "thinking"},
                                                                 {"type": "text", "text": "b"}]}) == "a\nb"
    big = "é" * MAX_TEXT_BYTES  # 2 bytes each: cut at a character boundary
    assert searchable_text({"subtype": "user", "content": big}) == "é" * (MAX_TEXT_BYTES // 2)
    long_input = {"subtype": "tool-call", "toolCall": {"name": "write_file",
                                                       "input": {"path": "a.txt", "content": "z" * 50_000}}}
    assert len(searchable_text(long_input)) <= len("write_file\n") + TOOL_PREVIEW_CHARS
    leaves = {"subtype": "tool-call", "toolCall": {"name": "t", "input": {"n": [1, True, None], "s": "x"}}}
    assert searchable_text(leaves) == "t\n1 x"
    result = {"subtype": "tool-result", "toolResult": {"name": "read_file", "output": {"value": "y" * 30_000}}}
    assert len(searchable_text(result)) == len("read_file\n") + TOOL_PREVIEW_CHARS
    assert searchable_text({"subtype": "error", "content": "boom"}) == ""
    assert searchable_text({"subtype": "user", "content": "a\ue000b\ue001c"}) == "a b c"  # no fake marks
    assert searchable_text({"subtype": "user", "content": None}) == ""
    assert searchable_text({"subtype": "tool-call", "toolCall": "x"}) == ""


def test_a_query_is_quoted_terms() -> None:
    assert match_expression('foo" OR NOT (*') == '"foo" "or" "not"'
    assert match_expression("Foo foo_bar FOO") == '"foo" "bar"'
    assert match_expression(" *** ") is None
    assert match_expression(" ".join(f"w{i}" for i in range(40))) == " ".join(f'"w{i}"' for i in range(16))


# ---- SQLite --------------------------------------------------------------------------------------


async def test_sqlite_migration_6_indexes_the_messages_already_stored(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    with sqlite3.connect(path) as conn:  # a database written by schema version 5
        for script in MIGRATIONS[:5]:
            conn.executescript(script)
        conn.execute("INSERT INTO sessions (tenant_id, session_id, image_id, container_id, created_at, updated_at) "
                     "VALUES ('t1', 's1', 'i1', 'c1', 1, 1)")
        for n, body in enumerate([
                {"id": "m1", "role": "user", "subtype": "user", "content": "an old persimmon", "timestamp": 10},
                {"id": "m2", "role": "error", "subtype": "error", "content": "persimmon error", "timestamp": 11},
                {"id": "m3", "role": "assistant", "subtype": "assistant", "timestamp": 12,
                 "content": [{"type": "text", "text": "persimmons are orange"}]}], 1):
            conn.execute("INSERT INTO messages (tenant_id, session_id, message_id, body, created_at) "
                         "VALUES ('t1', 's1', ?, ?, ?)", (f"m{n}", json.dumps(body), 9 + n))
        conn.execute("INSERT INTO messages (tenant_id, session_id, message_id, body, created_at) "
                     "VALUES ('t1', 's1', 'm4', 'not json', 1)")
        conn.execute("PRAGMA user_version=5")
    s = SqliteStore(path)
    await s.open()
    try:
        hits, _ = await s.search_messages("t1", "persimmon")
        assert sorted((h.message_id, h.timestamp, h.image_id) for h in hits) == [("m1", 10, "i1"), ("m3", 12, "i1")]
        await s.commit(Checkpoint("t1", "s1", messages=[user("s1", "m5", "a new persimmon", 20)]))
        assert len((await s.search_messages("t1", "persimmon"))[0]) == 3
        assert await s.integrity_check() == "ok"
    finally:
        await s.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == 12
        assert conn.execute("SELECT count(*) FROM message_search").fetchone()[0] == 3


# ---- DynamoDB ------------------------------------------------------------------------------------


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000


@pytest.fixture
async def ddb(aws_env: None, aws_session: Any, moto_endpoint: str) -> AsyncIterator[DynamoDBStore]:
    # 2030-06-15 12:00 UTC: months are deterministic
    s = DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", session=aws_session, endpoint_url=moto_endpoint,
                      clock=Clock(1_907_841_600_000))
    await s.open()
    await s.create_table()
    yield s
    await s.close()


async def partition(store: DynamoDBStore, pk: str) -> list[dict[str, Any]]:
    resp = await store.client.query(TableName=store.table_name, KeyConditionExpression="PK = :pk",
                                    ExpressionAttributeValues={":pk": {"S": pk}})
    return list(resp["Items"])


JUNE = 1_907_841_600_000  # 2030-06-15 12:00 UTC


async def test_dynamodb_search_items_are_per_tenant_and_month_and_go_with_their_session(ddb: DynamoDBStore) -> None:
    await ddb.create_image(*image("t#1", "i1"))
    march = JUNE - 92 * DAY_MS
    calls = Calls(ddb)
    long_reply = " ".join(f"fig number {n} is sweet." for n in range(100))
    await put(ddb, "t#1", "sess_i1", user("sess_i1", "m#1", "fig jam", march),
              StoredMessage("sess_i1", "m2", {"id": "m2", "role": "error", "subtype": "error", "content": "fig",
                                              "timestamp": march + 1}),
              assistant("sess_i1", "m%3", long_reply, JUNE))
    [(name, params)] = calls.log
    [requests] = params["RequestItems"].values()
    assert name == "BatchWriteItem" and len(requests) == 5  # 3 messages and 2 search items: one request
    [item] = await partition(ddb, "SRCH#t%231#203003")
    assert item == {"PK": {"S": "SRCH#t%231#203003"}, "SK": {"S": f"{march:016d}#sess_i1#m%231"},
                    "role": {"S": "user"}, "subtype": {"S": "user"}, "text": {"S": "fig jam"}}
    [packed] = await partition(ddb, "SRCH#t%231#203006")  # a longer text is stored compressed
    assert packed["SK"]["S"] == f"{JUNE:016d}#sess_i1#m%253" and "text" not in packed
    assert len(packed["z"]["B"]) < len(long_reply) // 3

    calls.log.clear()
    hits, cursor = await ddb.search_messages("t#1", "fig")
    assert cursor is None and [(h.message_id, h.timestamp) for h in hits] == [("m%3", JUNE), ("m#1", march)]
    assert hits[0].snippet.startswith("<mark>fig</mark> number") and hits[1].snippet == "<mark>fig</mark> jam"
    # June first, then May and April at once, then 4 months, 8, and the 9 left: 24 months, then the sessions
    assert all(p.get("ConsistentRead") is not True for n, p in calls.log if n == "Query")  # half-price reads
    assert calls.take() == ["Query"] * 24 + ["BatchGetItem"]

    assert await ddb.delete_image("t#1", "i1")
    assert await partition(ddb, "SRCH#t%231#203003") == [] and await partition(ddb, "SRCH#t%231#203006") == []


async def test_dynamodb_drops_hits_of_a_session_deleted_halfway(ddb: DynamoDBStore) -> None:
    await ddb.create_image(*image("t1", "i1"))
    await ddb.create_image(*image("t1", "i2"))
    await put(ddb, "t1", "sess_i1", user("sess_i1", "m1", "olive oil", JUNE))
    await put(ddb, "t1", "sess_i2", user("sess_i2", "m1", "olive tree", JUNE + 1))
    # a delete cut short: the session item is gone, its search item is not
    await ddb.client.delete_item(TableName=ddb.table_name, Key={"PK": {"S": "SESS#t1#sess_i1"}, "SK": {"S": "SESS"}})
    hits, _ = await ddb.search_messages("t1", "olive")
    assert [(h.session_id, h.image_id) for h in hits] == [("sess_i2", "i2")]


async def test_dynamodb_reads_a_bounded_window_per_call_and_goes_back_24_months(ddb: DynamoDBStore) -> None:
    await ddb.create_image(*image("t1", "i1"))
    ancient = JUNE - 30 * 31 * DAY_MS  # beyond 24 months: not searched
    old = JUNE - 20 * 31 * DAY_MS
    await put(ddb, "t1", "sess_i1", user("sess_i1", "m_ancient", "quince", ancient),
              user("sess_i1", "m_old", "quince", old))
    for i in range(6):
        await put(ddb, "t1", "sess_i1", user("sess_i1", f"m{i}", f"recent {i}", JUNE - i))
    ddb.search_window_items, ddb.search_budget_items = 2, 4
    calls = Calls(ddb)
    pages = await everything(ddb, "t1", "quince", 10)
    assert [[h.message_id for h in page] for page in pages] == [[], ["m_old"]]  # a short page, then the hit
    assert sum(n == "BatchGetItem" for n in calls.take()) == 1  # sessions are read for hits only
    ddb.search_months = 40
    assert [h.message_id for page in await everything(ddb, "t1", "quince", 10) for h in page] == ["m_old", "m_ancient"]


async def test_dynamodb_refuses_a_forged_cursor_that_would_read_more_months(ddb: DynamoDBStore) -> None:
    await ddb.create_image(*image("t1", "i1"))
    await put(ddb, "t1", "sess_i1", *(user("sess_i1", f"m{i}", f"plum {i}", JUNE - i) for i in range(3)))
    ddb.search_window_items = 2
    _, cursor = await ddb.search_messages("t1", "plum", limit=1)
    assert cursor is not None
    calls = Calls(ddb)
    for state in [{"old": 197001, "below": [999912, "~"]}, {"old": 203006, "below": [202001, "~"]},
                  {"old": 202808, "hi": [203006, "~"], "lo": [203007, "a"], "skip": 0, "last": False},
                  {"old": 202808, "hi": [203006, "~"], "lo": [203005, "a"], "skip": -1, "last": False},
                  {"old": 202813, "below": [203006, "~"]}, {"old": 202808, "below": [203006, ""]},
                  {"old": 202808}, {"old": "202808", "below": [203006, "~"]}]:
        with pytest.raises(InvalidRequest, match="not a cursor of this list"):
            await ddb.search_messages("t1", "plum", cursor=search_cursor(state, "plum"))
    assert calls.take() == []  # refused before any read
    assert len((await ddb.search_messages("t1", "plum", cursor=search_cursor(
        {"old": 202808, "below": [203006, "~"]}, "plum")))[0]) == 3  # a well-formed one is fine
