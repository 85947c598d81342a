"""The local `Disk`: a container's workspace is a directory under the data directory.

The directory is `agentvm.tools.provider.workspace_dir(base, tenant, container)`, created with mode
0o700 when missing. It is the durable copy itself, so `sync` and `unmount` have nothing to do.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from agentvm.sandbox.workspace import workspace_dir


class LocalDisk:
    """`Disk` over the workspaces under `base` (`avm serve`'s data directory)."""

    def __init__(self, base: Path) -> None:
        self.base = base

    async def mount(self, tenant_id: str, container_id: str) -> Path:
        path = workspace_dir(self.base, tenant_id, container_id)
        await asyncio.to_thread(path.mkdir, mode=0o700, parents=True, exist_ok=True)
        return path

    async def sync(self, tenant_id: str, container_id: str) -> None:
        return None  # the directory is the durable copy

    async def unmount(self, tenant_id: str, container_id: str) -> None:
        return None


if TYPE_CHECKING:
    from agentvm.ports import Disk

    def _implements_disk(disk: LocalDisk) -> Disk:  # mypy checks the port's signatures
        return disk
