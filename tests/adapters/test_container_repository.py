"""The `ContainerRepository` port contract: every Store adapter runs it (the `store` fixture: SQLite, DynamoDB)."""

from __future__ import annotations

from agentvm.domain.models import Container
from agentvm.ports import Store


async def test_containers_are_created_once_and_scoped_by_tenant(store: Store) -> None:
    assert await store.create_container(Container("t1", "c1", 1, 1)) is True
    assert await store.create_container(Container("t1", "c1", 2, 2)) is False
    assert await store.create_container(Container("t2", "c1", 3, 3)) is True
    assert (await store.get_container("t1", "c1")) == Container("t1", "c1", 1, 1)
    assert await store.get_container("t3", "c1") is None
    await store.create_container(Container("t1", "c0", 5, 5))
    assert [c.container_id for c in await store.list_containers("t1")] == ["c1", "c0"]
