"""What the services share: the ports and the engine options, built by a composition root."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentvm.engine.runner import EngineOptions
from agentvm.engine.tools import NoToolProvider, ToolProvider
from agentvm.ports import Driver, Fanout, Store


@dataclass(slots=True)
class Deps:
    store: Store
    fanout: Fanout
    # None where no turn runs (the cloud's `ws_default`: the driver and its key stay unloaded)
    driver: Driver | None
    options: EngineOptions
    tools: ToolProvider = field(default_factory=NoToolProvider)

    def llm(self) -> Driver:
        if self.driver is None:
            raise RuntimeError("this runtime runs no turns: it was built without an LLM driver")
        return self.driver
