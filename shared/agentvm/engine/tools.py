"""The tool seam of the turn engine. Images without tools answer every call with an error result,
which the model sees and can recover from."""

from __future__ import annotations

from typing import Any, Protocol

from agentvm.drivers.base import ToolOutcome

JSON = dict[str, Any]


class ToolRunner(Protocol):
    def schemas(self) -> list[JSON]:
        """Tool definitions given to the model (Anthropic `tools` shape)."""
        ...

    async def run(self, name: str, input_: JSON) -> ToolOutcome: ...


class NoTools:
    """The tool set of an image that enables no tools."""

    def schemas(self) -> list[JSON]:
        return []

    async def run(self, name: str, input_: JSON) -> ToolOutcome:
        return ToolOutcome(f"Tool '{name}' is not available to this agent.", is_error=True)
