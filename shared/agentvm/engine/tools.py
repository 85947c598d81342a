"""The tool seam of the turn engine. Images without tools answer every call with an error result,
which the model sees and can recover from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from agentvm.drivers.base import ToolOutcome

if TYPE_CHECKING:
    from agentvm.domain.models import Image

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


class ToolProvider(Protocol):
    """The tools of a turn, from its image's config (the tool set and the container's workspace)."""

    async def for_image(self, image: Image) -> ToolRunner: ...


class NoToolProvider:
    """A runtime that runs no tools (yet): every image gets `NoTools`."""

    async def for_image(self, image: Image) -> ToolRunner:
        return NoTools()
