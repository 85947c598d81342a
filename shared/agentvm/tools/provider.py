"""The container tier's tools: the image's built-in tools and MCP servers on its container's workspace.

The workspace directory comes from the `Disk` port (`avm serve`: a directory under the data
directory; the container task: the S3 copy pulled into the task, see `agentvm.sandbox.workspace.
workspace_dir`). The file system and the process runner are chosen by the composition root.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path

from agentvm.domain.models import Image
from agentvm.domain.sandbox_limits import Limits, limits_for
from agentvm.drivers.base import ToolOutcome
from agentvm.engine.tools import CompositeTools, NoTools
from agentvm.ports import Disk, FileSystemFactory, ProcessRunner, Store, ToolRunner
from agentvm.sandbox.quota import DiskPolicy
from agentvm.sandbox.runtime import Runtime, tool_env
from agentvm.sandbox.uids import ToolUids, hand_over
from agentvm.sandbox.workspace import Workspace
from agentvm.tools.builtin import DEFAULT_PREVIEW_BYTES, JSON, BuiltinTools
from agentvm.tools.catalog import StdioSchemas, enabled_builtins, mcp_servers, released_servers
from agentvm.tools.knowledge import knowledge_tools
from agentvm.tools.mcp import McpPool
from agentvm.tools.resource_tools import http_tools

log = logging.getLogger(__name__)

# A stdio MCP server lives across turns: its CPU limit is for its whole life, its wall clock unlimited.
MCP_SERVER_LIMITS = Limits(timeout_s=3600, cpu_s=3600, memory_bytes=2 << 30, processes=64)

class UnavailableTools:
    """The image enables tools but its workspace cannot be opened: every call says why."""

    def __init__(self, schemas: list[JSON], reason: str) -> None:
        self._schemas = schemas
        self.reason = reason

    def schemas(self) -> list[JSON]:
        return self._schemas

    def needs_sandbox(self, name: str) -> bool:
        return True

    async def run(self, name: str, input_: JSON) -> ToolOutcome:
        return ToolOutcome(f"{name}: {self.reason}", is_error=True)


class WorkspaceTools:
    """`ToolProvider` for runtimes that run tools next to the engine (`avm serve`, the container tier)."""

    def __init__(self, disk: Disk, files: FileSystemFactory, process_for: Callable[[Path], ProcessRunner], *,
                 uids: ToolUids,
                 limits: Limits | None = None, preview_bytes: int = DEFAULT_PREVIEW_BYTES,
                 mcp: McpPool | None = None, stdio: StdioSchemas | None = None,
                 mcp_limits: Limits = MCP_SERVER_LIMITS, store: Store | None = None,
                 http_allow_private: bool = False, disk_policy: DiskPolicy | None = None) -> None:
        self.disk = disk
        self.files = files
        self.process_for = process_for
        self.limits = limits or Limits()
        self.preview_bytes = preview_bytes
        self.uids = uids  # as root: each container's tools run as its own uid
        self.mcp = mcp if mcp is not None else McpPool()
        self.stdio = stdio  # where the tool lists of stdio servers are kept for the function tier
        self.mcp_limits = mcp_limits
        self.store = store  # knowledge resources (knowledge_search goes on after an escalation too)
        self.http_allow_private = http_allow_private
        # the workspace quota and disk reserve of the file tools (`process_for`'s runners get the same)
        self.disk_policy = disk_policy

    async def for_image(self, image: Image) -> ToolRunner:
        enabled = enabled_builtins(image)
        servers = mcp_servers(image)
        # tools that need no workspace go on after an escalation too
        in_place: list[ToolRunner] = [t for t in (
            knowledge_tools(self.store, image.tenant_id, image.config),
            http_tools(image.config, allow_private=self.http_allow_private)) if t is not None]
        if not enabled and not servers:
            if not in_place:
                return NoTools()
            return in_place[0] if len(in_place) == 1 else CompositeTools(in_place)
        try:
            root = await self.disk.mount(image.tenant_id, image.container_id)
            owner = await self._owner(image, root)
            workspace = await Workspace.open(root, self.files, owner=owner)
        except OSError as exc:
            log.error("workspace unavailable", extra={"container_id": image.container_id, "error": str(exc)})
            return UnavailableTools(BuiltinTools.definitions(enabled),
                                    "the container's workspace is unavailable on the server")
        env = tool_env(str(workspace.root))
        process = self.process_for(workspace.root)
        parts = in_place
        if enabled:
            runtime = Runtime(workspace, process, env=env)
            limits = limits_for(self.limits, image.config.get("sandbox"))
            parts.append(BuiltinTools(runtime, enabled, limits=limits, preview_bytes=self.preview_bytes,
                                      disk=self.disk_policy))
        if servers:
            launcher = functools.partial(process.sandboxed_argv, limits=self.mcp_limits)
            mcp = await self.mcp.tools((image.tenant_id, image.container_id), servers, cwd=workspace.root, env=env,
                                       launcher=launcher)
            if self.stdio is not None:
                for cfg in servers.values():
                    listed = mcp.schemas_of(cfg.name)
                    if cfg.needs_sandbox and listed is not None:
                        self.stdio.remember(image.tenant_id, cfg, listed)
                    elif cfg.needs_sandbox and cfg.name in mcp.failed:
                        self.stdio.remember_failure(image.tenant_id, cfg, mcp.failed[cfg.name])
            parts.append(mcp)
        return parts[0] if len(parts) == 1 else CompositeTools(parts)

    async def release(self, image: Image) -> int:
        """Stop the MCP servers of a deleted image, but not one that another image of its container uses
        with the same config (they share the connection); how many were stopped."""
        gone = await released_servers(self.store, image)
        return await self.mcp.stop_servers((image.tenant_id, image.container_id), gone) if gone else 0

    async def _owner(self, image: Image, root: Path) -> tuple[int, int] | None:
        """The container's own (uid, gid) when the server runs as root, else None (tools run as us)."""
        if os.geteuid() != 0:
            return None
        uid = await self.uids.uid_for(f"{image.tenant_id}/{image.container_id}")
        owner = (uid, uid)
        try:
            st = os.lstat(root)
        except FileNotFoundError:
            return owner
        if (st.st_uid, st.st_gid) != owner and st.st_uid != 0:
            # made before containers had their own uid (they shared nobody): hand its files over
            changed = await asyncio.to_thread(hand_over, root, (st.st_uid, st.st_gid), owner)
            log.info("workspace handed to its container's uid",
                     extra={"container_id": image.container_id, "uid": uid, "entries": changed})
        return owner
