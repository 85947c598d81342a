"""The tools of a turn: the image's enabled built-in tools on its container's workspace.

Workspaces live under one base directory: `containers/<id>/workspace` for the default tenant (the
open local mode) and `tenants/<tenant>/containers/<id>/workspace` for the others, so two tenants'
containers of the same id never share files. The process runner is chosen by the composition root.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from agentvm.domain.models import DEFAULT_TENANT, Image
from agentvm.drivers.base import ToolOutcome
from agentvm.engine.tools import NoTools, ToolRunner
from agentvm.ports import ProcessRunner
from agentvm.sandbox.limits import Limits
from agentvm.sandbox.runtime import Runtime, tool_env
from agentvm.sandbox.workspace import Workspace
from agentvm.tools.builtin import DEFAULT_PREVIEW_BYTES, JSON, BuiltinTools

log = logging.getLogger(__name__)

def workspace_dir(base: Path, tenant_id: str, container_id: str) -> Path:
    # container ids match ^[A-Za-z0-9][A-Za-z0-9._:@-]*$ (no '/', never '..'); tenant ids are quoted
    if tenant_id == DEFAULT_TENANT:
        return base / "containers" / container_id / "workspace"
    return base / "tenants" / urllib.parse.quote(tenant_id, safe="") / "containers" / container_id / "workspace"


class UnavailableTools:
    """The image enables tools but its workspace cannot be opened: every call says why."""

    def __init__(self, schemas: list[JSON], reason: str) -> None:
        self._schemas = schemas
        self.reason = reason

    def schemas(self) -> list[JSON]:
        return self._schemas

    async def run(self, name: str, input_: JSON) -> ToolOutcome:
        return ToolOutcome(f"{name}: {self.reason}", is_error=True)


class WorkspaceTools:
    """`ToolProvider` for runtimes that run tools next to the engine (`avm serve`, the container tier)."""

    def __init__(self, base: Path, process_for: Callable[[Path], ProcessRunner], *, limits: Limits | None = None,
                 preview_bytes: int = DEFAULT_PREVIEW_BYTES) -> None:
        self.base = base
        self.process_for = process_for
        self.limits = limits or Limits()
        self.preview_bytes = preview_bytes

    async def for_image(self, image: Image) -> ToolRunner:
        enabled = tuple(str(t) for t in image.config.get("tools") or ())
        if not enabled:
            return NoTools()
        root = workspace_dir(self.base, image.tenant_id, image.container_id)
        try:
            workspace = await Workspace.open(root)
        except OSError as exc:
            log.error("workspace unavailable", extra={"container_id": image.container_id, "error": str(exc)})
            return UnavailableTools(BuiltinTools.definitions(enabled),
                                    "the container's workspace is unavailable on the server")
        runtime = Runtime(workspace, self.process_for(workspace.root), env=tool_env(str(workspace.root)))
        return BuiltinTools(runtime, enabled, limits=self.limits, preview_bytes=self.preview_bytes)
