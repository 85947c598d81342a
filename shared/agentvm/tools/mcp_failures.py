"""What the model is told when it calls a tool of an MCP server that did not start.

A server that fails to start offers no tools that turn; a call of one of its tools (the model knows
the names from earlier turns) is answered with the start failure's reason, not with the "not
available to this agent" of a mistyped name. Tool names are `mcp__<server>__<tool>` (`qualified_names`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentvm.drivers.base import ToolOutcome
from agentvm.engine.tools import unavailable

TOOL_PREFIX = "mcp__"


def not_started(name: str, failed: Mapping[str, str]) -> ToolOutcome | None:
    """The error for a call of `name` when it is a tool of a server in `failed` (server -> why it did
    not start); None when it is not (the longest server name wins: servers `a` and `a__b`)."""
    servers = [s for s in failed if name.startswith(f"{TOOL_PREFIX}{s}__")]
    if not servers:
        return None
    server = max(servers, key=len)
    return ToolOutcome(f"Tool '{name}': MCP server '{server}' did not start: {failed[server]}", is_error=True)


class NotStarted:
    """A `ToolRunner` with no tools that answers calls of the failed servers' tools with the reason
    (the function tier, where those servers' tool lists are unknown)."""

    def __init__(self, failed: Mapping[str, str]) -> None:
        self.failed = dict(failed)

    def schemas(self) -> list[dict[str, Any]]:
        return []

    def needs_sandbox(self, name: str) -> bool:
        return False

    def unknown(self, name: str) -> ToolOutcome | None:
        return not_started(name, self.failed)

    async def run(self, name: str, input_: dict[str, Any]) -> ToolOutcome:
        return self.unknown(name) or unavailable(name)
