"""What the services share: the ports and the engine options, built by a composition root."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentvm.engine.runner import EngineOptions
from agentvm.engine.tools import NoTools, ToolRunner
from agentvm.ports import Driver, Fanout, Store


@dataclass(slots=True)
class Deps:
    store: Store
    fanout: Fanout
    driver: Driver
    options: EngineOptions
    tools: ToolRunner = field(default_factory=NoTools)
