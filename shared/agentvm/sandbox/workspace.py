"""A container's workspace: its files, under one root directory."""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

from agentvm.domain.models import DEFAULT_TENANT

if TYPE_CHECKING:
    from agentvm.ports import FileSystem, FileSystemFactory

# Tools run as this uid/gid (nobody/nogroup) when the server runs as root and no other is given.
DEFAULT_TOOL_UID = 65534
DEFAULT_TOOL_GID = 65534

WORKSPACE_DIRS = ("temp", "projects", "output")


def workspace_dir(base: Path, tenant_id: str, container_id: str) -> Path:
    """Where a container's workspace lives under `base`: `containers/<id>/workspace` for the default
    tenant (the open local mode), `tenants/<tenant>/containers/<id>/workspace` for the others, so two
    tenants' containers of the same id never share files."""
    # container ids match ^[A-Za-z0-9][A-Za-z0-9._:@-]*$ (no '/', never '..'); tenant ids are quoted
    if tenant_id == DEFAULT_TENANT:
        return base / "containers" / container_id / "workspace"
    return base / "tenants" / urllib.parse.quote(tenant_id, safe="") / "containers" / container_id / "workspace"


class Workspace:
    """A container's workspace: temp/, projects/, output/ under one root (architecture §3)."""

    root: Path
    fs: FileSystem
    owner: tuple[int, int] | None  # (uid, gid) owning the files, when the server runs as root

    def __init__(self, root: Path, fs: FileSystem, *, owner: tuple[int, int] | None = None) -> None:
        self.root = root
        self.fs = fs
        self.owner = owner

    @property
    def temp(self) -> Path:
        return self.root / "temp"

    @property
    def projects(self) -> Path:
        return self.root / "projects"

    @property
    def output(self) -> Path:
        return self.root / "output"

    @classmethod
    async def open(cls, root: Path, files: FileSystemFactory, *, owner: tuple[int, int] | None = None) -> Workspace:
        """Create the root (mode 0o700) and the three dirs, returned with the `FileSystem` that `files`
        makes for it (the caller picks the adapter: `LocalFileSystem`).

        When the server runs as root, the root and the three dirs belong to `owner`, the (uid, gid)
        its tools run as (default nobody, 65534): give each container its own uid to keep one
        container's tools out of another's files when bubblewrap is not there (the 0o700 root)."""
        if os.geteuid() == 0 and owner is None:
            owner = (DEFAULT_TOOL_UID, DEFAULT_TOOL_GID)
        elif os.geteuid() != 0:
            owner = None
        real = await asyncio.to_thread(_create, Path(root), owner)
        return cls(real, files(real, owner=owner), owner=owner)


def _create(root: Path, owner: tuple[int, int] | None) -> Path:
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    real = Path(os.path.realpath(root))
    for name in WORKSPACE_DIRS:
        (real / name).mkdir(mode=0o700, exist_ok=True)
    if owner is not None:
        for path in (real, *(real / name for name in WORKSPACE_DIRS)):
            st = os.lstat(path)
            if (st.st_uid, st.st_gid) != owner:
                os.chown(path, *owner, follow_symlinks=False)
    return real
