"""How much disk a container's tools may use: a quota per workspace, and a reserve of free space that
the server keeps on its data directory's filesystem for its own database.

Where it is enforced (docs/architecture.md, "The sandbox"):

* `write_file` / `edit_file` (and the output files a long result is kept in) check the workspace's
  usage plus the new size against the quota before writing, and refuse with an error naming it.
* A tool's processes get RLIMIT_FSIZE lowered to what remains of the quota (one big write fails inside
  the tool), and a watchdog of the call (`agentvm.adapters.local.call_guard`) measures the workspace
  while the call runs and kills it once the quota is passed (`killed="disk_quota"`) or free space
  falls under the reserve (`killed="disk_reserve"`).
* While free space is under the reserve, tools that write are refused before they start, and
  `/health` reports `degraded`; tools that only read, and turns without tools, go on.

Usage is what the workspace's files take on disk (allocated blocks, a hard-linked file once), so a
sparse file counts for what it really holds.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DEFAULT_QUOTA_BYTES = 1 << 30
DEFAULT_RESERVE_BYTES = 512 << 20


def size_text(n: int) -> str:
    """`1 GiB`, `512 MiB`, `1.5 GiB`, `700 KiB`, `12 bytes`: for messages people read."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = round(n / (1 << shift), 1)
            return f"{value:g} {unit}"
    return f"{n} bytes"


def workspace_usage(root: Path | str) -> int:
    """Bytes the files under `root` take on disk (allocated blocks; a hard-linked file counted once;
    symlinks not followed). Blocking: call it in a worker thread."""
    total = 0
    seen: set[tuple[int, int]] = set()
    stack = [os.fspath(root)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:  # removed meanwhile, or not readable
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
                elif st.st_nlink > 1:
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def free_space(path: Path) -> Callable[[], int]:
    """Free bytes (for unprivileged users) on the filesystem holding `path`, or its nearest existing
    parent: the default `DiskPolicy.free_bytes` of a server whose data lives at `path`."""

    def free() -> int:
        probe = path
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        st = os.statvfs(probe)
        return st.f_bavail * st.f_frsize

    return free


@dataclass(frozen=True, slots=True)
class DiskPolicy:
    """The disk tools may use: `quota_bytes` per workspace (None: no quota), and `reserve_bytes` of
    free space kept where the server's data lives (`free_bytes` reads it; None or 0: not watched)."""

    quota_bytes: int | None = DEFAULT_QUOTA_BYTES
    reserve_bytes: int = DEFAULT_RESERVE_BYTES
    free_bytes: Callable[[], int] | None = None

    def __post_init__(self) -> None:
        if self.quota_bytes is not None and self.quota_bytes < 1:
            raise ValueError("quota_bytes must be at least 1")
        if self.reserve_bytes < 0:
            raise ValueError("reserve_bytes must not be negative")

    @property
    def quota_text(self) -> str:
        return "no quota" if self.quota_bytes is None else f"the workspace quota of {size_text(self.quota_bytes)}"

    def reserve_problem(self) -> str | None:
        """Why tools that write are refused now (free space under the reserve), or None. A free space
        that cannot be read counts as under the reserve (fail closed)."""
        if self.free_bytes is None or self.reserve_bytes <= 0:
            return None
        try:
            free = self.free_bytes()
        except OSError as exc:
            return f"the free space of the server's disk cannot be read ({exc.strerror or exc})"
        if free < self.reserve_bytes:
            return (f"the server's disk is nearly full: {size_text(max(free, 0))} free, under the reserve of "
                    f"{size_text(self.reserve_bytes)} kept for its database")
        return None

    def write_problem(self, root: Path, new_bytes: int, *, replaced_bytes: int = 0) -> str | None:
        """Why the server writing `new_bytes` into the workspace at `root` (over a file of
        `replaced_bytes`) is refused, or None. Blocking (it measures the workspace)."""
        problem = self.reserve_problem()
        if problem is not None:
            return problem
        if self.quota_bytes is None:
            return None
        used = workspace_usage(root)
        after = used - _blocks(replaced_bytes) + _blocks(new_bytes)
        if after > self.quota_bytes:
            return (f"{self.quota_text} would be exceeded ({size_text(used)} used; this write needs "
                    f"{size_text(new_bytes)}): remove files to make room")
        return None


def _blocks(n: int) -> int:
    """`n` bytes rounded up to 4 KiB blocks, what a file of that size takes on most filesystems."""
    return -(-n // 4096) * 4096
