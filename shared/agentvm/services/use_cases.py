"""Every use case, wired over one set of runtime ports and one session host (the composition root
chooses the host: `hosting.local_host` for `avm serve`, `hosting.leased_host` in the cloud)."""

from __future__ import annotations

from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.hosting.session_host import SessionHost
from agentvm.services.agents import AgentService
from agentvm.services.containers import ContainerService
from agentvm.services.image_builder import ImageBuilder
from agentvm.services.image_sessions import ImageSessions
from agentvm.services.images import ImageService
from agentvm.services.resources import ResourceService
from agentvm.services.turns import TurnService


class UseCases:
    def __init__(self, deps: RuntimePorts, sessions: SessionHost) -> None:
        self.deps = deps
        self.sessions = sessions
        self.containers = ContainerService(deps)
        self.agents = AgentService(deps, self.sessions)
        self.resources = ResourceService(deps.store)
        self.images = ImageService(deps, self.sessions, self.containers, self.agents, ImageBuilder(self.resources))
        self.image_sessions = ImageSessions(deps, self.images)
        self.turns = TurnService(deps, self.sessions, self.images, self.agents, self.image_sessions)
