"""The `ImageRepository` port contract: every Store adapter runs it (the `store` fixture: SQLite, DynamoDB)."""

from __future__ import annotations

import pytest

from agentvm.domain.models import Agent, Checkpoint, LoggedEvent, Session, StoredMessage, Turn, TurnStatus
from agentvm.errors import Conflict, InvalidRequest
from agentvm.ports import Store
from tests.adapters.store_records import image


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


async def test_the_tenants_sessions_are_listed_newest_first_in_pages(store: Store) -> None:
    await store.create_image(*image("t1", "i1", created=10))
    await store.create_image(*image("t1", "i2", created=20))
    await store.create_image(*image("t2", "i9", created=30))  # another tenant's: never listed
    for sid, iid, created in [("sess_a", "i1", 15), ("sess_b", "i2", 25), ("sess_c", "i1", 25), ("sess_d#x", "i1", 40)]:
        assert await store.create_session(Session("t1", sid, iid, "c1", created, created)) is True
    every: list[str] = []
    cursor: str | None = None
    for _ in range(4):
        page, cursor = await store.list_tenant_sessions("t1", limit=2, cursor=cursor)
        every += [s.session_id for s in page]
        if cursor is None:
            break
    # created_at descending, the session id descending among equals
    assert every == ["sess_d#x", "sess_c", "sess_b", "sess_i2", "sess_a", "sess_i1"]
    first, more = await store.list_tenant_sessions("t1", limit=6)
    assert [s.session_id for s in first] == every and more is None
    assert first[0] == Session("t1", "sess_d#x", "i1", "c1", 40, 40)
    of_i1, c1 = await store.list_tenant_sessions("t1", image_id="i1", limit=2)
    assert [s.session_id for s in of_i1] == ["sess_d#x", "sess_c"] and c1 is not None
    rest, c2 = await store.list_tenant_sessions("t1", image_id="i1", limit=2, cursor=c1)
    assert [s.session_id for s in rest] == ["sess_a", "sess_i1"] and c2 is None
    assert await store.list_tenant_sessions("t2", image_id="i1") == ([], None)
    assert [s.session_id for s in (await store.list_tenant_sessions("t2"))[0]] == ["sess_i9"]
    assert await store.list_tenant_sessions("t3") == ([], None)
    with pytest.raises(InvalidRequest, match="cursor: not a cursor of this list"):
        await store.list_tenant_sessions("t1", cursor="bogus!")
    # a deleted session leaves the list at once
    assert await store.delete_session("t1", "sess_c") is True
    assert [s.session_id for s in (await store.list_tenant_sessions("t1", limit=3))[0]] == [
        "sess_d#x", "sess_b", "sess_i2"]
