"""The local `Disk`: a container's workspace is a directory under the data directory.

The directory is `agentvm.tools.provider.workspace_dir(base, tenant, container)`, created with mode
0o700 when missing; the directories above it (`containers/`, `tenants/<t>/containers/<id>/`...) are
0o711: a tool's uid may pass through them to its own workspace (without bubblewrap it must), but no
uid other than the server's may list which tenants and containers exist. It is the durable copy
itself, so `sync` and `unmount` have nothing to do.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from agentvm.sandbox.workspace import workspace_dir


class LocalDisk:
    """`Disk` over the workspaces under `base` (`avm serve`'s data directory)."""

    def __init__(self, base: Path) -> None:
        self.base = base

    async def mount(self, tenant_id: str, container_id: str) -> Path:
        path = workspace_dir(self.base, tenant_id, container_id)
        await asyncio.to_thread(_make_dirs, self.base, path)
        return path

    async def sync(self, tenant_id: str, container_id: str) -> None:
        return None  # the directory is the durable copy

    async def unmount(self, tenant_id: str, container_id: str) -> None:
        return None


def _make_dirs(base: Path, path: Path) -> None:
    """The directories from `base` down to the workspace `path`: 0o711 above it, 0o700 for it. On the
    ones this process owns, modes set before are corrected: the ones above become 0o711 (a `mkdir -p`
    of an older version made them 0o755); a workspace keeps its owner's and group's bits and loses
    every right of other uids."""
    base.mkdir(parents=True, exist_ok=True)
    parts = path.relative_to(base).parts
    current = base
    for depth, part in enumerate(parts):
        current = current / part
        workspace = depth == len(parts) - 1
        made = True
        try:
            os.mkdir(current, 0o700 if workspace else 0o711)
        except FileExistsError:
            made = False
        st = os.lstat(current)
        if st.st_uid != os.geteuid():
            continue
        mode = stat.S_IMODE(st.st_mode)
        want = 0o711 if not workspace else 0o700 if made else mode & ~0o007
        if mode != want:
            os.chmod(current, want)  # also what a umask took away from a new one


if TYPE_CHECKING:
    from agentvm.ports import Disk

    def _implements_disk(disk: LocalDisk) -> Disk:  # mypy checks the port's signatures
        return disk
