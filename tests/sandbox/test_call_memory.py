"""A tool call's memory is bounded as a whole (issue 15, point 3): many processes, each under the limit,
together over it, are stopped, by the kernel (a per-call memory cgroup) or by the watchdog; and the
host's available memory never drops by much more than the limit while they run."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from agentvm.adapters.local import call_guard
from agentvm.adapters.local.call_guard import MemoryCgroups, memory_cgroups
from agentvm.adapters.local.local_fs import LocalFileSystem
from agentvm.adapters.local.local_process import LocalProcessRunner
from agentvm.adapters.local.tool_sandbox import Isolation
from agentvm.domain.sandbox_limits import Limits
from agentvm.sandbox import Runtime, Workspace
from agentvm.tools.builtin import BuiltinTools

LIMIT = 256 << 20
# the shape, scaled down to run fast on a small CI host: 8 processes of 160 MiB each (each under
# the limit, also under the per-process RLIMIT_AS of 256 MiB), 1.25 GiB in all
FORK = """
import os, sys, time
n, mib, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 30
kids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (mib << 20)  # every page touched
        print("allocated", flush=True)
        time.sleep(hold)
        os._exit(0)
    kids.append(pid)
codes = [os.waitpid(k, 0)[1] for k in kids]
print("children done", codes)
"""
# Slack above the limit for the sampler: the guard's overshoot (one tick), the launcher's processes,
# and what other work on a shared host does meanwhile. Unbounded, the call takes 1.25 GiB.
MARGIN = 256 << 20


def _available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


async def _runtime(base: Path, uid: int, isolation: Isolation, **runner: object) -> Runtime:
    ws = await Workspace.open(base / "c1", LocalFileSystem, owner=(uid, uid))
    (ws.root / "fork.py").write_text(FORK)
    return Runtime(ws, LocalProcessRunner(ws.root, isolation=isolation, **runner))  # type: ignore[arg-type]


async def _run_sampled(tools: BuiltinTools, command: str) -> tuple[str, bool, int, float]:
    """Run `command` through the bash tool while sampling MemAvailable: (result, is_error, largest drop, s)."""
    before = _available()
    lowest = before
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal lowest
        while not stop.is_set():
            lowest = min(lowest, _available())
            await asyncio.sleep(0.005)

    sampler = asyncio.ensure_future(sample())
    started = time.monotonic()
    outcome = await tools.run("bash", {"command": command})
    took = time.monotonic() - started
    stop.set()
    await sampler
    return str(outcome.output), outcome.is_error, before - lowest, took


def _needs_memory_cgroup() -> MemoryCgroups:
    found, why = memory_cgroups()
    if found is None:
        pytest.skip(f"no memory cgroup on this host: {why}")
    return found


async def test_many_processes_over_the_call_limit_are_stopped_by_the_memory_cgroup(
        base: Path, tool_uid: int, isolation: Isolation) -> None:
    cgroups = _needs_memory_cgroup()
    rt = await _runtime(base, tool_uid, isolation)
    tools = BuiltinTools(rt, ("bash",), limits=Limits(timeout_s=20, memory_bytes=LIMIT))
    text, is_error, drop, took = await _run_sampled(tools, "python3 fork.py 8 160")
    assert text.startswith("killed\n[killed: the call's memory limit of 256 MiB was reached]"), text
    assert is_error and "children done" not in text
    assert took < 15, took  # stopped, not timed out
    assert drop < LIMIT + MARGIN, f"available memory dropped by {drop >> 20} MiB"
    assert await _cgroups_gone(cgroups)  # removed after the call


async def _cgroups_gone(cgroups: MemoryCgroups) -> bool:
    for _ in range(100):
        if not list(cgroups.parent.glob(f"call-{os.getpid()}-*")):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_the_call_runs_in_its_own_memory_cgroup(base: Path, tool_uid: int) -> None:
    cgroups = _needs_memory_cgroup()
    rt = await _runtime(base, tool_uid, "none")
    result = await rt.exec("cat /proc/self/cgroup", limits=Limits(timeout_s=10, memory_bytes=LIMIT))
    lines = result.stdout.decode().splitlines()
    memory = [line for line in lines if ":memory:" in line or line.startswith("0::")]
    rel = str(cgroups.parent).split("/sys/fs/cgroup/memory", 1)[-1] if not cgroups.v2 else ""
    assert any(f"{rel}/call-" in line for line in memory), lines
    assert result.exit_code == 0 and result.killed is None


@pytest.mark.parametrize("pids_cgroup", [True, False], ids=["pids-cgroup-members", "process-tree"])
async def test_without_a_memory_cgroup_the_watchdog_stops_the_call(
        base: Path, tool_uid: int, isolation: Isolation, pids_cgroup: bool) -> None:
    rt = await _runtime(base, tool_uid, isolation, memory_cgroup=False, pids_cgroup=pids_cgroup)
    tools = BuiltinTools(rt, ("bash",), limits=Limits(timeout_s=20, memory_bytes=LIMIT))
    text, is_error, drop, took = await _run_sampled(tools, "python3 fork.py 8 160")
    assert text.startswith("killed\n[killed: the call's memory limit of 256 MiB was reached]"), text
    assert is_error and took < 15, took
    assert drop < LIMIT + MARGIN, f"available memory dropped by {drop >> 20} MiB"


@pytest.mark.parametrize("memory_cgroup", [True, False], ids=["cgroup", "watchdog"])
async def test_a_call_under_the_limit_runs_to_its_end(base: Path, tool_uid: int, memory_cgroup: bool) -> None:
    rt = await _runtime(base, tool_uid, "none", memory_cgroup=memory_cgroup)
    result = await rt.exec("python3 fork.py 8 16 0.3", limits=Limits(timeout_s=20, memory_bytes=LIMIT))
    assert result.killed is None and result.exit_code == 0, result
    assert result.stdout.decode().count("allocated") == 8


async def test_the_watchdog_counts_pages_shared_after_fork_once(base: Path, tool_uid: int) -> None:
    """A parent with 96 MiB forks 4 children that keep it (copy on write): 480 MiB of RSS in all, but
    96 MiB of memory; under a 256 MiB limit nothing is killed (PSS confirms what RSS suggests)."""
    rt = await _runtime(base, tool_uid, "none", memory_cgroup=False)
    script = ("import os,time\nblock = b'x' * (96 << 20)\nkids = []\n"
              "for _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n        time.sleep(1.0)\n"
              "        os._exit(0)\n    kids.append(pid)\n[os.waitpid(k, 0) for k in kids]\nprint('shared ok')\n")
    (rt.workspace.root / "shared.py").write_text(script)
    result = await rt.exec("python3 shared.py", limits=Limits(timeout_s=20, memory_bytes=LIMIT))
    assert (result.killed, result.stdout) == (None, b"shared ok\n"), result


def test_v1_and_v2_memory_cgroup_files(tmp_path: Path) -> None:
    """What a call's memory cgroup is given, and how an OOM kill is read, on both cgroup versions
    (on plain directories: this host has one of them at most)."""
    v1 = MemoryCgroups(tmp_path / "v1", v2=False)
    v1.parent.mkdir()
    group = v1.create(LIMIT, None)
    assert group.own and group.path.parent == v1.parent and group.path.name.startswith("call-")
    assert (group.path / "memory.limit_in_bytes").read_text() == str(LIMIT)
    assert (group.path / "memory.memsw.limit_in_bytes").read_text() == str(LIMIT)  # swap does not extend it
    assert group.oom_kills() == 0
    (group.path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert group.oom_kills() == 2

    v2 = MemoryCgroups(tmp_path / "v2", v2=True)
    v2.parent.mkdir()
    pids = v2.parent / "call-1-abc"  # the call's pids cgroup: on v2 the same cgroup holds its memory
    pids.mkdir()
    shared = v2.create(LIMIT, pids)
    assert (shared.path, shared.own) == (pids, False)
    assert [(pids / f).read_text() for f in ("memory.max", "memory.swap.max", "memory.oom.group")] == \
        [str(LIMIT), "0", "1"]
    (pids / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 1\n")
    assert shared.oom_kills() == 1
    elsewhere = v2.create(LIMIT, tmp_path / "other" / "call-2")  # a pids cgroup of another hierarchy
    assert elsewhere.own and elsewhere.path.parent == v2.parent


def test_the_fallback_is_logged_with_the_reason(monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(MemoryCgroups, "find", classmethod(lambda cls: (None, "no memory controller here")))
    monkeypatch.setattr(call_guard, "_found", None)
    with caplog.at_level("WARNING", logger="agentvm.adapters.local.call_guard"):
        assert memory_cgroups() == (None, "no memory controller here")
    assert "no memory cgroup for tool calls (no memory controller here): a watchdog sums the memory" in caplog.text
    monkeypatch.setattr(call_guard, "_found", None)  # the next test probes the host again
