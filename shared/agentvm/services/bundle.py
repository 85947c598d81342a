"""All services over one set of ports and one session host."""

from __future__ import annotations

from agentvm.services.agents import AgentService
from agentvm.services.containers import ContainerService
from agentvm.services.deps import Deps
from agentvm.services.image_builder import ImageBuilder
from agentvm.services.images import ImageService
from agentvm.services.resources import ResourceService
from agentvm.services.session_center import SessionCenter
from agentvm.services.session_host import SessionHost
from agentvm.services.sessions import SessionRegistry
from agentvm.services.turns import TurnService


class Services:
    def __init__(self, deps: Deps, sessions: SessionHost | None = None) -> None:
        self.deps = deps
        self.sessions: SessionHost = sessions if sessions is not None else SessionRegistry(deps)
        self.containers = ContainerService(deps)
        self.agents = AgentService(deps, self.sessions)
        self.resources = ResourceService(deps.store)
        self.images = ImageService(deps, self.sessions, self.containers, self.agents, ImageBuilder(self.resources))
        self.session_center = SessionCenter(deps, self.images)
        self.turns = TurnService(deps, self.sessions, self.images, self.agents, self.session_center)
