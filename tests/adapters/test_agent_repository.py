"""The `AgentRepository` port contract: every Store adapter runs it (the `store` fixture: SQLite, DynamoDB)."""

from __future__ import annotations

from agentvm.domain.models import Agent
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
