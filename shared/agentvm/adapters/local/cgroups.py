"""Per-call cgroups of tool calls: where our own cgroup sits in the mounted hierarchies, and the
`pids` cgroups that bound a call's processes (cgroup v1 or v2). The memory cgroups are in
`call_guard`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)


def own_cgroups(controller: str) -> list[tuple[Path, bool]]:
    """The directories of this process's own cgroups where `controller` can be used, with whether each
    is cgroup v2 (the unified hierarchy) or v1. OSError when /proc cannot be read."""
    own = Path("/proc/self/cgroup").read_text().splitlines()
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    found: list[tuple[Path, bool]] = []
    for line in own:
        hid, controllers, path = line.split(":", 2)
        v2 = hid == "0" and controllers == ""
        if not v2 and controller not in controllers.split(","):
            continue
        base = cgroup_dir(mounts, path, v2=v2, controller=controller)
        if base is not None:
            found.append((base, v2))
    return found


def cgroup_dir(mounts: list[str], path: str, *, v2: bool, controller: str) -> Path | None:
    """The directory of our cgroup `path` in the hierarchy mounted on this host (from mountinfo): the
    unified one (v2), or the v1 hierarchy that holds `controller`."""
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        fstype, options = rfields[0], rfields[2].split(",")
        if (v2 and fstype != "cgroup2") or (not v2 and (fstype != "cgroup" or controller not in options)):
            continue
        root, mount_point = fields[3], fields[4]
        rel = path
        if root != "/":
            if not (path == root or path.startswith(root + "/")):
                continue
            rel = path[len(root):]
        return Path(mount_point + rel.rstrip("/")) if rel not in ("", "/") else Path(mount_point)
    return None


class PidsCgroups:
    """Per-call `pids` cgroups under a directory this process may write (cgroup v1 or v2)."""

    def __init__(self, parent: Path, *, v2: bool) -> None:
        self.parent = parent
        self.v2 = v2

    @classmethod
    def find(cls) -> PidsCgroups | None:
        """The pids cgroup parent for tool calls (created under our own cgroup), or None."""
        try:
            bases = own_cgroups("pids")
        except OSError:
            return None
        for base, v2 in bases:
            found = cls._prepare(base, v2=v2)
            if found is not None:
                return found
        return None

    @classmethod
    def _prepare(cls, base: Path, *, v2: bool) -> PidsCgroups | None:
        parent = base / "agentvm-tools"
        try:
            if v2:
                controls = (base / "cgroup.subtree_control").read_text().split()
                if "pids" not in controls:
                    (base / "cgroup.subtree_control").write_text("+pids")
            parent.mkdir(exist_ok=True)
            if v2 and "pids" not in (parent / "cgroup.subtree_control").read_text().split():
                (parent / "cgroup.subtree_control").write_text("+pids")
            found = cls(parent, v2=v2)
            for stale in parent.glob("call-*"):  # left by a server that died
                found.reap(stale)
            probe = found.create(8)
            found.remove_now(probe)
            return found
        except OSError:
            return None

    def create(self, max_pids: int) -> Path:
        path = self.parent / f"call-{os.getpid()}-{secrets.token_hex(6)}"
        path.mkdir()
        try:
            (path / "pids.max").write_text(str(max_pids))
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise
        return path

    def reap(self, path: Path) -> None:
        """Remove a call's cgroup left behind by a server that died (`kill -9`): without bubblewrap
        (`--die-with-parent`) the tool's processes outlive it, and its timeout died with it, so they
        are killed first. Cgroups of a live server (the pid in the name) are left alone."""
        try:
            pid = int(path.name.split("-")[1])
            os.kill(pid, 0)
            return  # that server still runs (or it is this one)
        except ProcessLookupError:
            pass
        except (ValueError, IndexError, OSError):
            return
        for _ in range(100):  # killed processes leave the cgroup once they have exited
            self.kill_all(path)
            if self.remove_now(path):
                return
            time.sleep(0.01)

    def kill_all(self, path: Path) -> None:
        """SIGKILL every process in the cgroup, including those forked while killing."""
        kill = path / "cgroup.kill"
        if self.v2 and kill.exists():
            with contextlib.suppress(OSError):
                kill.write_text("1")
                return
        for _ in range(100):
            try:
                pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
            except OSError:
                return
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    @staticmethod
    def remove_now(path: Path) -> bool:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False

    async def remove(self, path: Path) -> None:
        """Remove the cgroup once its killed processes are gone."""
        delay = 0.01
        deadline = time.monotonic() + 10
        while not self.remove_now(path):
            if time.monotonic() > deadline:
                log.warning("tool cgroup not removable", extra={"cgroup": str(path)})
                return
            self.kill_all(path)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
