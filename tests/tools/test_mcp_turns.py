"""An image's stdio MCP server on `avm serve`: started from `mcpServers` in the container's sandbox,
its tool called by the model, the result in the stream and in the stored history; the server is
reused by the next turn, which (its tools now known) starts in the function tier and escalates."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from agentvm.adapters.local.local_process import probe_host
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from tests.support.servers import in_process
from tests.support.stock_client import StockClient
from tests.tools.test_mcp import FIXTURE, _exists, _interpreter, _site_packages_for_the_fixture, gone

SCRIPT = """
rules:
  - match: "^echo please"
    responses:
      - text: ["Asking the server."]
        tool_calls: [{id: toolu_echo, name: mcp__fixture__echo, input: {text: "from the model"}}]
      - text: ["It said it back."]
  - match: "^use broken"
    responses:
      - tool_calls: [{id: toolu_broken, name: mcp__broken__echo, input: {text: "x"}}]
      - text: ["It did not start."]
  - match: "^who are you"
    responses:
      - tool_calls: [{id: toolu_who, name: mcp__fixture__whoami, input: {}}]
      - text: ["Noted."]
"""


@pytest.fixture
def base(traversable_dir: Path) -> Path:
    return traversable_dir


def server_config(base: Path) -> dict[str, Any]:
    """The fixture as an image's stdio MCP server, runnable by an unprivileged uid."""
    python = _interpreter("none")
    if python is None:
        pytest.skip("no python of this version that an unprivileged uid can run")
    if python == sys.executable:
        return {"command": python, "args": [str(FIXTURE)]}
    lib = base / "pylib"
    lib.mkdir(mode=0o755)
    _site_packages_for_the_fixture(lib)
    script = base / FIXTURE.name
    shutil.copy(FIXTURE, script)
    for path in [lib, *lib.rglob("*"), script]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return {"command": python, "args": [str(script)], "env": {"PYTHONPATH": str(lib)}}


async def whoami(client: StockClient, image_id: str) -> dict[str, Any]:
    events = await client.turn(image_id, "who are you", timeout=30)
    [result] = [e["data"]["result"] for e in events if e["type"] == "tool_result"]
    return dict(json.loads(result))


async def test_a_stdio_mcp_tool_is_called_by_the_model(base: Path) -> None:
    host = probe_host()
    if host.prlimit is None or (os.geteuid() == 0 and host.setpriv is None):
        pytest.skip("util-linux's prlimit (and setpriv as root) are needed to start a sandboxed server")
    driver = ScriptedDriver(parse_script(SCRIPT))
    # bubblewrap would hide the fixture's packages outside the workspace; the uid and the rlimits hold
    # not root: `none` is unconfined, so it runs only with the explicit unsafe opt-in
    async with in_process(base / "data", driver=driver, sandbox_isolation="none",
                          unsafe_unsandboxed_tools=os.geteuid() != 0) as srv, \
            StockClient(srv.url) as client:
        tier = srv.runtime.container_tier
        image = await client.new_image("c-mcp", mcpServers={"fixture": server_config(base)})
        events = await client.turn(image["imageId"], "echo please", timeout=30)
        types = [e["type"] for e in events]
        assert types.count("tool_executing") == 1
        executing = next(e["data"] for e in events if e["type"] == "tool_executing")
        assert executing == {"toolId": "toolu_echo", "toolName": "mcp__fixture__echo",
                             "input": {"text": "from the model"}}
        [result] = [e["data"] for e in events if e["type"] == "tool_result"]
        assert result == {"toolCallId": "toolu_echo", "result": "echo: from the model", "isError": False}
        at = types.index("tool_result")
        assert [e["data"]["text"] for e in events[at:] if e["type"] == "text_delta"] == ["It said it back."]
        done = events[-1]["data"]
        # the server's tools were not known yet: the turn started in the container tier
        assert (done["status"], done["tier"]) == ("completed", "container")
        assert tier.dispatches == 1

        history = (await client.request("image_messages_request", {"imageId": image["imageId"]}))["data"]["messages"]
        stored = [m for m in history if m["subtype"] == "tool-result"]
        assert [m["toolResult"]["output"] for m in stored] == [{"type": "text", "value": "echo: from the model"}]
        assert [m["toolCall"]["name"] for m in history if m["subtype"] == "tool-call"] == ["mcp__fixture__echo"]

        first = await whoami(client, image["imageId"])
        # now known, the tools were offered from the function tier; the call escalated to the same server
        assert tier.dispatches == 2
        second = await whoami(client, image["imageId"])
        assert first["pid"] == second["pid"]  # one server process, reused across turns
        assert first["cwd"] == str((base / "data" / "containers" / "c-mcp" / "workspace").resolve())
        assert "ANTHROPIC_API_KEY" not in first["env"] and not [n for n in first["env"] if n.startswith("AVM_")]
        if os.geteuid() == 0:
            assert first["uid"] == os.stat(first["cwd"]).st_uid != 0
        assert srv.runtime.mcp.running() != []
    assert srv.runtime.mcp.running() == []  # stopped with the server


async def test_a_bad_mcp_config_is_refused_when_the_image_is_created(base: Path) -> None:
    async with in_process(base / "data", driver=ScriptedDriver(parse_script(SCRIPT))) as srv, \
            StockClient(srv.url) as client:
        await client.request("container_create_request", {"containerId": "c-bad"})
        res = await client.request("image_create_request", {"containerId": "c-bad", "config": {
            "mcpServers": {"files": {"type": "stdio", "command": ""}}}})
        assert res["data"]["error"] == "mcpServers.files.command: must be a non-empty string"
        images = await client.request("image_list_request", {"containerId": "c-bad"})
        assert images["data"]["records"] == []


async def test_a_server_that_does_not_start_says_why_and_does_not_escalate_every_turn(base: Path) -> None:
    host = probe_host()
    if host.prlimit is None or (os.geteuid() == 0 and host.setpriv is None):
        pytest.skip("util-linux's prlimit (and setpriv as root) are needed to start a sandboxed server")
    broken = {"command": "/bin/sh", "args": ["-c", "echo 'cannot open /opt/srv/index.js' >&2; exit 3"]}
    async with in_process(base / "data", driver=ScriptedDriver(parse_script(SCRIPT)), sandbox_isolation="none",
                          unsafe_unsandboxed_tools=os.geteuid() != 0) as srv, \
            StockClient(srv.url) as client:
        tier = srv.runtime.container_tier
        image = await client.new_image("c-broken", mcpServers={"broken": broken})
        results, tiers = [], []
        for _ in range(3):
            events = await client.turn(image["imageId"], "use broken", timeout=30)
            results += [e["data"] for e in events if e["type"] == "tool_result"]
            tiers.append((events[-1]["data"]["status"], events[-1]["data"]["tier"]))
        # the first turn went to the container tier to list the server's tools; it failed to start, so the
        # next turns stay in the function tier, and every call of its tool says why
        assert tiers == [("completed", "container"), ("completed", "function"), ("completed", "function")]
        assert tier.dispatches == 1
        assert [r["isError"] for r in results] == [True, True, True]
        assert len({r["result"] for r in results}) == 1
        text = results[0]["result"]
        assert text.startswith("Tool 'mcp__broken__echo': MCP server 'broken' did not start: "), text
        assert "cannot open /opt/srv/index.js" in text, text


async def test_deleting_an_image_stops_its_mcp_servers(base: Path) -> None:
    host = probe_host()
    if host.prlimit is None or (os.geteuid() == 0 and host.setpriv is None):
        pytest.skip("util-linux's prlimit (and setpriv as root) are needed to start a sandboxed server")
    async with in_process(base / "data", driver=ScriptedDriver(parse_script(SCRIPT)), sandbox_isolation="none",
                          unsafe_unsandboxed_tools=os.geteuid() != 0) as srv, \
            StockClient(srv.url) as client:
        config = server_config(base)
        first = await client.new_image("c-del", mcpServers={"fixture": config})
        pid = (await whoami(client, first["imageId"]))["pid"]
        # a second image of the container with the same server shares its process: deleting it keeps the server
        await client.request("image_create_request",
                             {"containerId": "c-del", "config": {"mcpServers": {"fixture": config}}})
        images = (await client.request("image_list_request", {"containerId": "c-del"}))["data"]["records"]
        [second] = [i["imageId"] for i in images if i["imageId"] != first["imageId"]]
        assert (await whoami(client, second))["pid"] == pid
        await client.request("image_delete_request", {"imageId": second})
        assert _exists(pid) and len(srv.runtime.mcp.running()) == 1
        await client.request("image_delete_request", {"imageId": first["imageId"]})
        assert srv.runtime.mcp.running() == []
        assert await gone(pid)
