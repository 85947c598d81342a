"""What holds a tool call as a whole, beyond its per-process rlimits: the memory of all its processes
together, and its workspace's disk. `LocalProcessRunner.run` prepares a `CallGuard` with the call's
plan, starts it with the process and asks it what ended the call.

Memory (`Limits.memory_bytes` is the whole call's; RLIMIT_AS still holds each process too):

* **A per-call memory cgroup** where this host lets us use the memory controller: cgroup v1's
  `memory` hierarchy (`memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` so that swap does
  not extend it) or cgroup v2 (`memory.max`, `memory.swap.max` 0, `memory.oom.group`; in the call's
  pids cgroup when that is in the same place, as a process has one v2 cgroup). The kernel holds the
  limit: an allocation past it OOM-kills a process of that call and of no other; the guard sees the
  kill in `oom_kill` (`memory.oom_control` / `memory.events`) and kills the rest of the call
  (`killed="memory"`). cgroup v2 enables the controller only below a cgroup without processes of its
  own: run `avm serve` in a leaf cgroup of one that delegates `memory` (systemd: `Delegate=yes`).
* **Otherwise a watchdog** sums the resident memory of the call's processes (the members of its pids
  cgroup, else its process tree and process group) every `MEMORY_TICK_S` and kills the call when the
  sum passes the limit: RSS, confirmed with PSS (`smaps_rollup`, pages the processes share counted
  once) before it kills. Between two looks a call can touch more memory: the overshoot is what it
  can allocate in one tick (tens of MiB here), and memory that no process maps (files in a tmpfs)
  is not seen; the cgroup counts both.

Disk (`agentvm.sandbox.quota.DiskPolicy`): RLIMIT_FSIZE is lowered to what remains of the workspace
quota, so one big write fails inside the tool (SIGXFSZ/EFBIG: `killed="disk_quota"`); a watchdog
measures the workspace (every `DISK_MIN_S`, less often when a walk takes long) and the free space of
the server's disk (every `DISK_TICK_S`), and kills the call once the workspace has grown past its
quota (`killed="disk_quota"`; a call that starts over quota may still delete) or free space falls
under the reserve (`killed="disk_reserve"`). The workspace's size after the call is reported
(`ProcessResult.workspace_bytes`) so that the tool result can say when it is over quota.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentvm.adapters.local.cgroups import own_cgroups
from agentvm.domain.sandbox_limits import Limits
from agentvm.sandbox.quota import DiskPolicy, workspace_usage

log = logging.getLogger(__name__)

MEMORY_TICK_S = 0.02  # how often the memory of a call is looked at
DISK_TICK_S = 0.1  # how often the free space of the server's disk is
DISK_MIN_S = 0.25  # the shortest time between two walks of the workspace
_PGID_SCAN_S = 0.5  # without a cgroup: how often /proc is searched for the call's process group
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PSS = re.compile(rb"^Pss:\s+(\d+) kB", re.M)
_OOM_KILL = re.compile(r"^oom_kill (\d+)", re.M)


# -- memory cgroups ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryCgroup:
    """One call's memory cgroup. `own`: made for the memory limit alone (cgroup v1, or v2 without a
    pids cgroup to share): the call joins it, and it is removed after the call."""

    path: Path
    v2: bool
    own: bool

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def oom_kills(self) -> int:
        """Processes the kernel killed in this cgroup for going over its limit."""
        try:
            text = (self.path / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        except OSError:
            return 0
        m = _OOM_KILL.search(text)
        return int(m.group(1)) if m else 0

    def members(self) -> list[int]:
        return _procs(self.path)

    def kill_all(self) -> None:
        _kill_members(self.path, v2=self.v2)

    def remove_now(self) -> bool:
        try:
            self.path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False

    async def remove(self) -> None:
        """Remove the cgroup once its killed processes are gone."""
        delay, deadline = 0.01, time.monotonic() + 10
        while not self.remove_now():
            if time.monotonic() > deadline:
                log.warning("tool memory cgroup not removable", extra={"cgroup": str(self.path)})
                return
            self.kill_all()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)


class MemoryCgroups:
    """Per-call memory cgroups under a directory this process may write (cgroup v1 or v2)."""

    def __init__(self, parent: Path, *, v2: bool) -> None:
        self.parent = parent
        self.v2 = v2

    @classmethod
    def find(cls) -> tuple[MemoryCgroups | None, str | None]:
        """The parent of the calls' memory cgroups (made under our own cgroup), or None and why not."""
        try:
            bases = own_cgroups("memory")
        except OSError as exc:
            return None, f"the cgroups of this process cannot be read ({exc.strerror or exc})"
        reasons: list[str] = []
        for base, v2 in bases:
            found, why = cls._prepare(base, v2=v2)
            if found is not None:
                return found, None
            if why:
                reasons.append(why)
        return None, "; ".join(reasons) or "no cgroup memory controller is mounted for this process"

    @classmethod
    def _prepare(cls, base: Path, *, v2: bool) -> tuple[MemoryCgroups | None, str | None]:
        parent = base / "agentvm-tools"
        try:
            if v2:
                if "memory" not in (base / "cgroup.controllers").read_text().split():
                    return None, None  # a v2 hierarchy without the controller (a hybrid host: it is in v1)
                if "memory" not in (base / "cgroup.subtree_control").read_text().split():
                    (base / "cgroup.subtree_control").write_text("+memory")
            parent.mkdir(exist_ok=True)
            if v2 and "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                (parent / "cgroup.subtree_control").write_text("+memory")
            found = cls(parent, v2=v2)
            for stale in parent.glob("call-*"):  # left by a server that died
                _reap(stale, v2=v2)
            probe = found.create(64 << 20, None)
            probe.remove_now()
            return found, None
        except OSError as exc:
            if v2 and exc.errno == errno.EBUSY:
                return None, (f"cgroup v2 cannot enable the memory controller below {base}: it holds processes "
                              f"(the server's own); run avm serve in a leaf cgroup of one that delegates memory")
            return None, f"no memory cgroup can be made under {base} ({exc.strerror or exc})"

    def create(self, limit: int, shared: Path | None) -> MemoryCgroup:
        """A call's memory cgroup limited to `limit` bytes: `shared` (the call's pids cgroup) itself
        when it is a v2 cgroup under the same parent, else a new one."""
        if self.v2 and shared is not None and shared.parent == self.parent:
            path, own = shared, False
        else:
            path, own = self.parent / f"call-{os.getpid()}-{secrets.token_hex(6)}", True
            path.mkdir()
        try:
            if self.v2:
                (path / "memory.max").write_text(str(limit))
                for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                    with contextlib.suppress(OSError):
                        (path / name).write_text(value)
            else:
                (path / "memory.limit_in_bytes").write_text(str(limit))
                with contextlib.suppress(OSError):  # no swap accounting on this kernel
                    (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
        except OSError:
            if own:
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise
        return MemoryCgroup(path, v2=self.v2, own=own)


_removing: set[asyncio.Task[None]] = set()
_found: tuple[MemoryCgroups | None, str | None] | None = None
_found_lock = threading.Lock()


def memory_cgroups(*, refresh: bool = False) -> tuple[MemoryCgroups | None, str | None]:
    """`MemoryCgroups.find()`, once per server process (blocking); logs once which way memory is held."""
    global _found
    with _found_lock:
        if _found is None or refresh:
            _found = MemoryCgroups.find()
            cgroups, why = _found
            if cgroups is not None:
                log.info("tool calls get a memory cgroup each", extra={"cgroup": str(cgroups.parent)})
            else:
                log.warning(f"no memory cgroup for tool calls ({why}): a watchdog sums the memory of each "
                            f"call's processes instead (a call may overshoot by what it allocates in "
                            f"{MEMORY_TICK_S * 1000:g} ms)")
        return _found


def _procs(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_members(path: Path, *, v2: bool) -> None:
    """SIGKILL every process in the cgroup, including those forked while killing."""
    if v2:
        with contextlib.suppress(OSError):
            (path / "cgroup.kill").write_text("1")
            return
    for _ in range(100):
        pids = _procs(path)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _reap(path: Path, *, v2: bool) -> None:
    """Kill and remove a call's cgroup left by a server that died (its pid is in the name); cgroups
    of a live server are left alone."""
    try:
        os.kill(int(path.name.split("-")[1]), 0)
        return
    except ProcessLookupError:
        pass
    except (ValueError, IndexError, OSError):
        return
    for _ in range(100):
        _kill_members(path, v2=v2)
        with contextlib.suppress(FileNotFoundError):
            try:
                path.rmdir()
                return
            except OSError:
                pass
        time.sleep(0.01)


# -- the call's processes and their memory (the watchdog) --------------------------------------------


def _tree(roots: set[int]) -> set[int]:
    """`roots` and all their descendants (/proc/<pid>/task/<tid>/children)."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    stack.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                continue
    return seen


def _group(leader: int) -> set[int]:
    """Processes in the session or process group `leader` started (those that left its tree)."""
    found: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) == leader or int(fields[3]) == leader:  # pgrp, session
                found.add(int(name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def resident_bytes(pids: set[int] | list[int]) -> int:
    """The sum of the processes' RSS (pages they share counted in each)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


def proportional_bytes(pids: set[int] | list[int]) -> int:
    """The sum of the processes' PSS: a page they share counted once in all (RSS where it cannot be read)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
                m = _PSS.search(f.read())
            total += int(m.group(1)) * 1024 if m else resident_bytes([pid])
        except (OSError, ValueError):
            total += resident_bytes([pid])
    return total


# -- one call -------------------------------------------------------------------------------------------


class CallGuard:
    """The whole-call limits of one tool call: `prepare` before it starts (blocking), `start` with its
    first process, `tripped` set when a limit is passed (`reason`), `verdict` and `finish` after."""

    def __init__(self, root: Path, limits: Limits, *, disk: DiskPolicy | None, memory: MemoryCgroup | None,
                 members_of: Path | None, start_usage: int | None) -> None:
        self.root = root
        self.limits = limits
        self.disk = disk
        self.memory = memory  # the kernel holds the memory limit; else the watchdog does
        self.members_of = members_of  # a cgroup holding all the call's processes (for the watchdog)
        self.start_usage = start_usage  # the workspace's size when the call starts (with a quota)
        self.reason: str | None = None
        self.tripped = asyncio.Event()
        self.workspace_bytes: int | None = None  # its size after the call (with a quota)
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def prepare(cls, root: Path, limits: Limits, *, disk: DiskPolicy | None, memory: MemoryCgroups | None,
                pids_cgroup: Path | None) -> CallGuard:
        """The call's guard (blocking): its memory cgroup made under `memory` (None: the watchdog holds
        its memory), and the workspace measured when there is a quota."""
        group: MemoryCgroup | None = None
        if memory is not None:
            try:
                group = memory.create(limits.memory_bytes, pids_cgroup)
            except OSError as exc:
                log.warning(f"no memory cgroup for this tool call ({exc.strerror or exc}): the watchdog holds "
                            f"its memory")
        members_of = pids_cgroup if pids_cgroup is not None else group.path if group is not None else None
        start = workspace_usage(root) if disk is not None and disk.quota_bytes is not None else None
        return cls(root, limits, disk=disk, memory=group, members_of=members_of, start_usage=start)

    @property
    def file_size_bytes(self) -> int:
        """The call's RLIMIT_FSIZE: the file-size limit, or what remains of the quota when less."""
        return min(self.limits.file_size_bytes, self._remaining)

    @property
    def file_size_by_quota(self) -> bool:
        return self._remaining < self.limits.file_size_bytes

    @property
    def _remaining(self) -> int:
        if self.disk is None or self.disk.quota_bytes is None or self.start_usage is None:
            return self.limits.file_size_bytes
        return max(self.disk.quota_bytes - self.start_usage, 0)

    @property
    def join(self) -> list[Path]:
        """The cgroup.procs files the call must join besides its pids cgroup's."""
        return [self.memory.procs] if self.memory is not None and self.memory.own else []

    def start(self, leader: int) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._watch_memory(leader)))
        if self.disk is not None:
            self._tasks.append(loop.create_task(self._watch_disk()))

    def _trip(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            log.info("tool call stopped at a whole-call limit", extra={"killed": reason, "root": str(self.root)})
        self.tripped.set()

    def kill(self) -> None:
        """Kill the processes of the call's own memory cgroup (the runner kills its group and pids cgroup)."""
        if self.memory is not None and self.memory.own:
            self.memory.kill_all()

    def verdict(self, returncode: int) -> str | None:
        """What ended the call when it was a whole-call limit: the watchdog's reason, the kernel's OOM
        kill in its memory cgroup, or SIGXFSZ at a file-size limit lowered to the quota."""
        if self.reason is not None:
            return self.reason
        if self.memory is not None and self.memory.oom_kills() > 0:
            return "memory"
        sig = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
        if sig == signal.SIGXFSZ and self.file_size_by_quota:
            return "disk_quota"
        return None

    async def finish(self) -> None:
        """Stop watching, measure the workspace (with a quota), remove the call's own memory cgroup."""
        for task in self._tasks:
            task.cancel()
        if self.start_usage is not None:
            self.workspace_bytes = await asyncio.to_thread(workspace_usage, self.root)
        if self.memory is not None and self.memory.own and not self.memory.remove_now():
            task = asyncio.get_running_loop().create_task(self.memory.remove())  # still being reaped
            _removing.add(task)
            task.add_done_callback(_removing.discard)

    def abandon(self) -> None:
        """Stop watching now (the call was cancelled); the cgroup is removed in the background."""
        for task in self._tasks:
            task.cancel()

    async def _watch_memory(self, leader: int) -> None:
        limit = self.limits.memory_bytes
        extra: set[int] = set()
        scanned = 0.0
        while True:
            await asyncio.sleep(MEMORY_TICK_S)
            if self.memory is not None:
                if self.memory.oom_kills() > 0:
                    self._trip("memory")
                    return
                continue
            if self.members_of is not None:
                pids: set[int] = set(_procs(self.members_of))
            else:
                if time.monotonic() - scanned > _PGID_SCAN_S:
                    extra, scanned = _group(leader), time.monotonic()
                pids = _tree({leader, *extra})
            if resident_bytes(pids) > limit and proportional_bytes(pids) > limit:
                self._trip("memory")
                return

    async def _watch_disk(self) -> None:
        disk = self.disk
        assert disk is not None
        quota, walk_at = disk.quota_bytes, time.monotonic() + DISK_MIN_S
        while True:
            await asyncio.sleep(DISK_TICK_S)
            if disk.reserve_problem() is not None:
                self._trip("disk_reserve")
                return
            if quota is None or self.start_usage is None or time.monotonic() < walk_at:
                continue
            began = time.monotonic()
            used = await asyncio.to_thread(workspace_usage, self.root)
            if used > quota and used > self.start_usage:
                self._trip("disk_quota")
                return
            walk_at = time.monotonic() + max(DISK_MIN_S, 10 * (time.monotonic() - began))



def joining(procs: list[Path], setup: Callable[[], None]) -> Callable[[], None]:
    """A `preexec_fn` that moves the child into the cgroups of `procs` (cgroup.procs files), then runs `setup`."""

    def run() -> None:
        for path in procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        setup()

    return run
