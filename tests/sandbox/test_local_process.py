"""LocalProcessRunner: limits, timeouts, output caps and clean-up, with and without bubblewrap."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import resource
import threading
import time
from pathlib import Path

import pytest

from agentvm.adapters.local import local_process
from agentvm.adapters.local.local_fs import LocalFileSystem
from agentvm.adapters.local.local_process import TOOL_NICENESS, Isolation, LocalProcessRunner, probe_host
from agentvm.adapters.local.tool_sandbox import Host
from agentvm.domain.sandbox_limits import Limits
from agentvm.errors import AgentVMError, InvalidRequest
from agentvm.sandbox import Runtime, Workspace
from tests.sandbox.conftest import ROOT, UNSAFE_IF_NOT_ROOT, needs_root, user_tasks

QUICK = Limits(timeout_s=10)


async def _runtime(base: Path, uid: int, isolation: Isolation, **runner: object) -> Runtime:
    ws = await Workspace.open(base / "c1", LocalFileSystem, owner=(uid, uid))
    runner.setdefault("unsafe_unsandboxed", UNSAFE_IF_NOT_ROOT)
    return Runtime(ws, LocalProcessRunner(ws.root, isolation=isolation, **runner))  # type: ignore[arg-type]


def _running(marker: str) -> list[int]:
    """Pids whose command line contains `marker`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


async def _gone(marker: str, within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while _running(marker):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def test_exit_code_stdin_and_output(base: Path, tool_uid: int, isolation: Isolation) -> None:
    rt = await _runtime(base, tool_uid, isolation)
    result = await rt.exec("echo out; echo err >&2; exit 3", limits=QUICK)
    assert (result.exit_code, result.stdout, result.stderr, result.killed) == (3, b"out\n", b"err\n", None)
    assert result.output_bytes == 8 and not result.truncated
    piped = await rt.process.run(["cat"], cwd=".", env=rt.env, limits=QUICK, stdin=b"hello")
    assert piped.stdout == b"hello" and piped.exit_code == 0
    no_stdin = await rt.exec("cat", limits=QUICK)  # /dev/null: EOF at once
    assert no_stdin.exit_code == 0 and no_stdin.stdout == b""
    missing = await rt.process.run(["no-such-binary-anywhere"], cwd=".", env=rt.env, limits=QUICK)
    assert missing.exit_code not in (0, None) and b"no-such-binary-anywhere" in missing.stderr


async def test_output_beyond_the_limit_is_counted_and_dropped(base: Path, tool_uid: int,
                                                              isolation: Isolation) -> None:
    rt = await _runtime(base, tool_uid, isolation)
    result = await rt.exec("echo 0123456789abcdef; sleep 0.1; echo err >&2",
                           limits=dataclasses.replace(QUICK, output_bytes=10))
    assert result.stdout == b"0123456789" and result.stderr == b""
    assert result.output_bytes == 21 and result.truncated and result.exit_code == 0 and result.killed is None


async def test_100_mb_of_output_is_stopped(base: Path, tool_uid: int, isolation: Isolation) -> None:
    rt = await _runtime(base, tool_uid, isolation)
    limits = Limits(timeout_s=20, output_bytes=1 << 20)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = await rt.exec("head -c 100M /dev/zero; echo never", limits=limits)
    assert result.killed == "output_limit" and result.exit_code is None
    assert len(result.stdout) + len(result.stderr) == 1 << 20 and result.truncated
    assert limits.output_kill_at < result.output_bytes < 100 << 20
    assert result.duration_ms < 5000
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before
    assert grown_kib < 32 << 10  # memory stays bounded: dropped output is not buffered
    endless = await rt.exec("yes", limits=dataclasses.replace(limits, output_kill_bytes=4 << 20))
    assert endless.killed == "output_limit" and endless.duration_ms < 5000


async def test_infinite_loop_is_stopped_by_cpu_or_timeout(base: Path, tool_uid: int, isolation: Isolation) -> None:
    rt = await _runtime(base, tool_uid, isolation)
    by_cpu = await rt.exec("while true; do :; done", limits=Limits(cpu_s=1, timeout_s=10))
    assert (by_cpu.killed, by_cpu.exit_code) == ("cpu", None)
    assert by_cpu.duration_ms < 4000
    by_clock = await rt.exec("while true; do :; done", limits=Limits(cpu_s=30, timeout_s=1))
    assert (by_clock.killed, by_clock.exit_code) == ("timeout", None)
    assert 1000 <= by_clock.duration_ms < 3000


async def test_timeout_kills_grandchildren(base: Path, tool_uid: int, isolation: Isolation) -> None:
    rt = await _runtime(base, tool_uid, isolation)
    result = await rt.exec("sleep 987651 & sleep 987651; wait", limits=Limits(timeout_s=1))
    assert result.killed == "timeout" and result.duration_ms < 3000
    assert await _gone("987651")


async def test_background_children_do_not_outlive_the_call(base: Path, tool_uid: int,
                                                            isolation: Isolation) -> None:
    rt = await _runtime(base, tool_uid, isolation)
    result = await rt.exec("sleep 987652 & echo started", limits=QUICK)
    assert result.stdout == b"started\n" and result.exit_code == 0 and result.duration_ms < 3000
    assert await _gone("987652")


async def test_cancelling_a_call_kills_the_tool(base: Path, tool_uid: int, isolation: Isolation) -> None:
    rt = await _runtime(base, tool_uid, isolation)
    task = asyncio.ensure_future(rt.exec("sleep 987653", limits=QUICK))
    deadline = time.monotonic() + 5
    while True:
        if _running("987653") or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _gone("987653")


async def test_file_size_limit(base: Path, tool_uid: int, isolation: Isolation) -> None:
    rt = await _runtime(base, tool_uid, isolation)
    result = await rt.exec("head -c 100M /dev/zero > big", limits=Limits(file_size_bytes=1 << 20, timeout_s=10))
    assert result.killed == "file_size" and result.exit_code is None
    assert (rt.workspace.root / "big").stat().st_size <= 1 << 20


async def _fork_bomb(rt: Runtime, uid: int, limits: Limits) -> None:
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, user_tasks(uid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        # The function forks two copies of itself, forever; the shell then spins until the timeout.
        result = await rt.exec(":(){ :|:& };:; while :; do :; done", limits=limits)
    finally:
        stop.set()
        sampler.join()
    assert result.killed == "timeout"
    assert result.duration_ms < limits.timeout_s * 1000 + 2500
    if ROOT:  # the tool's own uid: every process counted is the bomb's
        assert 0 < peak <= limits.processes
    # Stopped, and the machine keeps working: nothing of it is left, and a new process starts.
    if ROOT:
        deadline = time.monotonic() + 3
        while True:
            if not user_tasks(uid) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert user_tasks(uid) == 0
    after = await rt.exec("echo ok", limits=QUICK)
    assert (after.exit_code, after.stdout) == (0, b"ok\n")


async def test_fork_bomb_is_stopped(base: Path, tool_uid: int, isolation: Isolation) -> None:
    rt = await _runtime(base, tool_uid, isolation)
    await _fork_bomb(rt, tool_uid, Limits(processes=32, timeout_s=5))


@needs_root
async def test_fork_bomb_is_stopped_without_a_cgroup(base: Path, tool_uid: int) -> None:
    # RLIMIT_NPROC alone: it works because the tool runs as its own uid, not as root.
    rt = await _runtime(base, tool_uid, "none", pids_cgroup=False)
    await _fork_bomb(rt, tool_uid, Limits(processes=32, timeout_s=3))


@pytest.mark.parametrize("launcher", ["exec", "preexec"])
async def test_both_launchers_set_the_limits(base: Path, tool_uid: int, launcher: str, host: Host) -> None:
    if launcher == "exec" and not host.exec_launcher:
        pytest.skip("util-linux prlimit/setpriv missing")
    rt = await _runtime(base, tool_uid, "none", launcher=launcher, pids_cgroup=False)
    limits = Limits(cpu_s=7, memory_bytes=512 << 20, file_size_bytes=3 << 20, processes=40)
    result = await rt.exec("ulimit -t; ulimit -v; ulimit -f; ulimit -c; ulimit -u; id -u; nice", limits=limits)
    assert result.exit_code == 0, result
    cpu, mem, fsize, core, nproc, uid, nice = result.stdout.decode().split()
    assert (cpu, mem, fsize, core) == ("7", str(512 << 10), str(3 << 10), "0")
    assert int(nice) == min(19, os.nice(0) + TOOL_NICENESS)  # below the server's priority
    if ROOT:
        assert (nproc, uid) == ("40", str(tool_uid))


async def test_a_tool_runs_below_the_servers_cpu_priority(base: Path, tool_uid: int, isolation: Isolation) -> None:
    rt = await _runtime(base, tool_uid, isolation)
    result = await rt.exec("nice", limits=QUICK)
    assert result.exit_code == 0, result
    assert int(result.stdout) == min(19, os.nice(0) + TOOL_NICENESS)


async def test_cwd_is_confined(base: Path, tool_uid: int) -> None:
    rt = await _runtime(base, tool_uid, "none")
    (rt.workspace.root / "out").symlink_to("/etc")
    for cwd, reason in [("../", "'..' leaves the workspace"), ("/etc", "absolute paths are not allowed"),
                        ("out", "a symlink leads out of the workspace"), ("nope", "not a directory")]:
        with pytest.raises(InvalidRequest, match=reason) as info:
            await rt.process.run(["true"], cwd=cwd, env=rt.env, limits=QUICK)
        assert info.value.field == "cwd"


@needs_root  # not root without bubblewrap: refused unless opted in (test_tool_sandbox.py)
async def test_one_warning_when_bwrap_is_not_usable(base: Path, tool_uid: int, caplog: pytest.LogCaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    without = dataclasses.replace(probe_host(), bwrap=None, bwrap_problem="bwrap is not installed")
    monkeypatch.setattr(local_process, "_host", without)
    monkeypatch.setattr(local_process, "_warned", False)
    caplog.set_level(logging.WARNING, logger=local_process.__name__)
    for name in ("a", "b"):
        ws = await Workspace.open(base / name, LocalFileSystem, owner=(tool_uid, tool_uid))
        rt = Runtime(ws, LocalProcessRunner(ws.root))
        assert (await rt.exec("echo hi", limits=QUICK)).stdout == b"hi\n"
    warnings = [r.getMessage() for r in caplog.records if "bubblewrap" in r.getMessage()]
    assert len(warnings) == 1
    assert "bwrap is not installed" in warnings[0]
    assert "rlimits, a scrubbed environment and path confinement" in warnings[0]
    strict = LocalProcessRunner(ws.root, isolation="bwrap")
    with pytest.raises(AgentVMError, match="bubblewrap was required but is not usable"):
        await strict.run(["true"], cwd=".", env={}, limits=QUICK)


def test_bwrap_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    root, cwd = "/data/ws/c1", "/data/ws/c1/projects"
    as_root = local_process._bwrap_args(root, cwd, privileged=True)
    joined = " ".join(as_root)
    for flag in ("--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--new-session",
                 "--proc /proc", "--dev /dev", "--tmpfs /tmp", "--ro-bind /usr /usr", "--cap-drop ALL",
                 f"--bind {root} {root}", f"--chdir {cwd}", "--dir /data/ws"):
        assert flag in joined, flag
    assert "--unshare-user" not in joined  # the tool's uid must be a real host uid (RLIMIT_NPROC, file modes)
    assert "--ro-bind-try /etc/passwd /etc/passwd" in joined and "/etc/shadow" not in joined
    as_user = " ".join(local_process._bwrap_args(root, cwd, privileged=False))
    assert "--unshare-all" in as_user and "--cap-" not in as_user

    fake = Host(privileged=True, prlimit="/usr/bin/prlimit", setpriv="/usr/bin/setpriv", sh="/bin/sh",
                bwrap="/usr/bin/bwrap", bwrap_problem=None, cgroups=None)
    runner = LocalProcessRunner(Path(root), isolation="bwrap")
    runner.run_as = (61000, 61000)
    monkeypatch.setattr(runner, "_workdir", lambda cwd: f"{root}/{cwd}")
    plan = runner._plan(fake, ["bash", "-c", "ls"], "projects", Limits(processes=32))
    argv = plan.argv
    assert argv[0] == "/usr/bin/prlimit" and "--nproc=32:32" in argv and "--core=0:0" in argv
    bw, sp = argv.index("/usr/bin/bwrap"), argv.index("/usr/bin/setpriv")
    assert 0 < bw < sp  # limits, then bwrap, then leaving root inside it
    assert argv[sp:sp + 3] == ["/usr/bin/setpriv", "--reuid=61000", "--regid=61000"]
    assert argv[-3:] == ["bash", "-c", "ls"]


def test_under_uvloop(base: Path, tool_uid: int) -> None:
    uvloop = pytest.importorskip("uvloop")

    async def main() -> None:
        for launcher in ("exec", "preexec"):
            rt = await _runtime(base, tool_uid, "none", launcher=launcher)
            ok = await rt.exec("echo hi; echo there >&2", limits=QUICK)
            assert (ok.exit_code, ok.stdout, ok.stderr) == (0, b"hi\n", b"there\n")
            late = await rt.exec("sleep 987654", limits=Limits(timeout_s=0.5))
            assert late.killed == "timeout"
        assert await _gone("987654")

    uvloop.run(main())
