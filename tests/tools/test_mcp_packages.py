"""Real MCP server packages on `avm serve` (issue 19, item 9), as `make test` installs them (Makefile
target `mcp-servers`: under /usr/local as root, else in .mcp-servers/, copied into a workspace here).
The MCP project's Node server `@modelcontextprotocol/server-everything` answers a model's tool calls

* over stdio, started in the tool sandbox (bubblewrap when it works here) as the container's uid while
  the server runs as root: Node reads its OpenSSL config and the CA roots from the sandbox's /etc;
* with the README's own stdio example (tests/e2e/test_readme_snippets.py runs the rest of README.md);
* over streamable HTTP (a remote server: the agent's process connects to it, nothing is sandboxed);

and so does the Python server `mcp-server-time` (PyPI) over stdio in the sandbox, which finds the local
time zone in the sandbox's /etc. Without Node.js 18+ or a package, its tests skip and say what
`make mcp-servers` would install."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentvm.adapters.local.local_process import probe_host
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from tests.e2e.test_readme_snippets import FRAGMENT, README, readme_blocks
from tests.support.servers import REPO, free_port, in_process
from tests.support.stock_client import StockClient
from tests.tools.test_mcp import _descends_from_us

PACKAGE = "@modelcontextprotocol/server-everything"
VERSION = "2026.8.31"  # the Makefile's MCP_EVERYTHING_VERSION
TIME_VERSION = "2026.10.19"  # the Makefile's MCP_TIME_VERSION
PREFIXES = (Path("/usr/local"), REPO / ".mcp-servers")  # where `make mcp-servers` installs them (root, others)
ROOT = os.geteuid() == 0

SCRIPT = """
rules:
  - match: "^echo please"
    responses:
      - tool_calls: [{id: toolu_echo, name: mcp__everything__echo, input: {message: "hello from the sandbox"}}]
      - text: ["It said it back."]
  - match: "^add please"
    responses:
      - tool_calls: [{id: toolu_sum, name: mcp__everything__get-sum, input: {a: 2, b: 40}}]
      - text: ["Added."]
  - match: "^time please"
    responses:
      - tool_calls: [{id: toolu_time, name: mcp__time__get_current_time, input: {timezone: "Europe/Paris"}}]
      - text: ["Noted."]
  - match: "^env please"
    responses:
      - tool_calls: [{id: toolu_env, name: mcp__everything__get-env, input: {}}]
      - text: ["Noted."]
"""


def test_the_makefile_installs_the_version_these_tests_expect() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert f"MCP_EVERYTHING_VERSION ?= {VERSION}\n" in makefile
    assert f"MCP_EVERYTHING := {PACKAGE}\n" in makefile
    assert f"MCP_TIME_VERSION ?= {TIME_VERSION}\n" in makefile


def node() -> str:
    """Node.js 18+ under /usr (a sandboxed server sees nothing else), or skip with the reason."""
    found = shutil.which("node")
    if found is None:
        pytest.skip("Node.js is not installed: `make mcp-servers` installs it (apt-get, as root)")
    real = os.path.realpath(found)
    if not real.startswith("/usr/"):
        pytest.skip(f"node is {real}: a sandboxed MCP server sees only /usr and its workspace")
    version = subprocess.run([real, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < 18:
        pytest.skip(f"node {version}: {PACKAGE} needs Node.js 18 or newer")
    return real


def installed() -> Path:
    """The installed package's directory (the one of the expected version), or skip with the reason."""
    for prefix in PREFIXES:
        package = prefix / "lib" / "node_modules" / PACKAGE
        try:
            if json.loads((package / "package.json").read_text())["version"] == VERSION:
                return package
        except (OSError, ValueError, KeyError):
            continue
    pytest.skip(f"{PACKAGE}@{VERSION} is not installed: run `make mcp-servers` (npm, network)")


def installed_time_server() -> Path:
    """The venv holding mcp-server-time of the expected version, or skip with the reason."""
    for prefix in PREFIXES:
        venv = prefix / "lib" / "mcp-server-time"
        try:
            if (venv / ".installed").read_text().strip() == f"mcp-server-time=={TIME_VERSION}":
                return venv
        except OSError:
            continue
    pytest.skip(f"mcp-server-time {TIME_VERSION} is not installed: run `make mcp-servers` (uv, network)")


def sandboxed() -> None:
    host = probe_host()
    if host.prlimit is None or (ROOT and host.setpriv is None):
        pytest.skip("util-linux's prlimit (and setpriv as root) are needed to start a sandboxed server")
    if host.bwrap is None and not ROOT:
        pytest.skip("neither bubblewrap nor root: this host has no isolating sandbox for the server")


def entry_point(package: Path, workspace: Path) -> str:
    """The server's entry point as the sandbox sees it: under /usr as installed, else copied into the
    workspace (the other place a sandboxed server's files may live)."""
    if package.is_relative_to("/usr"):
        return str(package / "dist" / "index.js")
    copy = workspace / "mcp" / "server-everything"
    shutil.copytree(package, copy, symlinks=True)
    return str(copy / "dist" / "index.js")


def time_server_python(venv: Path, workspace: Path) -> str:
    """The venv's python as the sandbox sees it: under /usr as installed, else the venv copied into the
    workspace (its python is a link to /usr/bin/python3; `-m` needs no script with the old path)."""
    if venv.is_relative_to("/usr"):
        return str(venv / "bin" / "python")
    copy = workspace / "mcp" / "mcp-server-time"
    shutil.copytree(venv, copy, symlinks=True)
    return str(copy / "bin" / "python")


@pytest.fixture
def base(traversable_dir: Path) -> Path:
    return traversable_dir


def results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "tool_result"]


def server_processes(entry: str) -> list[int]:
    """Our descendant processes running the server's entry point."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                if entry.encode() in argv and b"bwrap" not in argv[0] and _descends_from_us(int(name)):
                    found.append(int(name))
            except OSError:
                pass
    return found


def ancestors(pid: int) -> list[str]:
    """The command names of a process's ancestors, nearest first."""
    names = []
    while pid > 1:
        with open(f"/proc/{pid}/stat", "rb") as f:
            pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        with open(f"/proc/{pid}/comm") as f:
            names.append(f.read().strip())
    return names


def uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Uid:")).split()[1])


async def test_a_node_mcp_server_answers_tool_calls_in_the_sandbox(base: Path) -> None:
    node_bin, package = node(), installed()
    sandboxed()
    data = base / "data"
    async with in_process(data, driver=ScriptedDriver(parse_script(SCRIPT))) as srv, \
            StockClient(srv.url) as client:
        workspace = data / "containers" / "c-node" / "workspace"
        await client.request("container_create_request", {"containerId": "c-node"})
        entry = entry_point(package, workspace)
        config = {"everything": {"command": node_bin, "args": [entry, "stdio"]}}
        image = await client.new_image("c-node", mcpServers=config)

        events = await client.turn(image["imageId"], "echo please", timeout=60)
        assert results(events) == [{"toolCallId": "toolu_echo", "result": "Echo: hello from the sandbox",
                                    "isError": False}]
        assert (events[-1]["data"]["status"], events[-1]["data"]["tier"]) == ("completed", "container")
        events = await client.turn(image["imageId"], "add please", timeout=60)
        assert results(events) == [{"toolCallId": "toolu_sum", "result": "The sum of 2 and 40 is 42.",
                                    "isError": False}]

        # one server process, in the sandbox: as the container's uid (not root), under bubblewrap when it
        # works here, with the scrubbed tool environment
        [pid] = server_processes(entry)
        if ROOT:
            assert uid_of(pid) == workspace.stat().st_uid != 0
        if probe_host().bwrap is not None:
            assert "bwrap" in ancestors(pid)
        [env_result] = results(await client.turn(image["imageId"], "env please", timeout=60))
        env = json.loads(env_result["result"])
        assert env["HOME"] == str(workspace.resolve()), env
        assert not [name for name in env if name.startswith(("AVM_", "LLM_", "ANTHROPIC_", "AWS_"))], env
        await client.request("image_delete_request", {"imageId": image["imageId"]})
        assert srv.runtime.mcp.running() == []
        assert server_processes(entry) == []


async def test_a_python_mcp_server_answers_in_the_sandbox(base: Path) -> None:
    venv = installed_time_server()
    sandboxed()
    data = base / "data"
    async with in_process(data, driver=ScriptedDriver(parse_script(SCRIPT))) as srv, \
            StockClient(srv.url) as client:
        workspace = data / "containers" / "c-time" / "workspace"
        await client.request("container_create_request", {"containerId": "c-time"})
        python = time_server_python(venv, workspace)
        image = await client.new_image("c-time", mcpServers={"time": {"command": python,
                                                                      "args": ["-m", "mcp_server_time"]}})
        before = datetime.now(UTC)
        [result] = results(await client.turn(image["imageId"], "time please", timeout=60))
        assert result["isError"] is False, result
        got = json.loads(result["result"])
        assert got["timezone"] == "Europe/Paris"
        at = datetime.fromisoformat(got["datetime"])
        assert at.utcoffset() in (timedelta(hours=1), timedelta(hours=2))  # CET or CEST
        assert before - timedelta(seconds=5) <= at <= datetime.now(UTC) + timedelta(seconds=5)
        assert len(server_processes("mcp_server_time")) == 1
    assert srv.runtime.mcp.running() == []


async def readme_mcp_servers() -> dict[str, Any]:
    """The `mcpServers` of README.md's tools example, as its `image_create` sends them."""
    [fragment] = [b.text for b in readme_blocks(README.read_text()) if b.lang == "python" and FRAGMENT in b.text]
    sent: list[dict[str, Any]] = []

    class Recorder:
        async def request_ok(self, kind: str, data: dict[str, Any]) -> None:
            sent.append(data)

    code = compile(fragment, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    awaiting = eval(code, {"avm": Recorder()})  # README.md's own code, as a reader would run it
    if awaiting is not None:
        await awaiting
    [request] = sent
    return dict(request["config"]["mcpServers"])


async def test_the_readme_stdio_example_is_this_package_under_usr() -> None:
    stdio = {name: cfg for name, cfg in (await readme_mcp_servers()).items() if cfg.get("type", "stdio") == "stdio"}
    assert stdio == {"everything": {"command": "/usr/bin/node", "args": [
        f"/usr/local/lib/node_modules/{PACKAGE}/dist/index.js", "stdio"]}}
    readme = README.read_text()
    assert f"npm install -g --prefix /usr/local {PACKAGE}@{VERSION}" in readme


def is_file(path: str) -> bool:
    return os.path.isfile(path)


async def test_the_readme_stdio_example_answers_in_the_sandbox(base: Path) -> None:
    servers = await readme_mcp_servers()
    stdio = servers["everything"]
    if missing := [path for path in (stdio["command"], stdio["args"][0]) if not is_file(path)]:
        pytest.skip(f"README.md's stdio example is not installed here: {' '.join(missing)} "
                    "(`make mcp-servers` installs it as root)")
    node()
    sandboxed()
    async with in_process(base / "data", driver=ScriptedDriver(parse_script(SCRIPT))) as srv, \
            StockClient(srv.url) as client:
        image = await client.new_image("user-alice", mcpServers={"everything": stdio})
        events = await client.turn(image["imageId"], "echo please", timeout=60)
        assert results(events) == [{"toolCallId": "toolu_echo", "result": "Echo: hello from the sandbox",
                                    "isError": False}]


@pytest.fixture
async def streamable_http() -> AsyncIterator[str]:
    """server-everything's streamable HTTP transport on a free loopback port: its MCP endpoint's URL."""
    node_bin, package = node(), installed()
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        node_bin, str(package / "dist" / "index.js"), "streamableHttp",
        env={"PATH": "/usr/bin:/bin", "PORT": str(port)},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        async with httpx.AsyncClient() as http:
            for _ in range(300):
                assert proc.returncode is None, "server-everything (streamableHttp) exited at start"
                try:
                    await http.get(url, timeout=1)
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        await proc.wait()


async def test_a_node_mcp_server_over_streamable_http(base: Path, streamable_http: str) -> None:
    async with in_process(base / "data", driver=ScriptedDriver(parse_script(SCRIPT))) as srv, \
            StockClient(srv.url) as client:
        image = await client.new_image("c-http", mcpServers={"everything": {"type": "http", "url": streamable_http}})
        events = await client.turn(image["imageId"], "add please", timeout=60)
        assert results(events) == [{"toolCallId": "toolu_sum", "result": "The sum of 2 and 40 is 42.",
                                    "isError": False}]
        # a remote server needs no sandbox: the turn stays in the function tier
        assert (events[-1]["data"]["status"], events[-1]["data"]["tier"]) == ("completed", "function")
        assert srv.runtime.container_tier.dispatches == 0
