"""Sending messages and interrupting turns."""

from __future__ import annotations

from typing import Any

from agentvm.domain.config_secrets import missing_secrets, missing_secrets_message
from agentvm.domain.models import Agent, Image, Principal, Turn
from agentvm.errors import InvalidRequest, NotFound, SecretsMissing
from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.hosting.session_host import SessionHost
from agentvm.services.agents import AgentService
from agentvm.services.image_sessions import ImageSessions
from agentvm.services.images import ImageService, require_sandbox


class TurnService:
    def __init__(self, deps: RuntimePorts, sessions: SessionHost, images: ImageService, agents: AgentService,
                 center: ImageSessions) -> None:
        self.deps = deps
        self.sessions = sessions
        self.images = images
        self.agents = agents
        self.center = center

    async def _target(self, p: Principal, image_id: str | None, agent_id: str | None,
                      session_id: str | None) -> tuple[Image, Agent | None]:
        """The image (as the session `session_id` runs it; None: its primary session) and its agent
        (read with the image when the caller named the image; None: it has none)."""
        if image_id:
            image, agent = await self.images.require_with_agent(p, image_id)
        elif agent_id:
            agent = await self.agents.get(p, agent_id)
            if agent is None:
                raise NotFound(f"Agent not found: {agent_id}", field="agentId")
            image = await self.images.require(p, agent.image_id)
        else:
            raise InvalidRequest("Either imageId or agentId must be provided", field="imageId")
        return await self.center.view(p, image, session_id), agent

    async def send(self, p: Principal, connection_id: str | None, image_id: str | None, agent_id: str | None,
                   content: str | list[dict[str, Any]], session_id: str | None = None,
                   options: dict[str, Any] | None = None) -> tuple[Image, Agent, Turn]:
        """Store the user message durably, announce it, and queue its turn. Returns the image as the
        session runs it (its `session_id` is the turn's session)."""
        image, agent = await self._target(p, image_id, agent_id, session_id)
        require_sandbox(self.deps, image.config, field="imageId")  # an image stored before: refused now
        if found := missing_secrets(image.config):  # imported from an archive without its secrets
            raise SecretsMissing(missing_secrets_message(found), field="imageId")
        if connection_id is not None:
            self.deps.fanout.attach(connection_id, image.session_id, image.container_id)
        if agent is None:  # the image has none (`_target` read it): activate one
            agent, _ = await self.agents.ensure(p, image, read=False)
        turn = await self.sessions.send(p, connection_id, image, agent.agent_id, content, options)
        return image, agent, turn

    async def interrupt(self, p: Principal, connection_id: str | None, image_id: str | None,
                        agent_id: str | None, session_id: str | None = None) -> tuple[Image, Agent | None]:
        image, agent = await self._target(p, image_id, agent_id, session_id)
        if connection_id is not None:
            self.deps.fanout.attach(connection_id, image.session_id, image.container_id)
        if agent is not None:
            await self.sessions.interrupt(image, agent.agent_id)
        return image, agent
