"""The `AgentRepository` port contract: every Store adapter runs it (the `store` fixture: SQLite, DynamoDB)."""

from __future__ import annotations

from agentvm.domain.models import Agent, Session
from agentvm.ports import Store
from tests.adapters.store_records import image


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


async def test_the_image_and_its_agent_in_one_read(store: Store) -> None:
    img, session = image("t1", "i1")
    await store.create_image(img, session)
    for n in range(2):  # more sessions of the image: entries in its partition (DynamoDB), never returned
        await store.create_session(Session("t1", f"s-extra-{n}", "i1", img.container_id, 10 + n, 10 + n))
    assert await store.get_image_and_agent("t1", "i1") == (img, None)
    agent = await store.put_agent(Agent("t1", "a1", "i1", img.container_id, "n", 1))
    assert await store.get_image_and_agent("t1", "i1") == (img, agent)
    assert await store.get_image_and_agent("t2", "i1") == (None, None)  # another tenant's
    assert await store.get_image_and_agent("t1", "i2") == (None, None)
    assert await store.delete_image("t1", "i1")
    assert await store.get_image_and_agent("t1", "i1") == (None, None)
