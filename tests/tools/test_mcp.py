"""MCP servers of an image (agentvm/tools/mcp.py): the config, the stdio fixture server through McpPool
(reuse, death and restart, idle stop, its exact environment), streamable HTTP, a server that does not
start, and LocalProcessRunner.sandboxed_argv confining a stdio server."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import mcp_types as types
import pytest
import uvicorn

from agentvm.adapters.local.local_fs import LocalFileSystem
from agentvm.adapters.local.local_process import Isolation, LocalProcessRunner, probe_host
from agentvm.domain.sandbox_limits import Limits
from agentvm.errors import AgentVMError, InvalidRequest
from agentvm.sandbox import Workspace
from agentvm.tools.mcp import (
    McpPool,
    McpServerConfig,
    McpTools,
    _list_tools,
    cap_output,
    config_fingerprint,
    parse_mcp_servers,
    qualified_names,
    render_result,
    unconfined,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mcp_echo_server.py"
ROOT = os.geteuid() == 0
BASE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # + HOME: the workspace
ECHO_TOOLS = {"echo", "add", "fail", "whoami", "header", "big", "sleep"}


def stdio_server(name: str = "echo", *, command: str = sys.executable, args: list[str] | None = None,
                 env: dict[str, str] | None = None) -> McpServerConfig:
    raw = {name: {"command": command, "args": [str(FIXTURE)] if args is None else args, "env": env or {}}}
    return parse_mcp_servers(raw)[name]


async def whoami(tools: McpTools, server: str = "echo") -> dict[str, Any]:
    outcome = await tools.run(f"mcp__{server}__whoami", {})
    assert not outcome.is_error, outcome.output
    return cast(dict[str, Any], json.loads(outcome.output))


def fixture_servers() -> list[int]:
    """Our descendants running the fixture server (its file name on their command line)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if FIXTURE.name.encode() in f.read() and _descends_from_us(int(name)):
                        found.append(int(name))
            except OSError:
                pass
    return found


def _descends_from_us(pid: int) -> bool:
    while pid > 1:
        with open(f"/proc/{pid}/stat", "rb") as f:
            pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        if pid == os.getpid():
            return True
    return False


def _exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


async def gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while _exists(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@pytest.fixture
def base(traversable_dir: Path) -> Path:
    return traversable_dir


@pytest.fixture
async def pool() -> AsyncIterator[McpPool]:
    pool = McpPool(call_timeout_s=1.0, max_output_bytes=4096)
    yield pool
    await pool.close()


# -- config -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "message"), [
    ([], "mcpServers: must be an object mapping server names to server configs"),
    ({"files": "npx server"}, "mcpServers.files: must be an object"),
    ({"files": {"args": ["x"]}}, "mcpServers.files.command: must be a non-empty string"),
    ({"files": {"command": " "}}, "mcpServers.files.command: must be a non-empty string"),
    ({"files": {"command": "A=1"}}, "mcpServers.files.command: must not contain '='"),
    ({"files": {"command": "srv", "args": "-v"}}, "mcpServers.files.args: must be a list of strings"),
    ({"files": {"command": "srv", "args": [1]}}, "mcpServers.files.args: must be a list of strings"),
    ({"files": {"command": "srv", "env": ["A=1"]}}, "mcpServers.files.env: must be an object of strings"),
    ({"files": {"command": "srv", "env": {"A": 1}}}, "mcpServers.files.env.A: must be a string"),
    ({"files": {"command": "srv", "env": {"1A": "x"}}},
     "mcpServers.files.env: names must be letters, digits and '_', not starting with a digit (\"1A\")"),
    ({"files": {"command": "srv", "url": "https://x"}},
     "mcpServers.files.url: only http and sse servers take a url and headers (set \"type\")"),
    ({"web": {"type": "http"}}, "mcpServers.web.url: must be an http(s) URL"),
    ({"web": {"type": "http", "url": "ftp://host/mcp"}}, "mcpServers.web.url: must be an http(s) URL"),
    ({"web": {"type": "sse", "url": "https:///mcp"}}, "mcpServers.web.url: must be an http(s) URL"),
    ({"web": {"type": "http", "url": "http://host:99999/"}}, "mcpServers.web.url: must be an http(s) URL"),
    ({"web": {"type": "http", "url": "https://host", "command": "srv"}},
     "mcpServers.web.command: only stdio servers take a command, args and env"),
    ({"web": {"type": "http", "url": "https://host", "headers": {"X-Key": 1}}},
     "mcpServers.web.headers.X-Key: must be a string"),
    ({"web": {"type": "http", "url": "https://host", "headers": {"Bad Name": "v"}}},
     "mcpServers.web.headers: names must be HTTP header names (\"Bad Name\")"),
    ({"web": {"type": "http", "url": "https://host", "headers": {"X-Key": "a\r\nInjected: 1"}}},
     "mcpServers.web.headers.X-Key: must not contain line breaks"),
    ({"x": {"type": "websocket", "url": "wss://host"}}, "mcpServers.x.type: must be one of stdio, http, sse"),
    ({"x": {"type": "sdk", "name": "in-process"}},
     "mcpServers.x.type: in-process (sdk) servers run inside the client's own program and cannot be "
     "configured over the wire; use stdio, http or sse"),
    ({"my server": {"command": "srv"}},
     "mcpServers[\"my server\"]: server names must be 1 to 48 letters, digits, '_' or '-'"),
    ({"s" * 49: {"command": "srv"}},
     f"mcpServers[\"{'s' * 49}\"]: server names must be 1 to 48 letters, digits, '_' or '-'"),
    ({f"s{i}": {"command": "srv"} for i in range(33)}, "mcpServers: at most 32 servers"),
])
def test_a_bad_config_names_the_field_and_the_problem(raw: object, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_mcp_servers(raw)
    assert caught.value.message == message
    assert caught.value.field == message.split(": ", 1)[0]


def test_a_valid_config() -> None:
    assert parse_mcp_servers(None) == {}
    servers = parse_mcp_servers({
        "files": {"command": "npx", "args": ["-y", "server-files", "--token=t0p"], "env": {"B": "2", "A": "s3cret"}},
        "web": {"type": "http", "url": "https://mcp.example.com/mcp?key=k", "headers": {"Authorization": "Bearer b"}},
        "old": {"type": "sse", "url": "http://127.0.0.1:9000/sse", "command": None},
    })
    files, web, old = servers["files"], servers["web"], servers["old"]
    assert (files.transport, files.command, files.args) == ("stdio", "npx", ("-y", "server-files", "--token=t0p"))
    assert files.env == (("A", "s3cret"), ("B", "2")) and files.needs_sandbox
    assert (web.transport, web.url, web.headers) == ("http", "https://mcp.example.com/mcp?key=k",
                                                     (("Authorization", "Bearer b"),))
    assert not web.needs_sandbox and old.transport == "sse"
    for secret in ("s3cret", "t0p", "Bearer", "key=k"):  # the repr may end up in logs
        assert secret not in repr(servers)
    again = parse_mcp_servers({"files": {"env": {"A": "s3cret", "B": "2"}, "command": "npx", "type": "stdio",
                                         "args": ["-y", "server-files", "--token=t0p"]}})["files"]
    assert config_fingerprint(again) == config_fingerprint(files)
    changed = parse_mcp_servers({"files": {"command": "npx", "env": {"A": "other", "B": "2"},
                                           "args": ["-y", "server-files", "--token=t0p"]}})["files"]
    assert config_fingerprint(changed) != config_fingerprint(files)


def test_tool_names_are_qualified_valid_and_unique() -> None:
    long = "t" * 200
    names = qualified_names([("files", "read"), ("files", "a.b"), ("files", "a_b"), ("files", "a b"),
                             ("web", "read"), ("web", long), ("web", long + "x")])
    assert names[("files", "read")] == "mcp__files__read" and names[("web", "read")] == "mcp__web__read"
    assert names[("files", "a_b")] == "mcp__files__a_b"  # valid names keep their natural form
    assert {names[("files", "a.b")], names[("files", "a b")]} == {"mcp__files__a_b_2", "mcp__files__a_b_3"}
    assert names[("files", "a b")] == "mcp__files__a_b_2"  # deterministic: in sorted order
    assert len(set(names.values())) == len(names)
    assert names[("web", long)] == ("mcp__web__" + long)[:128]
    assert names[("web", long + "x")] == ("mcp__web__" + long)[:126] + "_2"
    for name in names.values():
        assert len(name) <= 128 and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)


def test_results_are_rendered_as_text_and_capped() -> None:
    result = types.CallToolResult(content=[
        types.TextContent(text="first"),
        types.ImageContent(data="A" * 1648, mime_type="image/png"),
        types.EmbeddedResource(resource=types.TextResourceContents(uri="file:///a.txt", text="inside")),
        types.EmbeddedResource(resource=types.BlobResourceContents(uri="file:///b.bin", blob="AAAA",
                                                                    mime_type="application/zip")),
        types.ResourceLink(uri="file:///c.md", name="c", mime_type="text/markdown"),
    ])
    assert render_result(result) == ("first\n[image image/png, 1,236 bytes]\n[resource file:///a.txt]\ninside\n"
                                     "[resource file:///b.bin application/zip, 3 bytes]\n"
                                     "[resource link file:///c.md (text/markdown)]")
    structured = types.CallToolResult(content=[], structured_content={"temperature": 21})
    assert render_result(structured) == '{"temperature": 21}'
    assert cap_output("short", 10) == "short"
    assert cap_output("é" * 10, 5) == "éé\n[output truncated: 20 bytes in total]"


async def test_tool_listing_follows_the_pagination_cursors() -> None:
    class Paged:
        def __init__(self) -> None:
            self.cursors: list[str | None] = []

        async def list_tools(self, *, params: types.PaginatedRequestParams | None = None) -> types.ListToolsResult:
            cursor = params.cursor if params is not None else None
            self.cursors.append(cursor)
            page = {None: (["a", "b"], "p2"), "p2": (["c"], "p3"), "p3": (["d"], None)}[cursor]
            return types.ListToolsResult(tools=[types.Tool(name=n, input_schema={"type": "object"}) for n in page[0]],
                                         next_cursor=page[1])

    session = Paged()
    tools = await _list_tools(cast(Any, session))
    assert [t.name for t in tools] == ["a", "b", "c", "d"] and session.cursors == [None, "p2", "p3"]


# -- stdio ------------------------------------------------------------------------------------------


async def test_a_stdio_server_through_the_pool(base: Path, pool: McpPool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Secrets and the variables the SDK would copy from our environment: none may reach the server.
    for name, value in {"ANTHROPIC_API_KEY": "sk-ant-secret", "SHELL": "/bin/zsh", "USER": "agentvm",
                        "LOGNAME": "agentvm"}.items():
        monkeypatch.setenv(name, value)
    ws = base / "ws"
    ws.mkdir()
    env = {**BASE_ENV, "HOME": str(ws)}
    servers = {"echo": stdio_server(env={"ECHO_MODE": "on"})}
    tools = await pool.tools(("t1", "c1"), servers, cwd=ws, env=env, launcher=unconfined)

    assert tools.problems == []
    assert tools.names() == {f"mcp__echo__{t}" for t in ECHO_TOOLS}
    echo = next(s for s in tools.schemas() if s["name"] == "mcp__echo__echo")
    assert echo["description"] == "Return the text, prefixed with 'echo: '."
    assert echo["input_schema"]["properties"] == {"text": {"title": "Text", "type": "string"}}
    assert echo["input_schema"]["required"] == ["text"]
    assert tools.needs_sandbox("mcp__echo__echo") and not tools.needs_sandbox("mcp__nope")

    ok = await tools.run("mcp__echo__echo", {"text": "hi"})
    assert (ok.output, ok.is_error) == ("echo: hi", False)
    assert (await tools.run("mcp__echo__add", {"a": 2, "b": 3})).output == "5"
    failed = await tools.run("mcp__echo__fail", {})
    assert failed.is_error and "this tool always fails" in failed.output
    unknown = await tools.run("mcp__echo__nope", {})
    assert (unknown.output, unknown.is_error) == ("Tool 'mcp__echo__nope' is not available to this agent.", True)
    big = await tools.run("mcp__echo__big", {"n": 10_000})
    assert big.output == "x" * 4096 + "\n[output truncated: 10,000 bytes in total]" and not big.is_error
    slow = await tools.run("mcp__echo__sleep", {"seconds": 1.5})
    assert (slow.output, slow.is_error) == ("mcp__echo__sleep: timed out after 1 s", True)
    assert (await tools.run("mcp__echo__echo", {"text": "still there"})).output == "echo: still there"

    me = await whoami(tools)
    assert me["cwd"] == str(ws)
    assert me["env"] == sorted([*env, "ECHO_MODE"])  # exactly: no ANTHROPIC_API_KEY, SHELL, USER, LOGNAME

    # The next turn reuses the running server (after a ping: the timed-out call made it suspect).
    again = await pool.tools(("t1", "c1"), servers, cwd=ws, env=env, launcher=unconfined)
    assert (await whoami(again))["pid"] == me["pid"]
    assert len(pool.running()) == 1 and pool.running()[0][:3] == ("t1", "c1", "echo")

    # It dies: the next call says so, naming the server; the next turn restarts it.
    os.kill(me["pid"], signal.SIGKILL)
    dead = await again.run("mcp__echo__echo", {"text": "hi"})
    assert dead.is_error and dead.output.startswith("mcp__echo__echo: MCP server 'echo' is not running: ")
    assert "exited" in dead.output
    restarted = await pool.tools(("t1", "c1"), servers, cwd=ws, env=env, launcher=unconfined)
    second = (await whoami(restarted))["pid"]
    assert second != me["pid"] and restarted.problems == []

    # Idle: stopped (the process ends); a turn that still holds its tools restarts it on its next call.
    assert await pool.reap_idle(now=time.monotonic() + 3600) == 1
    assert pool.running() == [] and await gone(second)
    third = (await whoami(restarted))["pid"]
    assert third not in (me["pid"], second) and len(pool.running()) == 1

    await pool.close()
    assert pool.running() == [] and await gone(third)
    assert fixture_servers() == []


async def test_servers_that_do_not_start_cost_only_their_tools(base: Path) -> None:
    pool = McpPool(start_timeout_s=1.0)
    env = {**BASE_ENV, "HOME": str(base)}
    try:
        async with EchoOverHttp() as url:
            servers = parse_mcp_servers({
                "web": {"type": "http", "url": url},
                "ghost": {"command": "no-such-mcp-server", "args": ["--stdio"]},
                "mute": {"command": "/bin/sh", "args": ["-c", "cat >/dev/null"]},  # reads, never answers
            })
            tools = await pool.tools(("t1", "c1"), servers, cwd=base, env=env, launcher=unconfined)
            assert tools.names() == {f"mcp__web__{t}" for t in ECHO_TOOLS}
            ghost, mute = tools.problems
            assert ghost.startswith("ghost: ") and "no-such-mcp-server" in ghost
            assert "No such file or directory" in ghost
            assert mute == "mute: did not start within 1 s"
            # a call of a failed server's tool says why it is missing; a mistyped name does not
            assert (await tools.run("mcp__ghost__echo", {})).output == \
                f"Tool 'mcp__ghost__echo': MCP server 'ghost' did not start: {ghost.removeprefix('ghost: ')}"
            assert (await tools.run("mcp__mute__echo", {})).output == \
                "Tool 'mcp__mute__echo': MCP server 'mute' did not start: did not start within 1 s"
            assert (await tools.run("mcp__nobody__echo", {})).output == \
                "Tool 'mcp__nobody__echo' is not available to this agent."
            assert [key[2] for key in pool.running()] == ["web"]
            # Not retried at once: the next turn gets the same answers without waiting for them again.
            started = time.monotonic()
            again = await pool.tools(("t1", "c1"), servers, cwd=base, env=env, launcher=unconfined)
            assert again.problems == tools.problems and time.monotonic() - started < 0.5
    finally:
        await pool.close()
    assert fixture_servers() == [] and not _our_processes_running("cat")


def _our_processes_running(command: str) -> bool:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if Path(f"/proc/{name}/comm").read_text().strip() == command and _descends_from_us(int(name)):
                    return True
            except OSError:
                pass
    return False


# -- remote servers (streamable HTTP, SSE) ------------------------------------------------------------


class _Uvicorn(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the test's loop is not ours to take over
        pass


class EchoOverHttp:
    """The fixture server's MCP app served by uvicorn in this loop on 127.0.0.1 (a free port):
    streamable HTTP at /mcp, or SSE at /sse."""

    def __init__(self, transport: str = "http") -> None:
        from tests.fixtures.mcp_echo_server import server

        self.app = server.sse_app() if transport == "sse" else server.streamable_http_app()
        self.path = "/sse" if transport == "sse" else "/mcp"
        self.sock = socket.socket()
        self.server = _Uvicorn(uvicorn.Config(self.app, log_config=None, lifespan="on", timeout_graceful_shutdown=1))
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> str:
        self.sock.bind(("127.0.0.1", 0))
        self.task = asyncio.get_running_loop().create_task(self.server.serve(sockets=[self.sock]))
        while not self.server.started:
            assert not self.task.done(), self.task.result()
            await asyncio.sleep(0.01)
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}{self.path}"

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await asyncio.wait_for(self.task, 10)
        self.sock.close()


@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_a_remote_server(pool: McpPool, base: Path, transport: str) -> None:
    http = EchoOverHttp(transport)
    async with http as url:
        servers = parse_mcp_servers({"web": {"type": transport, "url": url, "headers": {"X-Api-Key": "k"}}})
        tools = await pool.tools(("t1", "c1"), servers, cwd=base, env=BASE_ENV, launcher=unconfined)
        assert tools.problems == [] and tools.names() == {f"mcp__web__{t}" for t in ECHO_TOOLS}
        assert not tools.needs_sandbox("mcp__web__echo")  # callable from the function tier
        assert (await tools.run("mcp__web__echo", {"text": "over http"})).output == "echo: over http"
        assert (await tools.run("mcp__web__add", {"a": 20, "b": 22})).output == "42"
        assert (await tools.run("mcp__web__fail", {})).is_error
        assert (await tools.run("mcp__web__header", {"name": "x-api-key"})).output == "k"  # the config's headers
        assert len(pool.running()) == 1
        await http.stop()  # the server goes away: the call says so, naming it
        down = await tools.run("mcp__web__echo", {"text": "anyone?"})
        assert down.is_error and down.output.startswith("mcp__web__echo: MCP server 'web' is not running: ")
        assert pool.running() == []


# -- sandboxed -----------------------------------------------------------------------------------------


def _readable_by_others(path: Path) -> bool:
    """Whether a uid that owns nothing here may read `path` (and traverse its directories)."""
    real = Path(os.path.realpath(path))
    dirs_ok = all(os.stat(p).st_mode & 0o001 for p in real.parents)
    return dirs_ok and bool(os.stat(real).st_mode & 0o004)


def _interpreter(isolation: Isolation) -> str | None:
    """A python of our version the sandboxed server can run: ours, when nothing stands in the way;
    else the system's (under /usr, which bubblewrap shows)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    ours_ok = not ROOT and isolation == "none"
    candidates = [sys.executable] if ours_ok else []
    candidates += [f"/usr/bin/{version}", f"/usr/local/bin/{version}"]
    for candidate in candidates:
        if os.path.exists(candidate) and (ours_ok or _readable_by_others(Path(candidate))):
            if isolation == "bwrap" and not os.path.realpath(candidate).startswith("/usr/"):
                continue
            return candidate
    return None


def _site_packages_for_the_fixture(dest: Path) -> None:
    """Hard-link (or copy) the packages the fixture imports, and the packages' metadata, into `dest`."""
    site = sysconfig.get_paths()["purelib"]
    probe = (f"import runpy, sys; runpy.run_path({str(FIXTURE)!r}, run_name='probe'); "
             f"print('\\n'.join(m.__file__ for m in list(sys.modules.values()) "
             f"if (getattr(m, '__file__', None) or '').startswith({site!r})))")
    files = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    tops = {Path(f).relative_to(site).parts[0] for f in files} | {p.name for p in Path(site).glob("*.dist-info")}
    for top in tops:
        src = Path(site, top)
        if src.is_dir():
            shutil.copytree(src, dest / top, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(src), str(dest / top))


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def test_sandboxed_argv_builds_the_launcher_chain_without_a_cgroup() -> None:
    host = probe_host()
    if host.prlimit is None:
        pytest.skip("util-linux's prlimit is not installed: there is no launcher chain to check")
    with tempfile.TemporaryDirectory(prefix="avm-mcp-", dir="/tmp") as tmp:
        Path(tmp, "sub").mkdir()
        runner = LocalProcessRunner(Path(tmp), isolation="none", run_as=(61999, 61999), unsafe_unsandboxed=not ROOT)
        argv, workdir = asyncio.run(runner.sandboxed_argv(["srv", "--stdio"], cwd="sub", limits=Limits(processes=7)))
        assert workdir == os.path.realpath(Path(tmp, "sub"))
        assert argv[0] == host.prlimit and "--nproc=7:7" in argv and argv[-2:] == ["srv", "--stdio"]
        assert host.sh not in argv  # no `sh -c` joining a pids cgroup
        if ROOT:
            assert host.setpriv in argv and "--reuid=61999" in argv
        # an absolute cwd inside the root is accepted, one outside is not
        _, same = asyncio.run(runner.sandboxed_argv(["srv"], cwd=str(Path(tmp, "sub")), limits=Limits()))
        assert same == workdir
        with pytest.raises(InvalidRequest):
            asyncio.run(runner.sandboxed_argv(["srv"], cwd="/etc", limits=Limits()))
        # without the exec launcher: refused as root (no uid drop), the bare command otherwise
        plain = LocalProcessRunner(Path(tmp), isolation="none", launcher="preexec", unsafe_unsandboxed=not ROOT)
        if ROOT:
            with pytest.raises(AgentVMError, match="prlimit"):
                asyncio.run(plain.sandboxed_argv(["srv"], cwd=".", limits=Limits()))
        else:
            assert asyncio.run(plain.sandboxed_argv(["srv"], cwd=".", limits=Limits()))[0] == ["srv"]


@pytest.mark.parametrize("isolation", ["none", "bwrap"])
async def test_a_sandboxed_stdio_server(base: Path, pool: McpPool, isolation: Isolation) -> None:
    host = probe_host()
    if host.prlimit is None or (ROOT and host.setpriv is None):
        pytest.skip("util-linux's prlimit (and setpriv as root) are needed to start a sandboxed server")
    if isolation == "bwrap" and host.bwrap is None:
        pytest.skip(f"bubblewrap not usable here: {host.bwrap_problem}")
    python = _interpreter(isolation)
    if python is None:
        pytest.skip("no python of this version that an unprivileged uid can run (ours lives in an unreadable dir)")
    uid = 62000 + os.getpid() % 1000
    ws = await Workspace.open(base / "ws", LocalFileSystem, owner=(uid, uid))
    script, env = str(FIXTURE), {}
    if python != sys.executable:  # the system's python: our packages, readable by the server's uid
        lib = ws.root / "temp" / "pylib"
        lib.mkdir()
        _site_packages_for_the_fixture(lib)
        shutil.copy(FIXTURE, ws.root / "temp" / FIXTURE.name)
        script, env = str(ws.root / "temp" / FIXTURE.name), {"PYTHONPATH": str(lib)}
    # not root, `none`: unconfined, so only with the explicit unsafe opt-in
    runner = LocalProcessRunner(ws.root, isolation=isolation, run_as=(uid, uid), unsafe_unsandboxed=not ROOT)
    launcher = functools.partial(runner.sandboxed_argv, limits=Limits(cpu_s=120, memory_bytes=4 << 30))
    servers = {"box": stdio_server("box", command=python, args=[script], env=env)}
    tools = await pool.tools(("t1", "c1"), servers, cwd=ws.root, env={**BASE_ENV, "HOME": str(ws.root)},
                             launcher=launcher)
    assert tools.problems == []
    assert (await tools.run("mcp__box__echo", {"text": "boxed"})).output == "echo: boxed"
    me = await whoami(tools, "box")
    assert me["cwd"] == str(ws.root)
    assert me["uid"] == (uid if ROOT else os.getuid())
    set_by_bwrap = ["PWD"] if isolation == "bwrap" else []  # bubblewrap sets it after --chdir
    assert me["env"] == sorted([*BASE_ENV, "HOME", *env, *set_by_bwrap])
    await pool.close()
    assert fixture_servers() == []
