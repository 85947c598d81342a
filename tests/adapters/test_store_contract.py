"""The Store port contract. Every adapter runs this suite (DynamoDB joins with the cloud tier)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agentvm.adapters.local.sqlite_schema import MIGRATIONS
from agentvm.adapters.local.sqlite_store import SqliteStore
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
from agentvm.errors import Conflict, InvalidRequest, NotFound
from agentvm.ports import Store


def image(tenant: str, iid: str, container: str = "c1", created: int = 1) -> tuple[Image, Session]:
    return (Image(tenant, iid, container, f"sess_{iid}", f"name {iid}", created, created, None, "sys",
                  {"model": "m"}),
            Session(tenant, f"sess_{iid}", iid, container, created, created))


async def test_containers_are_created_once_and_scoped_by_tenant(store: Store) -> None:
    assert await store.create_container(Container("t1", "c1", 1, 1)) is True
    assert await store.create_container(Container("t1", "c1", 2, 2)) is False
    assert await store.create_container(Container("t2", "c1", 3, 3)) is True
    assert (await store.get_container("t1", "c1")) == Container("t1", "c1", 1, 1)
    assert await store.get_container("t3", "c1") is None
    await store.create_container(Container("t1", "c0", 5, 5))
    assert [c.container_id for c in await store.list_containers("t1")] == ["c1", "c0"]


async def test_images_and_sessions_are_scoped_and_listed_newest_first(store: Store) -> None:
    for iid, created, container in [("i1", 1, "c1"), ("i2", 2, "c2"), ("i3", 3, "c1")]:
        await store.create_image(*image("t1", iid, container, created))
    await store.create_image(*image("t2", "i9"))
    assert [i.image_id for i in await store.list_images("t1")] == ["i3", "i2", "i1"]
    assert [i.image_id for i in await store.list_images("t1", "c1")] == ["i3", "i1"]
    assert await store.get_image("t2", "i1") is None
    got = await store.get_image("t1", "i1")
    assert got is not None and got.config == {"model": "m"} and got.system_prompt == "sys"
    assert (await store.get_session("t1", "sess_i1")) is not None
    assert await store.get_session("t2", "sess_i1") is None
    updated = await store.update_image("t1", "i1", name="new", description=None, updated_at=10)
    assert updated is not None and updated.name == "new" and updated.updated_at == 10
    assert await store.update_image("t2", "i1", name="x", description=None, updated_at=11) is None


async def test_one_agent_per_image(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    first = await store.put_agent(Agent("t1", "a1", "i1", "c1", "n", 1))
    second = await store.put_agent(Agent("t1", "a2", "i1", "c1", "n", 2))
    assert first.agent_id == "a1" and second.agent_id == "a1"
    assert (await store.get_agent_for_image("t1", "i1")) == first
    assert await store.get_agent("t2", "a1") is None
    assert [a.agent_id for a in await store.list_agents("t1", "c1")] == ["a1"]
    assert await store.delete_agent("t2", "a1") is False
    assert await store.delete_agent("t1", "a1") is True
    assert await store.list_agents("t1") == []


async def test_checkpoints_are_atomic_and_idempotent(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    turn = Turn("t1", "turn1", "sess_i1", "i1", "c1", "m1", TurnStatus.QUEUED, 5)
    msg = StoredMessage("sess_i1", "m1", {"id": "m1", "role": "user", "subtype": "user", "content": "hi",
                                         "timestamp": 5}, "turn1")
    events = [LoggedEvent(1, "message_persisted", '{"seq":1}', 5), LoggedEvent(2, "text_delta", '{"seq":2}', 6)]
    await store.commit(Checkpoint("t1", "sess_i1", messages=[msg], events=events, turns=[turn]))
    await store.commit(Checkpoint("t1", "sess_i1", messages=[msg], events=events))  # replayed: no duplicates
    assert [m.message_id for m in await store.list_messages("t1", "sess_i1")] == ["m1"]
    assert await store.list_messages("t2", "sess_i1") == []
    assert [e.seq for e in await store.read_events("t1", "sess_i1", 0)] == [1, 2]
    assert [e.seq for e in await store.read_events("t1", "sess_i1", 1)] == [2]
    assert await store.read_events("t2", "sess_i1", 0) == []
    assert await store.last_seq("t1", "sess_i1") == 2
    turn.status, turn.usage, turn.billed_cost = TurnStatus.COMPLETED, Usage(10, 20, 3, 4), "0.00012345"
    await store.commit(Checkpoint("t1", "sess_i1", turns=[turn]))
    stored = await store.get_turn("t1", "turn1")
    assert stored is not None and stored.status is TurnStatus.COMPLETED
    assert stored.usage == Usage(10, 20, 3, 4) and stored.billed_cost == "0.00012345"
    assert await store.get_turn("t2", "turn1") is None
    assert [t.turn_id for t in await store.list_turns("t1", "sess_i1")] == ["turn1"]


async def test_seq_reservations_never_go_back(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    assert await store.reserve_seqs("t1", "sess_i1", 100) == (1, 100)
    assert await store.reserve_seqs("t1", "sess_i1", 100) == (101, 200)
    await store.commit(Checkpoint("t1", "sess_i1", events=[LoggedEvent(500, "x", "{}", 1)]))
    assert await store.reserve_seqs("t1", "sess_i1", 10) == (501, 510)


async def test_delete_image_removes_everything_of_its_session(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    await store.create_image(*image("t1", "i2"))
    await store.put_agent(Agent("t1", "a1", "i1", "c1", "n", 1))
    for sid, iid in [("sess_i1", "i1"), ("sess_i2", "i2")]:
        await store.commit(Checkpoint(
            "t1", sid, messages=[StoredMessage(sid, f"m_{iid}", {"id": f"m_{iid}", "timestamp": 1}, "t")],
            events=[LoggedEvent(1, "x", "{}", 1)],
            turns=[Turn("t1", f"turn_{iid}", sid, iid, "c1", f"m_{iid}", TurnStatus.COMPLETED, 1)]))
    assert await store.delete_image("t2", "i1") is False
    assert await store.delete_image("t1", "i1") is True
    assert await store.delete_image("t1", "i1") is False
    assert await store.get_image("t1", "i1") is None and await store.get_session("t1", "sess_i1") is None
    assert await store.list_messages("t1", "sess_i1") == [] and await store.read_events("t1", "sess_i1", 0) == []
    assert await store.get_agent("t1", "a1") is None and await store.get_turn("t1", "turn_i1") is None
    assert [m.message_id for m in await store.list_messages("t1", "sess_i2")] == ["m_i2"]


async def test_an_image_has_several_sessions_each_with_its_own_history(store: Store) -> None:
    await store.create_image(*image("t1", "i1", created=1))
    await store.create_image(*image("t1", "i2", created=1))
    second = Session("t1", "sess_b", "i1", "c1", 5, 5, "second")
    assert await store.create_session(second) is True
    assert await store.create_session(Session("t1", "sess_c", "i1", "c1", 7, 7)) is True
    with pytest.raises(Conflict):
        await store.create_session(Session("t1", "sess_b", "i1", "c1", 9, 9))
    # only onto an existing image of the same tenant and container
    assert await store.create_session(Session("t2", "sess_x", "i1", "c1", 9, 9)) is False
    assert await store.create_session(Session("t1", "sess_x", "i1", "c2", 9, 9)) is False
    assert await store.create_session(Session("t1", "sess_x", "nope", "c1", 9, 9)) is False
    assert await store.get_session("t1", "sess_x") is None
    assert await store.get_session("t1", "sess_b") == second
    assert await store.get_session("t2", "sess_b") is None
    assert [x.session_id for x in await store.list_sessions("t1", "i1")] == ["sess_i1", "sess_b", "sess_c"]
    assert [x.title for x in await store.list_sessions("t1", "i1")] == [None, "second", None]
    assert await store.list_sessions("t2", "i1") == []
    for sid in ("sess_i1", "sess_b"):
        await store.commit(Checkpoint("t1", sid, messages=[StoredMessage(sid, f"m_{sid}", {"id": sid}, "t")],
                                      events=[LoggedEvent(1, "x", "{}", 1)],
                                      turns=[Turn("t1", f"turn_{sid}", sid, "i1", "c1", f"m_{sid}",
                                                  TurnStatus.COMPLETED, 1)]))
    assert [m.message_id for m in await store.list_messages("t1", "sess_b")] == ["m_sess_b"]
    assert await store.reserve_seqs("t1", "sess_b", 10) == (2, 11)  # a seq order of its own

    assert await store.delete_session("t2", "sess_b") is False
    assert await store.delete_session("t1", "sess_b") is True
    assert await store.delete_session("t1", "sess_b") is False
    assert await store.get_session("t1", "sess_b") is None and await store.get_turn("t1", "turn_sess_b") is None
    assert await store.list_messages("t1", "sess_b") == [] and await store.read_events("t1", "sess_b", 0) == []
    assert [x.session_id for x in await store.list_sessions("t1", "i1")] == ["sess_i1", "sess_c"]
    assert [m.message_id for m in await store.list_messages("t1", "sess_i1")] == ["m_sess_i1"]

    await store.commit(Checkpoint("t1", "sess_c", messages=[StoredMessage("sess_c", "m_c", {"id": "c"}, None)]))
    assert await store.delete_image("t1", "i1") is True  # with every session of it
    for sid in ("sess_i1", "sess_c"):
        assert await store.get_session("t1", sid) is None and await store.list_messages("t1", sid) == []
    assert await store.list_sessions("t1", "i1") == []
    assert [x.session_id for x in await store.list_sessions("t1", "i2")] == ["sess_i2"]


async def test_the_tenants_turn_log_lists_finished_turns_newest_first_in_pages(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    await store.create_image(*image("t2", "i2"))
    statuses = [TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.RUNNING, TurnStatus.INTERRUPTED,
                TurnStatus.COMPLETED, TurnStatus.QUEUED]
    turns = [Turn("t1", f"turn{i}", "sess_i1", "i1", "c1", f"m{i}", st, 100 + i * 10, agent="code:chat_basic@1",
                  task=f"task {i}", options={"temperature": 0.5} if i == 0 else {}, started_at=100 + i * 10,
                  ended_at=105 + i * 10, key_id="avmk_k1" if i == 0 else None,
                  first_token_ms=3 if i == 0 else None)
             for i, st in enumerate(statuses)]
    await store.commit(Checkpoint("t1", "sess_i1", turns=turns))
    await store.commit(Checkpoint("t2", "sess_i2", turns=[Turn("t2", "other", "sess_i2", "i2", "c1", "m",
                                                               TurnStatus.COMPLETED, 120)]))
    first, cursor = await store.list_tenant_turns("t1", limit=2)
    assert [t.turn_id for t in first] == ["turn4", "turn3"] and cursor is not None
    second, cursor2 = await store.list_tenant_turns("t1", limit=2, cursor=cursor)
    assert [t.turn_id for t in second] == ["turn1", "turn0"] and cursor2 is None
    assert (second[1].agent, second[1].task, second[1].options, second[1].duration_ms, second[1].key_id,
            second[1].first_token_ms) == ("code:chat_basic@1", "task 0", {"temperature": 0.5}, 5, "avmk_k1", 3)
    assert (second[0].key_id, second[0].first_token_ms) == (None, None)
    window, _ = await store.list_tenant_turns("t1", since_ms=110, until_ms=140)
    assert [t.turn_id for t in window] == ["turn3", "turn1"]
    assert [t.turn_id for t in (await store.list_tenant_turns("t2"))[0]] == ["other"]
    assert (await store.list_tenant_turns("t3")) == ([], None)
    with pytest.raises(InvalidRequest, match="cursor: not a cursor of this list"):
        await store.list_tenant_turns("t1", cursor="bogus!")
    # a turn that finishes later joins the log
    turns[2].status = TurnStatus.COMPLETED
    await store.commit(Checkpoint("t1", "sess_i1", turns=[turns[2]]))
    assert [t.turn_id for t in (await store.list_tenant_turns("t1"))[0]] == ["turn4", "turn3", "turn2", "turn1",
                                                                             "turn0"]


async def test_unfinished_turns_and_event_pruning(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    turns = [Turn("t1", f"turn{i}", "sess_i1", "i1", "c1", f"m{i}", st, i)
             for i, st in enumerate([TurnStatus.QUEUED, TurnStatus.RUNNING, TurnStatus.COMPLETED])]
    events = [LoggedEvent(i, "x", "{}", created) for i, created in [(1, 100), (2, 200), (3, 300)]]
    await store.commit(Checkpoint("t1", "sess_i1", events=events, turns=turns))
    assert [t.turn_id for t in await store.list_unfinished_turns()] == ["turn0", "turn1"]
    assert await store.prune_events(older_than_ms=1000) == 2  # the newest event of a session stays
    assert [e.seq for e in await store.read_events("t1", "sess_i1", 0)] == [3]


async def test_sqlite_schema_is_versioned_and_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    s = SqliteStore(path)
    await s.open()
    assert await s.integrity_check() == "ok"
    await s.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.execute("PRAGMA user_version=99")
    with pytest.raises(RuntimeError, match="schema version 99 is newer"):
        await SqliteStore(path).open()


async def test_sqlite_migrates_an_existing_database_in_place(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:  # a database written by the first schema version
        conn.executescript(MIGRATIONS[0])
        conn.execute("INSERT INTO containers VALUES ('t1', 'c1', 1, 1)")
        conn.execute("PRAGMA user_version=1")
    s = SqliteStore(path)
    await s.open()
    try:
        assert await s.get_container("t1", "c1") == Container("t1", "c1", 1, 1)
        await s.create_resource(res("t1", "r1", "prompt", "p", "1.0.0"))
        assert [v.version for v in await s.find_resource("t1", "prompt", "p")] == ["1.0.0"]
        assert await s.integrity_check() == "ok"
    finally:
        await s.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == 11


# ---- resources ---------------------------------------------------------------------------------


def vkey(version: str) -> str:
    """A key that sorts like the version (release versions only; the tests build their own)."""
    major, minor, patch = (int(p) for p in version.split("."))
    return f"{major:06d}.{minor:06d}.{patch:06d}~"


def res(tenant: str, rid: str, kind: str, name: str, version: str = "1.0.0", *, published: bool = False,
        description: str = "", tags: tuple[str, ...] = (), created: int = 1) -> ResourceVersion:
    return ResourceVersion(
        tenant_id=tenant, resource_id=rid, kind=kind, name=name, version=version, version_key=vkey(version),
        content={"text": f"{name}@{version}", "n": [1, 2.5, None, {"x": True}]}, content_hash=f"sha256:{version}",
        dependencies=("resource://tools/search@^1.0.0",), description=description, tags=tags, published=published,
        created_at=created)


async def versions(store: Store, tenant: str, rid: str) -> list[str]:
    return [v.version for v in await store.resource_versions(tenant, rid)]


async def test_resource_versions_are_kept_and_ordered_by_version_key(store: Store) -> None:
    first = res("t1", "r1", "prompt", "sales-assistant", "1.0.0", description="Sells", tags=("sales", "en"))
    await store.create_resource(first)
    for version in ("1.10.0", "1.2.0", "0.9.0"):
        await store.add_resource_version(res("t1", "r1", "prompt", "sales-assistant", version, created=2))
    assert await versions(store, "t1", "r1") == ["1.10.0", "1.2.0", "1.0.0", "0.9.0"]
    stored = await store.resource_versions("t1", "r1")
    assert stored[-2] == first  # every field round-trips (content's floats and nulls included)
    assert [v.version for v in await store.find_resource("t1", "prompt", "sales-assistant")] == \
        ["1.10.0", "1.2.0", "1.0.0", "0.9.0"]
    assert await store.resource_versions("t1", "nope") == []
    assert await store.find_resource("t1", "tool", "sales-assistant") == []


async def test_resource_names_and_versions_are_unique(store: Store) -> None:
    await store.create_resource(res("t1", "r1", "prompt", "sales-assistant"))
    with pytest.raises(Conflict, match="Resource already exists: prompt/sales-assistant"):
        await store.create_resource(res("t1", "r2", "prompt", "sales-assistant"))
    await store.create_resource(res("t1", "r3", "tool", "sales-assistant"))  # another kind
    await store.create_resource(res("t2", "r4", "prompt", "sales-assistant"))  # another tenant
    await store.add_resource_version(res("t1", "r1", "prompt", "sales-assistant", "1.2.0"))
    with pytest.raises(Conflict, match=r"Version 1\.2\.0 of prompt/sales-assistant already exists"):
        await store.add_resource_version(res("t1", "r1", "prompt", "sales-assistant", "1.2.0", created=9))
    assert await versions(store, "t1", "r1") == ["1.2.0", "1.0.0"]
    assert (await store.resource_versions("t1", "r1"))[0].created_at == 1  # the first write stays
    with pytest.raises(NotFound):
        await store.add_resource_version(res("t1", "missing", "prompt", "other"))


async def test_another_tenant_can_add_to_and_read_only_what_is_published(store: Store) -> None:
    await store.create_resource(res("t1", "r1", "prompt", "private"))
    with pytest.raises(NotFound):
        await store.add_resource_version(res("t2", "r1", "prompt", "private", "2.0.0"))
    assert await versions(store, "t1", "r1") == ["1.0.0"]
    assert await store.resource_versions("t2", "r1") == []
    assert await store.find_resource("t2", "prompt", "private") == []
    assert await store.list_resources("t2") == ([], None)

    await store.create_resource(res("t1", "r2", "prompt", "public", published=True))
    await store.add_resource_version(res("t1", "r2", "prompt", "public", "1.1.0", published=True))
    assert await versions(store, "t2", "r2") == ["1.1.0", "1.0.0"]
    found = await store.find_resource("t2", "prompt", "public")
    assert [(v.tenant_id, v.version, v.published) for v in found] == [("t1", "1.1.0", True), ("t1", "1.0.0", True)]
    page, _ = await store.list_resources("t2")
    assert [(v.tenant_id, v.name, v.version) for v in page] == [("t1", "public", "1.1.0")]
    with pytest.raises(NotFound):  # published is readable, not writable
        await store.add_resource_version(res("t2", "r2", "prompt", "public", "2.0.0"))

    # a version that is not published withdraws the resource from other tenants
    await store.add_resource_version(res("t1", "r2", "prompt", "public", "1.2.0"))
    assert await store.resource_versions("t2", "r2") == []
    assert await store.find_resource("t2", "prompt", "public") == []
    assert await store.list_resources("t2") == ([], None)
    assert [v.published for v in await store.resource_versions("t1", "r2")] == [False, False, False]


async def test_a_published_name_is_unique_across_tenants(store: Store) -> None:
    await store.create_resource(res("t1", "r1", "prompt", "shared", published=True))
    with pytest.raises(Conflict, match="prompt/shared"):
        await store.create_resource(res("t2", "r2", "prompt", "shared", published=True))
    assert await store.find_resource("t2", "prompt", "shared") != []  # t1's, still
    await store.create_resource(res("t2", "r2", "prompt", "shared"))  # private: fine
    with pytest.raises(Conflict, match="prompt/shared"):
        await store.add_resource_version(res("t2", "r2", "prompt", "shared", "2.0.0", published=True))
    assert await versions(store, "t2", "r2") == ["1.0.0"]
    await store.create_resource(res("t2", "r3", "tool", "shared", published=True))  # another kind
    # once t1 withdraws it, t2 may publish that name
    await store.add_resource_version(res("t1", "r1", "prompt", "shared", "1.1.0"))
    await store.add_resource_version(res("t2", "r2", "prompt", "shared", "2.0.0", published=True))
    with pytest.raises(Conflict, match="prompt/shared"):
        await store.add_resource_version(res("t1", "r1", "prompt", "shared", "1.2.0", published=True))
    assert await versions(store, "t3", "r2") == ["2.0.0", "1.0.0"]


async def test_find_resource_prefers_the_tenants_own_resource(store: Store) -> None:
    await store.create_resource(res("t1", "r1", "prompt", "helper", "3.0.0", published=True))
    await store.create_resource(res("t2", "r2", "prompt", "helper", "1.0.0"))
    assert [(v.tenant_id, v.version) for v in await store.find_resource("t2", "prompt", "helper")] == \
        [("t2", "1.0.0")]
    assert [(v.tenant_id, v.version) for v in await store.find_resource("t3", "prompt", "helper")] == \
        [("t1", "3.0.0")]
    assert [(v.tenant_id, v.version) for v in await store.resource_versions("t2", "r1")] == [("t1", "3.0.0")]


async def list_all(store: Store, tenant: str, *, kind: str | None = None, name: str | None = None,
                   tag: str | None = None, query: str | None = None) -> list[tuple[str, str, str]]:
    """One page with everything (kind, name, owner) that matches."""
    page, cursor = await store.list_resources(tenant, kind=kind, name=name, tag=tag, query=query)
    assert cursor is None
    return [(v.kind, v.name, v.tenant_id) for v in page]


async def test_list_resources_filters_and_shows_the_latest_version(store: Store) -> None:
    await store.create_resource(res("t1", "r1", "prompt", "sales-assistant", tags=("sales",),
                                    description="Helps the Sales team"))
    await store.add_resource_version(res("t1", "r1", "prompt", "sales-assistant", "1.1.0", tags=("sales", "crm"),
                                         description="Helps the Sales team"))
    await store.add_resource_version(res("t1", "r1", "prompt", "sales-assistant", "1.0.1"))  # a late patch
    await store.create_resource(res("t1", "r2", "prompt", "sales-coach", tags=("coaching",)))
    await store.create_resource(res("t1", "r3", "tool", "sales-lookup", description="CRM lookup"))
    await store.create_resource(res("t2", "r4", "prompt", "support", published=True, tags=("crm",)))
    await store.create_resource(res("t2", "r5", "prompt", "secret", tags=("crm",)))  # private: never listed

    page, cursor = await store.list_resources("t1")
    assert cursor is None
    assert [(v.kind, v.name, v.version) for v in page] == [
        ("prompt", "sales-assistant", "1.1.0"), ("prompt", "sales-coach", "1.0.0"), ("prompt", "support", "1.0.0"),
        ("tool", "sales-lookup", "1.0.0")]
    assert page[0].tags == ("sales", "crm") and page[0].content == {"text": "sales-assistant@1.1.0",
                                                                    "n": [1, 2.5, None, {"x": True}]}
    assert await list_all(store, "t1", kind="tool") == [("tool", "sales-lookup", "t1")]
    assert await list_all(store, "t1", kind="prompt", name="sales-") == [
        ("prompt", "sales-assistant", "t1"), ("prompt", "sales-coach", "t1")]
    assert await list_all(store, "t1", name="sales-") == [
        ("prompt", "sales-assistant", "t1"), ("prompt", "sales-coach", "t1"), ("tool", "sales-lookup", "t1")]
    assert await list_all(store, "t1", name="Sales") == []  # a prefix is exact
    assert await list_all(store, "t1", tag="crm") == [("prompt", "sales-assistant", "t1"), ("prompt", "support", "t2")]
    assert await list_all(store, "t1", tag="cr") == []  # a tag is exact
    assert await list_all(store, "t1", query="crm") == [  # name, description or tags, any case
        ("prompt", "sales-assistant", "t1"), ("prompt", "support", "t2"), ("tool", "sales-lookup", "t1")]
    assert await list_all(store, "t1", query="SALES TEAM") == [("prompt", "sales-assistant", "t1")]
    assert await list_all(store, "t1", query="COACH") == [("prompt", "sales-coach", "t1")]
    assert await list_all(store, "t1", kind="prompt", tag="crm", query="support") == [("prompt", "support", "t2")]
    assert await list_all(store, "t2") == [("prompt", "secret", "t2"), ("prompt", "support", "t2")]
    assert await list_all(store, "t3") == [("prompt", "support", "t2")]


async def test_list_resources_pages_are_disjoint_and_complete(store: Store) -> None:
    # own and published resources interleave, one name exists twice (own and another tenant's)
    await store.create_resource(res("t1", "r1", "prompt", "b"))
    await store.create_resource(res("t2", "r2", "prompt", "b", published=True))
    await store.create_resource(res("t2", "r3", "prompt", "a", published=True))
    await store.create_resource(res("t1", "r4", "prompt", "c", published=True))
    await store.create_resource(res("t1", "r5", "agent", "z"))
    await store.create_resource(res("t2", "r6", "prompt", "d"))  # private to t2
    pages: list[list[tuple[str, str, str]]] = []
    cursor: str | None = None
    while True:
        page, cursor = await store.list_resources("t1", limit=2, cursor=cursor)
        pages.append([(v.kind, v.name, v.tenant_id) for v in page])
        if cursor is None:
            break
    assert pages == [[("agent", "z", "t1"), ("prompt", "a", "t2")],
                     [("prompt", "b", "t1"), ("prompt", "b", "t2")],
                     [("prompt", "c", "t1")]]
    # with filters: the cursor continues the filtered listing
    first, cursor = await store.list_resources("t1", kind="prompt", limit=1)
    assert [v.name for v in first] == ["a"] and cursor is not None
    rest, end = await store.list_resources("t1", kind="prompt", limit=10, cursor=cursor)
    assert [(v.name, v.tenant_id) for v in rest] == [("b", "t1"), ("b", "t2"), ("c", "t1")] and end is None


async def test_delete_resource_removes_every_version_and_frees_the_names(store: Store) -> None:
    await store.create_resource(res("t1", "r1", "prompt", "gone", published=True))
    await store.add_resource_version(res("t1", "r1", "prompt", "gone", "1.1.0", published=True))
    await store.create_resource(res("t1", "r2", "prompt", "kept"))
    assert await store.delete_resource("t2", "r1") is False  # another tenant's: nothing happens
    assert await versions(store, "t1", "r1") == ["1.1.0", "1.0.0"]
    assert await store.delete_resource("t1", "r1") is True
    assert await store.delete_resource("t1", "r1") is False
    assert await store.resource_versions("t1", "r1") == [] and await store.resource_versions("t2", "r1") == []
    assert await store.find_resource("t1", "prompt", "gone") == []
    assert await list_all(store, "t1") == [("prompt", "kept", "t1")]
    assert await list_all(store, "t2") == []
    with pytest.raises(NotFound):
        await store.add_resource_version(res("t1", "r1", "prompt", "gone", "2.0.0"))
    # both names are free again: the tenant's, and the published one for every tenant
    await store.create_resource(res("t2", "r3", "prompt", "gone", published=True))
    await store.create_resource(res("t1", "r4", "prompt", "gone", "5.0.0"))
    assert [(v.tenant_id, v.version) for v in await store.find_resource("t1", "prompt", "gone")] == [("t1", "5.0.0")]


async def test_list_resources_orders_by_kind_name_and_owner_whatever_the_characters(store: Store) -> None:
    names = ["a", "a b", "a!", "a#", "a$", "a%", "a%23", "a-b", "ab", "a\u00e9", "\u00e9", "b"]
    for n, name in enumerate(names):
        await store.create_resource(res("t1", f"r{n}", "prompt", name))
    await store.create_resource(res("t#2", "x1", "prompt", "a", published=True))
    await store.create_resource(res("t 2", "x2", "prompt", "a b", published=True))
    expected = sorted([("prompt", name, "t1") for name in names] + [("prompt", "a", "t#2"), ("prompt", "a b", "t 2")])
    assert await list_all(store, "t1") == expected
    listed: list[tuple[str, str, str]] = []
    cursor: str | None = None
    while True:
        page, cursor = await store.list_resources("t1", limit=3, cursor=cursor)
        listed += [(v.kind, v.name, v.tenant_id) for v in page]
        if cursor is None:
            break
    assert listed == expected
    assert await list_all(store, "t1", kind="prompt", name="a%") == [("prompt", "a%", "t1"), ("prompt", "a%23", "t1")]
    assert await list_all(store, "t1", kind="prompt", name="a#") == [("prompt", "a#", "t1")]


@pytest.mark.parametrize("cursor", ["", "%%%", "bm9wZQ=x"])
async def test_a_bad_list_cursor_is_an_invalid_request(store: Store, cursor: str) -> None:
    with pytest.raises(InvalidRequest, match="Invalid cursor"):
        await store.list_resources("t1", cursor=cursor)
