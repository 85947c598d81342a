"""Workspace, Runtime and tool_env: a tool gets its workspace and a scrubbed environment only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agentvm.adapters.local.local_fs import LocalFileSystem
from agentvm.adapters.local.local_process import Isolation, LocalProcessRunner
from agentvm.domain.sandbox_limits import Limits
from agentvm.sandbox import SAFE_PATH, Runtime, Workspace, tool_env
from tests.sandbox.conftest import ROOT, UNSAFE_IF_NOT_ROOT, needs_root

QUICK = Limits(timeout_s=10)


async def test_workspace_open_creates_the_layout(base: Path) -> None:
    ws = await Workspace.open(base / "containers" / "c1", LocalFileSystem)
    assert ws.root == base / "containers" / "c1"
    assert stat.S_IMODE(os.stat(ws.root).st_mode) == 0o700
    assert sorted(p.name for p in ws.root.iterdir()) == ["output", "projects", "temp"]
    assert ws.temp == ws.root / "temp"
    await ws.fs.write_bytes("projects/readme.md", b"# hi")
    assert (ws.projects / "readme.md").read_bytes() == b"# hi"
    again = await Workspace.open(ws.root, LocalFileSystem)  # idempotent
    assert await again.fs.read_bytes("projects/readme.md") == b"# hi"
    if ROOT:
        assert ws.owner == (65534, 65534)
        assert os.stat(ws.root).st_uid == 65534 and os.stat(ws.temp).st_uid == 65534


def test_tool_env_is_the_whole_environment() -> None:
    assert tool_env("/ws/c1") == {"PATH": SAFE_PATH, "HOME": "/ws/c1", "TMPDIR": "/ws/c1/temp",
                                  "LANG": "C.UTF-8", "TERM": "dumb"}


async def test_a_tool_sees_none_of_the_server_environment(base: Path, tool_uid: int, isolation: Isolation,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_API_KEY", "sk-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
    monkeypatch.setenv("AVM_DATA_DIR", "/root/.agentvm")
    ws = await Workspace.open(base / "c1", LocalFileSystem, owner=(tool_uid, tool_uid))
    rt = Runtime(ws, LocalProcessRunner(ws.root, isolation=isolation, unsafe_unsandboxed=UNSAFE_IF_NOT_ROOT))
    result = await rt.exec("env", limits=QUICK)
    assert result.exit_code == 0, result
    seen = dict(line.split("=", 1) for line in result.stdout.decode().splitlines())
    assert set(seen) - {"PWD", "SHLVL", "_"} == set(tool_env(str(ws.root)))
    assert seen["HOME"] == str(ws.root) and seen["TMPDIR"] == str(ws.temp)
    for secret in (b"sk-secret", b"aws-secret-value", b"AVM_", b"LLM_API_KEY"):
        assert secret not in result.stdout

    # Nor through /proc: the server's environ is not readable (another uid, or not in the pid namespace).
    peek = await rt.exec(f"cat /proc/{os.getpid()}/environ", limits=QUICK)
    if ROOT or isolation == "bwrap":
        assert peek.exit_code != 0 and b"sk-secret" not in peek.stdout


async def test_runtime_runs_bash_in_its_cwd(base: Path, tool_uid: int, isolation: Isolation) -> None:
    ws = await Workspace.open(base / "c1", LocalFileSystem, owner=(tool_uid, tool_uid))
    await ws.fs.mkdir("projects/app")
    runner = LocalProcessRunner(ws.root, isolation=isolation, unsafe_unsandboxed=UNSAFE_IF_NOT_ROOT)
    rt = Runtime(ws, runner, cwd="projects/app")
    assert rt.shell.endswith("/bash")
    result = await rt.exec('pwd; echo "$BASH_VERSION" | cut -c1; echo made > out.txt; touch "$TMPDIR/t" "$HOME/h"',
                           limits=QUICK)
    assert result.exit_code == 0, result
    lines = result.stdout.decode().splitlines()
    assert lines[0] == str(ws.projects / "app") and lines[1].isdigit()
    assert await ws.fs.read_bytes("projects/app/out.txt") == b"made\n"
    assert (ws.temp / "t").exists() and (ws.root / "h").exists()
    if ROOT:  # the tool's files belong to the tool uid, and so does what the server wrote for it
        assert os.stat(ws.projects / "app" / "out.txt").st_uid == tool_uid
        assert os.stat(ws.projects / "app").st_uid == tool_uid


@needs_root
async def test_the_tool_uid_can_change_what_the_agent_wrote(base: Path, tool_uid: int, isolation: Isolation) -> None:
    ws = await Workspace.open(base / "c1", LocalFileSystem, owner=(tool_uid, tool_uid))
    await ws.fs.write_bytes("projects/notes.txt", b"one\n")
    rt = Runtime(ws, LocalProcessRunner(ws.root, isolation=isolation, unsafe_unsandboxed=UNSAFE_IF_NOT_ROOT))
    result = await rt.exec("id -u; echo two >> projects/notes.txt", limits=QUICK)
    assert result.exit_code == 0, result
    assert result.stdout.decode().strip() == str(tool_uid)
    assert await ws.fs.read_bytes("projects/notes.txt") == b"one\ntwo\n"
