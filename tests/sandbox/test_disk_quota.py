"""Disk is a quota, not a shared pool (issue 15, point 4): a workspace quota held by the file tools and
during a bash call, and a reserve of free space under which tools that write are refused."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agentvm.adapters.local.local_fs import LocalFileSystem
from agentvm.adapters.local.local_process import LocalProcessRunner
from agentvm.domain.sandbox_limits import Limits
from agentvm.sandbox import Runtime, Workspace
from agentvm.sandbox.quota import DiskPolicy, free_space, size_text, workspace_usage
from agentvm.tools.builtin import BuiltinTools

MIB = 1 << 20
QUICK = Limits(timeout_s=20)
ALL = ("bash", "read_file", "write_file", "edit_file")
QUOTA_KILLED = "killed\n[killed: the workspace quota of 1 MiB was reached; remove files to make room]"


async def _tools(base: Path, uid: int, disk: DiskPolicy, *, preview_bytes: int = 16 * 1024) -> BuiltinTools:
    ws = await Workspace.open(base / "c1", LocalFileSystem, owner=(uid, uid))
    rt = Runtime(ws, LocalProcessRunner(ws.root, isolation="auto", disk=disk))
    return BuiltinTools(rt, ALL, limits=QUICK, disk=disk, preview_bytes=preview_bytes)


def test_sizes_read_as_people_write_them() -> None:
    assert [size_text(n) for n in (1 << 30, 512 << 20, 3 << 29, 700 << 10, 12)] == \
        ["1 GiB", "512 MiB", "1.5 GiB", "700 KiB", "12 bytes"]


def test_usage_counts_blocks_and_hard_links_once(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"x" * 10_000)
    (tmp_path / "b").write_bytes(b"y")
    (tmp_path / "d" / "link").hardlink_to(tmp_path / "d" / "a")
    (tmp_path / "sym").symlink_to("/usr")  # not followed
    with open(tmp_path / "sparse", "wb") as f:  # a 1 GiB hole holds nothing
        f.truncate(1 << 30)
    used = workspace_usage(tmp_path)
    assert 12 << 10 <= used <= 64 << 10, used  # 10 KB + 1 byte in blocks, the directory, the symlink


async def test_write_and_edit_are_refused_past_the_quota(base: Path, tool_uid: int) -> None:
    tools = await _tools(base, tool_uid, DiskPolicy(quota_bytes=MIB, reserve_bytes=0))
    first = await tools.run("write_file", {"path": "projects/a.txt", "content": "a" * 600_000})
    assert (first.output, first.is_error) == ("Wrote 600,000 bytes to projects/a.txt", False)
    # overwriting a file counts what it replaces: the same size again fits
    again = await tools.run("write_file", {"path": "projects/a.txt", "content": "b" * 600_000})
    assert again.is_error is False
    second = await tools.run("write_file", {"path": "projects/b.txt", "content": "c" * 600_000})
    assert second.is_error is True
    assert second.output.startswith("write_file: refused: the workspace quota of 1 MiB would be exceeded (")
    assert second.output.endswith("this write needs 585.9 KiB): remove files to make room")
    assert not (tools.runtime.workspace.root / "projects" / "b.txt").exists()
    grown = await tools.run("edit_file", {"path": "projects/a.txt", "old_string": "b" * 600_000,
                                          "new_string": "d" * 1_100_000})
    assert grown.is_error is True
    assert grown.output.startswith("edit_file: refused: the workspace quota of 1 MiB would be exceeded")
    assert (tools.runtime.workspace.root / "projects" / "a.txt").read_text() == "b" * 600_000


async def test_one_big_write_fails_inside_the_tool_and_the_result_names_the_quota(base: Path, tool_uid: int) -> None:
    tools = await _tools(base, tool_uid, DiskPolicy(quota_bytes=MIB, reserve_bytes=0))
    # the command itself: it dies of SIGXFSZ at what the quota leaves
    out = await tools.run("bash", {"command": "head -c 5M /dev/zero > projects/big"})
    assert out.is_error is True
    assert out.output.startswith(QUOTA_KILLED)
    assert (tools.runtime.workspace.root / "projects" / "big").stat().st_size <= MIB  # RLIMIT_FSIZE stopped it
    # a command in a script: the write fails, the script goes on, and the result says the quota is reached
    # (what remains of the quota is measured when a call starts: a call that deletes frees room for the next)
    assert (await tools.run("bash", {"command": "rm projects/big"})).output == "exit code 0"
    out = await tools.run("bash", {"command": "head -c 5M /dev/zero > projects/big2; echo after"})
    status, note, rest = out.output.split("\n", 2)
    assert (status, rest.split("\n", 2)[:2]) == ("exit code 0", ["after", "[stderr]"]), out.output
    assert note.startswith("[workspace: ") and note.endswith(
        " used, the workspace quota of 1 MiB is reached: a write past it fails (\"File size limit exceeded\")]")
    assert "File size limit exceeded" in rest


async def test_many_small_writes_are_stopped_by_the_watchdog(base: Path, tool_uid: int) -> None:
    tools = await _tools(base, tool_uid, DiskPolicy(quota_bytes=MIB, reserve_bytes=0))
    root = tools.runtime.workspace.root
    started = time.monotonic()
    out = await tools.run("bash", {"command": "for i in $(seq 1 100); do head -c 100K /dev/zero > projects/f$i; "
                                              "sleep 0.02; done; echo finished"})
    assert time.monotonic() - started < 10
    assert out.output.startswith(QUOTA_KILLED)
    assert "finished" not in out.output
    # the files written so far stay, and the result says the workspace is over quota
    assert "over the workspace quota of 1 MiB: writes fail until files are removed]" in out.output
    used = workspace_usage(root)
    assert MIB < used < 4 * MIB, used  # 10 MB unchecked
    # a workspace over quota may still delete (the watchdog kills only a call that makes it grow) ...
    cleaned = await tools.run("bash", {"command": "rm projects/f*; echo cleaned"})
    assert (cleaned.output, cleaned.is_error) == ("exit code 0\ncleaned", False)
    # ... and after that, write again
    again = await tools.run("bash", {"command": "head -c 100K /dev/zero > projects/ok && echo ok"})
    assert again.output == "exit code 0\nok"


async def test_under_the_reserve_tools_that_write_are_refused(base: Path, tool_uid: int) -> None:
    free = {"bytes": 100 * MIB}
    tools = await _tools(base, tool_uid, DiskPolicy(quota_bytes=MIB, reserve_bytes=512 * MIB,
                                                    free_bytes=lambda: free["bytes"]))
    (tools.runtime.workspace.root / "projects" / "note.txt").write_text("still readable")
    why = "the server's disk is nearly full: 100 MiB free, under the reserve of 512 MiB kept for its database"
    bash = await tools.run("bash", {"command": "echo hi"})
    assert (bash.output, bash.is_error) == (f"bash: refused: {why}; tools that write are paused until space is freed",
                                            True)
    write = await tools.run("write_file", {"path": "projects/x.txt", "content": "x"})
    assert (write.output, write.is_error) == (f"write_file: refused: {why}", True)
    read = await tools.run("read_file", {"path": "projects/note.txt"})
    assert (read.output, read.is_error) == ("still readable", False)
    free["bytes"] = 10 << 30
    assert (await tools.run("bash", {"command": "echo hi"})).output == "exit code 0\nhi"


async def test_a_running_call_is_stopped_when_free_space_falls_under_the_reserve(base: Path, tool_uid: int) -> None:
    free = {"bytes": 10 << 30}
    tools = await _tools(base, tool_uid, DiskPolicy(quota_bytes=MIB, reserve_bytes=512 * MIB,
                                                    free_bytes=lambda: free["bytes"]))

    async def fill_up() -> None:
        await asyncio.sleep(0.5)
        free["bytes"] = 64 * MIB  # another tenant, or anything else, filled the disk

    started = time.monotonic()
    filler = asyncio.ensure_future(fill_up())
    out = await tools.run("bash", {"command": "sleep 15; echo done"})
    await filler
    assert time.monotonic() - started < 8
    assert out.output == ("killed\n[killed: the server's disk is nearly full (under the reserve of 512 MiB kept for "
                          "its database); tools that write are paused until space is freed]")


async def test_a_long_result_is_not_kept_past_the_quota(base: Path, tool_uid: int) -> None:
    tools = await _tools(base, tool_uid, DiskPolicy(quota_bytes=MIB, reserve_bytes=0), preview_bytes=1024)
    root = tools.runtime.workspace.root
    (root / "projects" / "big.txt").write_text("z" * 700_000)
    out = await tools.run("read_file", {"path": "projects/big.txt"})
    assert out.output.startswith("z" * 1024 + "\n[output truncated: 700,000 bytes in total; the rest was not kept: "
                                 "the workspace quota of 1 MiB would be exceeded")
    assert not list((root / "output").iterdir())


def test_the_free_space_of_a_data_dir_not_made_yet(tmp_path: Path) -> None:
    assert free_space(tmp_path / "not" / "yet")() > 0


def test_policy_values_are_checked() -> None:
    with pytest.raises(ValueError, match="quota_bytes must be at least 1"):
        DiskPolicy(quota_bytes=0)
    with pytest.raises(ValueError, match="reserve_bytes must not be negative"):
        DiskPolicy(reserve_bytes=-1)
    assert DiskPolicy(free_bytes=lambda: (_ for _ in ()).throw(OSError(5, "Input/output error"))).reserve_problem() \
        == "the free space of the server's disk cannot be read (Input/output error)"
