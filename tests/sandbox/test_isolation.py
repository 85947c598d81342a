"""What one container's tools can see of the host and of another container's workspace.

Guarantees, as tested here:
* with bubblewrap: another workspace, /root, /work and the host's /tmp are not in the tool's file
  system at all; no network; its own pid namespace.
* without bubblewrap, server running as root: the tool runs as its workspace's uid; a workspace is
  0o700, so another container's workspace with another uid cannot be read. Two workspaces given the
  same uid (the default nobody) are NOT isolated from each other. World-readable host files are.
* without bubblewrap, server not running as root: no file isolation (skipped here).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentvm.adapters.local.local_fs import LocalFileSystem
from agentvm.adapters.local.local_process import _ETC, Isolation, LocalProcessRunner
from agentvm.adapters.local.tool_sandbox import Host
from agentvm.domain.sandbox_limits import Limits
from agentvm.sandbox import Runtime, Workspace
from tests.sandbox.conftest import ROOT, needs_root

QUICK = Limits(timeout_s=10)
SECRET = b"container B's secret"


async def _pair(base: Path, uid_a: int, uid_b: int, isolation: Isolation) -> tuple[Runtime, Workspace]:
    a = await Workspace.open(base / "containers" / "a", LocalFileSystem, owner=(uid_a, uid_a))
    b = await Workspace.open(base / "containers" / "b", LocalFileSystem, owner=(uid_b, uid_b))
    await b.fs.write_bytes("projects/secret.txt", SECRET)
    return Runtime(a, LocalProcessRunner(a.root, isolation=isolation)), b


async def test_a_tool_cannot_read_another_containers_workspace(base: Path, tool_uid: int,
                                                                isolation: Isolation) -> None:
    if not ROOT and isolation == "none":
        pytest.skip("without bwrap and without root, tools run as the server's user: no file isolation")
    rt, other = await _pair(base, tool_uid, tool_uid + 1, isolation)
    for command in ("cat ../b/projects/secret.txt", f"cat {other.root}/projects/secret.txt", "ls ../b",
                    f"cp -r {other.root} ./stolen", "ls /root"):
        result = await rt.exec(command, limits=QUICK)
        assert result.exit_code != 0, (command, result)
        assert SECRET not in result.stdout, command
        expected = b"No such file or directory" if isolation == "bwrap" else b"Permission denied"
        assert expected in result.stderr, (command, result.stderr)
    assert not (rt.workspace.root / "stolen" / "projects").exists()  # cp made the empty top dir at most


@needs_root
async def test_without_bwrap_one_uid_for_two_workspaces_is_not_isolation(base: Path, tool_uid: int) -> None:
    # The limit of the uid mechanism, stated as a test: give each container its own uid.
    rt, _ = await _pair(base, tool_uid, tool_uid, "none")
    result = await rt.exec("cat ../b/projects/secret.txt", limits=QUICK)
    assert result.stdout == SECRET


async def test_bwrap_shows_only_the_workspace_and_system_files(base: Path, tool_uid: int, host: Host) -> None:
    if host.bwrap is None:
        pytest.skip(f"bubblewrap not usable here: {host.bwrap_problem}")
    rt, _ = await _pair(base, tool_uid, tool_uid + 1, "bwrap")
    script = "; ".join([
        "ls /",
        "echo ---; ls /tmp",  # a private, empty /tmp
        "echo ---; test -e /root || echo no-root",
        "test -e /etc/shadow || echo no-shadow",
        "echo ---; wc -l < /proc/net/dev",  # header (2 lines) + lo: no network interfaces
        "echo ---; ls /proc | grep -c '^[0-9]'",  # own pid namespace: a handful of processes
        "echo ---; ls ..",
    ])
    result = await rt.exec(script, limits=QUICK)
    assert result.exit_code == 0, result
    top, tmp, missing, net, pids, siblings = result.stdout.decode().split("---\n")
    assert set(top.split()) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr"}
    assert tmp.split() == [base.name]  # only the path down to the workspace
    assert missing.split() == ["no-root", "no-shadow"]
    assert int(net) == 3
    assert int(pids) < 10
    assert siblings.split() == ["a"]  # container b is not there
    offline = await rt.exec("exec 3<>/dev/tcp/1.1.1.1/53", limits=QUICK)
    assert offline.exit_code != 0


_ETC_PRESENT = {name for name in _ETC if os.path.lexists(f"/etc/{name}")}
_ETC_PROBE = "; ".join([
    "head -c 64 /etc/resolv.conf > /dev/null && echo resolv",
    "ls /etc/ssl/certs | grep -q . && echo certs",
    "head -1 /etc/passwd | cut -d: -f1",
    "cat /etc/shadow > /dev/null 2>&1 || echo no-shadow",
    "cat /etc/gshadow > /dev/null 2>&1 || echo no-gshadow",
    "python3 -c \"import ssl; c = ssl.create_default_context(cafile='/etc/ssl/certs/ca-certificates.crt'); "
    "print('tls', len(c.get_ca_certs()) > 10)\"",
])


@pytest.mark.skipif(not Path("/etc/ssl/certs/ca-certificates.crt").is_file() or not Path("/etc/resolv.conf").exists(),
                    reason="this host has no Debian-style CA bundle or resolv.conf")
async def test_a_tool_reads_the_harmless_etc_files_but_not_shadow(base: Path, tool_uid: int,
                                                                  isolation: Isolation) -> None:
    if not ROOT and isolation == "none":
        pytest.skip("without bwrap and without root, tools run as the server's user")
    rt, _ = await _pair(base, tool_uid, tool_uid + 1, isolation)
    result = await rt.exec(_ETC_PROBE, limits=QUICK)
    assert result.exit_code == 0, result
    assert result.stdout.decode().split("\n") == ["resolv", "certs", "root", "no-shadow", "no-gshadow", "tls True", ""]


async def test_bwrap_offers_only_the_allow_listed_etc_entries(base: Path, tool_uid: int, host: Host) -> None:
    if host.bwrap is None:
        pytest.skip(f"bubblewrap not usable here: {host.bwrap_problem}")
    rt, _ = await _pair(base, tool_uid, tool_uid + 1, "bwrap")
    result = await rt.exec("stat -c %a /etc; ls -A /etc", limits=QUICK)
    assert result.exit_code == 0, result
    mode, *names = result.stdout.decode().split()
    assert mode == "755"
    assert set(names) == _ETC_PRESENT
    assert {"resolv.conf", "ssl", "passwd"} <= _ETC_PRESENT
    assert not {"shadow", "gshadow", "sudoers", "sudoers.d", "ssh"} & set(names)
