"""Containers: the isolation boundary of one end user."""

from __future__ import annotations

from agentvm.domain.models import Container, Principal
from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.ids import now_ms
from agentvm.protocol import events as wire
from agentvm.protocol.envelope import encode, event


class ContainerService:
    def __init__(self, deps: RuntimePorts) -> None:
        self.deps = deps

    async def ensure(self, p: Principal, container_id: str) -> Container:
        """Get or create; a new container is announced to the tenant's connections."""
        ts = now_ms()
        container = Container(p.tenant_id, container_id, ts, ts)
        if await self.deps.store.create_container(container):
            self.deps.fanout.to_container(p.tenant_id, container_id, encode(event(
                "container_created", wire.container_created(container_id, ts),
                {"containerId": container_id})))
            return container
        found = await self.deps.store.get_container(p.tenant_id, container_id)
        return found or container

    async def get(self, p: Principal, container_id: str) -> Container | None:
        return await self.deps.store.get_container(p.tenant_id, container_id)

    async def list(self, p: Principal) -> list[Container]:
        return await self.deps.store.list_containers(p.tenant_id)
