"""The function tier's tools: what the model may call, without a sandbox to run it in.

* Built-in tools: their static schemas, marked as needing a sandbox, so a call of one escalates the
  turn (agentvm/hosting/turn_scheduler.py).
* Remote MCP servers (streamable HTTP, SSE), HTTP tools and `knowledge_search`: run here, in place.
* Stdio MCP servers run in the container; their tool list is known once the container tier has
  listed them (`StdioSchemas`, filled by `WorkspaceTools`). Until then, and where this runtime keeps
  no list (the cloud's function tier), a turn of such an image starts in the container tier
  (`ContainerOnly`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentvm.domain.models import Image
from agentvm.engine.tools import CompositeTools, ContainerOnly, NoTools, SandboxCatalog
from agentvm.ports import Store, ToolRunner
from agentvm.tools.builtin import BuiltinTools, check_builtin_names
from agentvm.tools.knowledge import knowledge_tools
from agentvm.tools.mcp import McpPool, McpServerConfig, config_fingerprint, parse_mcp_servers, unconfined
from agentvm.tools.resource_tools import http_tools

JSON = dict[str, Any]


def enabled_builtins(image: Image) -> tuple[str, ...]:
    return check_builtin_names(list(image.config.get("tools") or ()))


def mcp_servers(image: Image) -> dict[str, McpServerConfig]:
    return parse_mcp_servers(image.config.get("mcpServers"))


class StdioSchemas:
    """The tool lists of stdio MCP servers as their container last listed them, by tenant and config."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], list[JSON]] = {}

    def remember(self, tenant_id: str, cfg: McpServerConfig, schemas: list[JSON]) -> None:
        self._known[(tenant_id, config_fingerprint(cfg))] = schemas

    def lookup(self, tenant_id: str, cfg: McpServerConfig) -> list[JSON] | None:
        return self._known.get((tenant_id, config_fingerprint(cfg)))


class ToolCatalog:
    """`ToolProvider` of the function tier. `pool`/`stdio`: where remote MCP servers run in place and
    where stdio servers' tool lists are kept; without them (the cloud's function tier) an image with
    MCP servers starts its turns in the container tier."""

    def __init__(self, *, pool: McpPool | None = None, stdio: StdioSchemas | None = None,
                 store: Store | None = None, sandbox: bool = True, http_allow_private: bool = False) -> None:
        self.pool = pool
        self.stdio = stdio
        self.store = store  # where knowledge resources are read (knowledge_search runs in place)
        self.sandbox = sandbox  # False: no container tier here, so neither built-in nor MCP tools
        self.http_allow_private = http_allow_private  # HTTP tools may call private addresses

    async def for_image(self, image: Image) -> ToolRunner:
        builtins = enabled_builtins(image) if self.sandbox else ()
        servers = mcp_servers(image) if self.sandbox else {}
        parts: list[ToolRunner] = []
        for extra in (knowledge_tools(self.store, image.tenant_id, image.config),
                      http_tools(image.config, allow_private=self.http_allow_private)):
            if extra is not None:
                parts.append(extra)
        if builtins:
            parts.append(SandboxCatalog(BuiltinTools.definitions(builtins)))
        if servers:
            if self.pool is None or self.stdio is None:
                return ContainerOnly("the image's MCP servers are reached from its container")
            listed: list[JSON] = []
            for cfg in servers.values():
                if cfg.needs_sandbox:
                    schemas = self.stdio.lookup(image.tenant_id, cfg)
                    if schemas is None:
                        return ContainerOnly(f"the tools of MCP server '{cfg.name}' are not listed yet")
                    listed += schemas
            if listed:
                parts.append(SandboxCatalog(listed))
            remote = {name: cfg for name, cfg in servers.items() if not cfg.needs_sandbox}
            if remote:
                parts.append(await self.pool.tools((image.tenant_id, image.container_id), remote, cwd=Path("/"),
                                                   env={}, launcher=unconfined))
        if not parts:
            return NoTools()
        return parts[0] if len(parts) == 1 else CompositeTools(parts)
