"""Agents: activation records of images. Creating one announces `agent_registered`; destroying one
interrupts its turn and announces `session_destroyed` and `agent_unregistered`."""

from __future__ import annotations

from agentvm.domain.models import Agent, Image, Principal
from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.hosting.session_events import AGENT_STOPPED_TEXT
from agentvm.hosting.session_host import SessionHost, session_views
from agentvm.ids import agent_id, now_ms
from agentvm.protocol import events as wire
from agentvm.protocol.envelope import encode, event


class AgentService:
    def __init__(self, deps: RuntimePorts, sessions: SessionHost) -> None:
        self.deps = deps
        self.sessions = sessions

    async def ensure(self, p: Principal, image: Image, *, read: bool = True) -> tuple[Agent, bool]:
        """The image's agent, created if it has none; True when it was created now. `read=False`: the
        caller has just read that it has none (the conditional put still keeps one agent per image)."""
        store = self.deps.store
        existing = await store.get_agent_for_image(p.tenant_id, image.image_id) if read else None
        if existing is not None:
            return existing, False
        ts = now_ms()
        wanted = Agent(p.tenant_id, agent_id(), image.image_id, image.container_id, image.name, ts)
        agent = await store.put_agent(wanted)
        created = agent.agent_id == wanted.agent_id
        if created:
            self.deps.fanout.to_container(p.tenant_id, agent.container_id, encode(event(
                "agent_registered", wire.agent_registered(agent.container_id, agent.agent_id, image.name, ts),
                {"containerId": agent.container_id, "agentId": agent.agent_id})))
        self.sessions.set_agent(image.session_id, agent.agent_id)
        return agent, created

    async def destroy(self, p: Principal, agent: Agent, image: Image | None) -> bool:
        store = self.deps.store
        if not await store.delete_agent(p.tenant_id, agent.agent_id):
            return False
        if image is not None:
            for session in await session_views(store, image):
                await self.sessions.stop(session, agent.agent_id, reason=AGENT_STOPPED_TEXT)
        self.deps.fanout.to_container(p.tenant_id, agent.container_id, encode(event(
            "agent_unregistered", wire.agent_unregistered(agent.container_id, agent.agent_id),
            {"containerId": agent.container_id, "agentId": agent.agent_id})))
        return True

    async def get(self, p: Principal, agent_id_: str) -> Agent | None:
        return await self.deps.store.get_agent(p.tenant_id, agent_id_)

    async def list(self, p: Principal, container_id: str | None) -> list[Agent]:
        return await self.deps.store.list_agents(p.tenant_id, container_id)

    async def get_for_image(self, p: Principal, image: Image) -> Agent | None:
        return await self.deps.store.get_agent_for_image(p.tenant_id, image.image_id)
