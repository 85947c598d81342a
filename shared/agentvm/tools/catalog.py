"""The function tier's tools: what the model may call, without a sandbox to run it in.

* Built-in tools: their static schemas, marked as needing a sandbox, so a call of one escalates the
  turn (agentvm/hosting/turn_scheduler.py).
* Remote MCP servers (streamable HTTP, SSE), HTTP tools and `knowledge_search`: run here, in place.
* Stdio MCP servers run in the container; their tool list is known once the container tier has
  listed them (`StdioSchemas`, filled by `WorkspaceTools`). Until then, and where this runtime keeps
  no list (the cloud's function tier), a turn of such an image starts in the container tier
  (`ContainerOnly`). A server that did not start there is left out for a while (`StdioSchemas.failure`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agentvm.domain.models import Image
from agentvm.engine.tools import CompositeTools, ContainerOnly, NoTools, SandboxCatalog
from agentvm.ports import Store, ToolRunner
from agentvm.tools.builtin import BuiltinTools, check_builtin_names
from agentvm.tools.knowledge import knowledge_tools
from agentvm.tools.mcp import McpPool, McpServerConfig, config_fingerprint, parse_mcp_servers, unconfined
from agentvm.tools.mcp_failures import NotStarted
from agentvm.tools.resource_tools import http_tools

JSON = dict[str, Any]


def enabled_builtins(image: Image) -> tuple[str, ...]:
    return check_builtin_names(list(image.config.get("tools") or ()))


def mcp_servers(image: Image) -> dict[str, McpServerConfig]:
    return parse_mcp_servers(image.config.get("mcpServers"))


async def released_servers(store: Store | None, image: Image) -> set[tuple[str, str]]:
    """The MCP servers, as (name, config fingerprint), that a deleted image leaves without a user: not
    the ones another image of its container runs with the same config (they share the connection)."""
    servers = mcp_servers(image)
    if not servers:
        return set()
    others = await store.list_images(image.tenant_id, image.container_id) if store is not None else []
    kept = {(cfg.name, config_fingerprint(cfg)) for other in others if other.image_id != image.image_id
            for cfg in mcp_servers(other).values()}
    return {(cfg.name, config_fingerprint(cfg)) for cfg in servers.values()} - kept


class StdioSchemas:
    """The tool lists of stdio MCP servers as their container last listed them, by tenant and config,
    and the start failures of the ones that did not start. A failure is trusted for `retry_s`: until
    then the function tier runs the image's turns without that server (a call of one of its tools says
    why) instead of sending every turn to the container tier; after it, one turn goes there to retry."""

    def __init__(self, *, retry_s: float = 300.0) -> None:
        self.retry_s = retry_s
        self._known: dict[tuple[str, str], list[JSON]] = {}
        self._failed: dict[tuple[str, str], tuple[str, float]] = {}

    def remember(self, tenant_id: str, cfg: McpServerConfig, schemas: list[JSON]) -> None:
        key = (tenant_id, config_fingerprint(cfg))
        self._known[key] = schemas
        self._failed.pop(key, None)

    def lookup(self, tenant_id: str, cfg: McpServerConfig) -> list[JSON] | None:
        return self._known.get((tenant_id, config_fingerprint(cfg)))

    def remember_failure(self, tenant_id: str, cfg: McpServerConfig, reason: str) -> None:
        key = (tenant_id, config_fingerprint(cfg))
        self._known.pop(key, None)
        self._failed[key] = (reason, time.monotonic())

    def failure(self, tenant_id: str, cfg: McpServerConfig) -> str | None:
        """Why the server did not start at its last try, while that is recent (`retry_s`)."""
        failed = self._failed.get((tenant_id, config_fingerprint(cfg)))
        if failed is None or time.monotonic() - failed[1] >= self.retry_s:
            return None
        return failed[0]


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
            failed: dict[str, str] = {}
            for cfg in servers.values():
                if cfg.needs_sandbox:
                    schemas = self.stdio.lookup(image.tenant_id, cfg)
                    if schemas is None:
                        if (reason := self.stdio.failure(image.tenant_id, cfg)) is not None:
                            failed[cfg.name] = reason
                            continue
                        return ContainerOnly(f"the tools of MCP server '{cfg.name}' are not listed yet")
                    listed += schemas
            if listed:
                parts.append(SandboxCatalog(listed))
            if failed:
                parts.append(NotStarted(failed))
            remote = {name: cfg for name, cfg in servers.items() if not cfg.needs_sandbox}
            if remote:
                parts.append(await self.pool.tools((image.tenant_id, image.container_id), remote, cwd=Path("/"),
                                                   env={}, launcher=unconfined))
        if not parts:
            return NoTools()
        return parts[0] if len(parts) == 1 else CompositeTools(parts)
