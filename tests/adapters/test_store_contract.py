"""The Store port contract. Every adapter runs this suite (DynamoDB joins with the cloud tier)."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.domain.models import (
    Agent,
    Checkpoint,
    Container,
    Image,
    LoggedEvent,
    Session,
    StoredMessage,
    Turn,
    TurnStatus,
    Usage,
)
from agentvm.ports import Store


def _dynamodb(_: Path, request: pytest.FixtureRequest) -> Store:
    """A fresh table per test on the session's moto server (see conftest.py)."""
    request.getfixturevalue("aws_env")
    return DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", session=request.getfixturevalue("aws_session"),
                         endpoint_url=request.getfixturevalue("moto_endpoint"))


FACTORIES: dict[str, Callable[[Path, pytest.FixtureRequest], Store]] = {
    "sqlite": lambda d, _request: SqliteStore(d / "agentvm.db"),
    "dynamodb": _dynamodb,
}


@pytest.fixture(params=sorted(FACTORIES))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s = FACTORIES[request.param](tmp_path, request)
    await s.open()
    if isinstance(s, DynamoDBStore):
        await s.create_table()
    yield s
    await s.close()


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
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.execute("PRAGMA user_version=99")
    with pytest.raises(RuntimeError, match="schema version 99 is newer"):
        await SqliteStore(path).open()
