"""Fail closed: which sandbox each host gives, the runner's refusal where none isolates, the unsafe
opt-in, and that tools reach no loopback service (a real listening socket) in the modes that run them.

Hosts this machine is not (no bubblewrap; not root; no network namespaces) are forced through the
probe's cache (tests/support/sandbox_hosts.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentvm.adapters.local.local_fs import LocalFileSystem
from agentvm.adapters.local.local_process import Launcher, LocalProcessRunner
from agentvm.adapters.local.tool_sandbox import Host, ToolSandbox, assess
from agentvm.domain.sandbox_limits import Limits
from agentvm.errors import SandboxUnavailable
from agentvm.sandbox import Runtime, Workspace
from tests.sandbox.conftest import needs_root
from tests.support.sandbox_hosts import force_host, forced

QUICK = Limits(timeout_s=10)
FIX = ("Install bubblewrap (`apt-get install bubblewrap`), run the server as root (tools then run as a per-container "
       "uid in their own network namespace), or accept unconfined tools with AVM_UNSAFE_UNSANDBOXED_TOOLS=1 "
       "(`avm serve --unsafe-unsandboxed-tools`): they can then read everything the server's user can and call "
       "its API.")
NOT_ROOT = ("this server has no isolating tool sandbox: bubblewrap is not usable (bwrap is not installed), and the "
            f"server does not run as root (tools would run as its own user). {FIX}")


def test_each_host_gets_the_mode_it_can_isolate_with() -> None:
    bwrap, no_bwrap = forced("no-bwrap"), forced("no-bwrap-not-root")
    with_bwrap_user = Host(privileged=False, prlimit="/usr/bin/prlimit", setpriv=None, sh="/bin/sh",
                           bwrap="/usr/bin/bwrap", bwrap_problem=None, cgroups=None)
    assert assess(with_bwrap_user, "auto").mode == "bubblewrap"
    assert assess(with_bwrap_user, "none").mode == "unavailable"  # `none` is no longer a silent "unconfined"
    assert assess(with_bwrap_user, "none", unsafe=True).mode == "unsafe-unsandboxed"
    assert assess(bwrap, "auto") == ToolSandbox("uid")  # root without bubblewrap: uid drop + network namespace
    assert assess(bwrap, "none") == ToolSandbox("uid")
    assert assess(no_bwrap, "auto") == ToolSandbox(
        "unavailable", "bubblewrap is not usable (bwrap is not installed), and the server does not run as root "
                       "(tools would run as its own user)")
    assert assess(no_bwrap, "auto").refusal == NOT_ROOT
    assert assess(no_bwrap, "auto", unsafe=True).mode == "unsafe-unsandboxed"
    assert assess(no_bwrap, "auto", unsafe=True).refusal is None

    # root where no network namespace can be made: avm serve (listening on loopback) refuses; the
    # container task's worker, which listens on nothing, goes on with the uid drop
    no_netns = forced("root-without-netns")
    refused = assess(no_netns, "auto")
    assert refused.mode == "unavailable"
    assert refused.refusal == (
        "this server has no isolating tool sandbox: bubblewrap is not usable (bwrap is not installed), and tools "
        "cannot get their own network namespace (unshare --net does not work here: unshare failed: Operation not "
        f"permitted), so they could reach the server's API on loopback. {FIX}")
    assert assess(no_netns, "auto", private_network=False).mode == "uid"

    # `bwrap` required: the opt-in does not replace it
    strict = assess(no_bwrap, "bwrap", unsafe=True)
    assert strict.mode == "unavailable"
    assert strict.refusal == ("this server has no isolating tool sandbox: sandbox_isolation is 'bwrap' but bubblewrap "
                              "is not usable (bwrap is not installed). Install bubblewrap (`apt-get install "
                              "bubblewrap`) or set AVM_SANDBOX_ISOLATION=auto.")


def test_health_and_banner_texts() -> None:
    unsafe = assess(forced("no-bwrap-not-root"), "auto", unsafe=True)
    assert unsafe.warning == ("tools run UNSANDBOXED (AVM_UNSAFE_UNSANDBOXED_TOOLS=1): bubblewrap is not usable (bwrap "
                              "is not installed), and the server does not run as root (tools would run as its own "
                              "user); a tool can read the server's keys, database and logs and call its API on "
                              "loopback")
    assert unsafe.health() == {"sandbox": "unsafe-unsandboxed", "warnings": [unsafe.warning]}
    assert assess(forced("no-bwrap-not-root"), "auto").health() == {}  # refused: /health stays as it was
    assert ToolSandbox("bubblewrap").health() == {} and ToolSandbox("uid").health() == {}


async def test_the_runner_refuses_without_an_isolating_sandbox(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    force_host(monkeypatch, "no-bwrap-not-root")
    ws = await Workspace.open(base / "ws", LocalFileSystem)
    none = NOT_ROOT.replace("bubblewrap is not usable (bwrap is not installed)", "sandbox_isolation is 'none'")
    for isolation, expected in (("auto", NOT_ROOT), ("none", none)):
        runner = LocalProcessRunner(ws.root, isolation=isolation)
        with pytest.raises(SandboxUnavailable) as info:
            await runner.run(["true"], cwd=".", env={}, limits=QUICK)
        assert info.value.message == f"Tools cannot run: {expected}"
        assert info.value.code == "sandbox_unavailable"
        with pytest.raises(SandboxUnavailable, match="Tools cannot run: this server has no isolating"):
            await runner.sandboxed_argv(["cat"], cwd=".", limits=QUICK)  # stdio MCP servers

    # the explicit opt-in: the command runs (as the server's own user), and the runner says so
    unsafe = LocalProcessRunner(ws.root, unsafe_unsandboxed=True)
    result = await Runtime(ws, unsafe).exec("echo ran", limits=QUICK)
    assert (result.exit_code, result.stdout) == (0, b"ran\n")
    assert unsafe.sandbox is not None and unsafe.sandbox.mode == "unsafe-unsandboxed"


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A real TCP listener on 127.0.0.1, like the server's own port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def accepted(sock: socket.socket) -> int:
    count = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


CONNECT = "exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"


@needs_root
@pytest.mark.parametrize("mode", ["bwrap", "uid-exec", "uid-preexec"])
async def test_a_tool_cannot_reach_a_loopback_listener(base: Path, tool_uid: int, listener: socket.socket,
                                                       host: Host, mode: str) -> None:
    if mode == "bwrap" and host.bwrap is None:
        pytest.skip(f"bubblewrap not usable here: {host.bwrap_problem}")
    if mode != "bwrap" and host.unshare is None:
        pytest.skip(f"no network namespaces here: {host.unshare_problem}")
    port = listener.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port), timeout=5):  # the listener works: the test can fail
        pass
    assert accepted(listener) == 1
    ws = await Workspace.open(base / "ws", LocalFileSystem, owner=(tool_uid, tool_uid))
    launcher: Launcher = "preexec" if mode == "uid-preexec" else "auto"
    runner = LocalProcessRunner(ws.root, isolation="bwrap" if mode == "bwrap" else "none", launcher=launcher)
    result = await Runtime(ws, runner).exec(CONNECT.format(port=port) + "; cat /proc/net/dev | tail -n +3",
                                            limits=QUICK)
    assert b"connected" not in result.stdout, result
    # bubblewrap brings up an empty lo (refused); unshare --net leaves it down (unreachable)
    assert b"Connection refused" in result.stderr or b"Network is unreachable" in result.stderr, result
    assert accepted(listener) == 0
    assert runner.sandbox == ToolSandbox("bubblewrap" if mode == "bwrap" else "uid")


async def test_only_the_unsafe_opt_in_reaches_loopback(base: Path, listener: socket.socket,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # what the opt-in gives away, stated as a test: the tool connects to the server's port
    force_host(monkeypatch, "no-bwrap-not-root")
    ws = await Workspace.open(base / "ws", LocalFileSystem)
    port = listener.getsockname()[1]
    result = await Runtime(ws, LocalProcessRunner(ws.root, unsafe_unsandboxed=True)).exec(
        CONNECT.format(port=port), limits=QUICK)
    assert result.stdout == b"connected\n", result
    assert accepted(listener) == 1

