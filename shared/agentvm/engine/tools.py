"""The tool sets of the turn engine (its ports, `ToolRunner` and `ToolProvider`, are in ports.py).
Images without tools answer every call with an error result, which the model sees and can recover from.

Every tool says whether it needs a sandbox (a container's workspace and processes: the built-in
tools, stdio MCP servers). The function tier offers every tool to the model but runs only those
that need none; a call of one that does escalates the turn to the container tier (the scheduler).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentvm.drivers.base import ToolOutcome
from agentvm.ports import ToolRunner

if TYPE_CHECKING:
    from agentvm.domain.models import Image

JSON = dict[str, Any]


def unavailable(name: str) -> ToolOutcome:
    return ToolOutcome(f"Tool '{name}' is not available to this agent.", is_error=True)


class NoTools:
    """The tool set of an image that enables no tools."""

    def schemas(self) -> list[JSON]:
        return []

    def needs_sandbox(self, name: str) -> bool:
        return False

    async def run(self, name: str, input_: JSON) -> ToolOutcome:
        return unavailable(name)


class CompositeTools:
    """Several tool sets as one; a name belongs to the first set that offers it."""

    def __init__(self, parts: Sequence[ToolRunner]) -> None:
        self._schemas: list[JSON] = []
        self._owner: dict[str, ToolRunner] = {}
        self._parts = tuple(parts)
        for part in parts:
            for schema in part.schemas():
                name = str(schema["name"])
                if name not in self._owner:
                    self._owner[name] = part
                    self._schemas.append(schema)

    def schemas(self) -> list[JSON]:
        return self._schemas

    def needs_sandbox(self, name: str) -> bool:
        part = self._owner.get(name)
        return part is not None and part.needs_sandbox(name)

    async def run(self, name: str, input_: JSON) -> ToolOutcome:
        part = self._owner.get(name)
        if part is not None:
            return await part.run(name, input_)
        for part in self._parts:  # a part may know why a name is missing (an MCP server that did not start)
            explain = getattr(part, "unknown", None)
            if explain is not None and (outcome := explain(name)) is not None:
                return outcome  # type: ignore[no-any-return]
        return unavailable(name)


class SandboxCatalog:
    """The function tier's view of tools that need a sandbox: their schemas for the model, no way to
    run them here (a call escalates the turn before `run` is reached)."""

    def __init__(self, schemas: list[JSON]) -> None:
        self._schemas = schemas

    def schemas(self) -> list[JSON]:
        return self._schemas

    def needs_sandbox(self, name: str) -> bool:
        return any(s["name"] == name for s in self._schemas)

    async def run(self, name: str, input_: JSON) -> ToolOutcome:
        return ToolOutcome(f"Tool '{name}' runs in the container tier only.", is_error=True)


class ContainerOnly(NoTools):
    """The function tier's answer for an image whose tool list is known only inside its container
    (stdio MCP servers not yet listed there): the turn starts in the container tier."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class NoToolProvider:
    """A runtime that runs no tools: every image gets `NoTools`."""

    async def for_image(self, image: Image) -> ToolRunner:
        return NoTools()
