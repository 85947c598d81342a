"""The function tier's tools: what the model may call, without a sandbox to run it in.

The built-in tools are listed from their static schemas and marked as needing a sandbox, so a call
of one escalates the turn (agentvm/services/turn_scheduler.py). Images that enable no tools get
`NoTools`; tools of other kinds join here as they come (MCP: see `McpCatalog`).
"""

from __future__ import annotations

from agentvm.domain.models import Image
from agentvm.engine.tools import NoTools, SandboxCatalog, ToolRunner
from agentvm.errors import InvalidRequest
from agentvm.tools.builtin import BUILTIN_TOOLS, BuiltinTools


def enabled_builtins(image: Image) -> tuple[str, ...]:
    enabled = tuple(str(t) for t in image.config.get("tools") or ())
    unknown = [n for n in enabled if n not in BUILTIN_TOOLS]
    if unknown:
        raise InvalidRequest(f"tools: unknown tool '{unknown[0]}' (built-in: {', '.join(BUILTIN_TOOLS)})",
                             field="tools")
    return enabled


class BuiltinCatalog:
    """`ToolProvider` of the function tier for the built-in tools."""

    async def for_image(self, image: Image) -> ToolRunner:
        enabled = enabled_builtins(image)
        return SandboxCatalog(BuiltinTools.definitions(enabled)) if enabled else NoTools()
