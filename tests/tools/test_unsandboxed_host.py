"""The tool tests on a host forced to have no bubblewrap (tests/support/sandbox_hosts.py), through a
running server: not root → images with sandbox tools are refused at image_create, image_update and
message_send unless the unsafe opt-in is given, which the start-up banner and /health then shout;
root → the uid drop with a network namespace runs them, and in no mode but the opt-in does a tool
reach the server's own port on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentvm.config import Settings
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from avm.app import banner
from tests.sandbox.conftest import needs_root
from tests.support import servers
from tests.support.sandbox_hosts import force_host
from tests.support.servers import in_process
from tests.support.stock_client import StockClient

FIX = ("Install bubblewrap (`apt-get install bubblewrap`), run the server as root (tools then run as a per-container "
       "uid in their own network namespace), or accept unconfined tools with AVM_UNSAFE_UNSANDBOXED_TOOLS=1 "
       "(`avm serve --unsafe-unsandboxed-tools`): they can then read everything the server's user can and call "
       "its API.")
WHY = ("this server has no isolating tool sandbox: bubblewrap is not usable (bwrap is not installed), and the server "
       "does not run as root (tools would run as its own user). " + FIX)
REFUSED_BUILTINS = f"The image's tools (bash, read_file) run in the tool sandbox, and {WHY}"
MCP = {"files": {"command": "/usr/bin/python3", "args": ["-c", "pass"]},
       "remote": {"type": "http", "url": "https://mcp.example.com/mcp"}}


def script(port: int) -> str:
    # the tool calls the server's own port on loopback: /health, as the management API would be
    probe = json.dumps(f"exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3 "
                       "&& cat <&3")  # JSON text is a YAML double-quoted scalar
    return f"""
rules:
  - match: "^whoami$"
    responses:
      - tool_calls: [{{id: toolu_id, name: bash, input: {{command: "echo ran-as-$(id -u)"}}}}]
      - text: ["done"]
  - match: "^loopback$"
    responses:
      - tool_calls: [{{id: toolu_lo, name: bash, input: {{command: {probe}}}}}]
      - text: ["done"]
"""


@pytest.fixture
def port(monkeypatch: pytest.MonkeyPatch) -> int:
    """The server's port, known before it starts (the scripted tool call names it)."""
    chosen = servers.free_port()
    monkeypatch.setattr(servers, "free_port", lambda: chosen)
    return chosen


def tool_results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "tool_result"]


async def test_not_root_without_bubblewrap_refuses_sandbox_tools(traversable_dir: Path, port: int,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    data = traversable_dir / "data"
    driver = ScriptedDriver(parse_script(script(port)))
    # stored while this host still had a sandbox
    async with in_process(data, driver=driver) as srv, StockClient(srv.url) as client:
        earlier = await client.new_image("c-earlier", tools=["bash", "read_file"])
        chat_only = await client.new_image("c-chat")

    force_host(monkeypatch, "no-bwrap-not-root")
    async with in_process(data, driver=driver) as srv, StockClient(srv.url) as client, \
            httpx.AsyncClient(base_url=srv.http) as http:
        assert srv.runtime.tool_sandbox is not None and srv.runtime.tool_sandbox.mode == "unavailable"

        await client.request("container_create_request", {"containerId": "c-new"})
        res = await client.request("image_create_request", {"containerId": "c-new",
                                                            "config": {"tools": ["bash", "read_file"]}})
        assert (res["data"]["error"], res["data"]["errorCode"]) == (REFUSED_BUILTINS, "sandbox_unavailable")
        res = await client.request("image_create_request", {"containerId": "c-new", "config": {"mcpServers": MCP}})
        assert res["data"]["error"] == f"The image's tools (MCP server 'files') run in the tool sandbox, and {WHY}"
        listed = await client.request("image_list_request", {"containerId": "c-new"})
        assert listed["data"]["records"] == []  # nothing was stored

        answer = await http.post("/v1/images", json={"containerId": "c-http",
                                                     "config": {"tools": ["bash", "read_file"]}})
        assert answer.status_code == 503
        assert answer.json() == {"error": {"code": "sandbox_unavailable", "message": REFUSED_BUILTINS,
                                           "field": "tools"}}

        # the image stored earlier: refused at image_update and at turn time, before anything is stored
        res = await client.request("image_update_request", {"imageId": earlier["imageId"],
                                                            "updates": {"name": "renamed"}})
        assert (res["data"]["error"], res["data"]["errorCode"]) == (REFUSED_BUILTINS, "sandbox_unavailable")
        res = await client.request("message_send_request", {"imageId": earlier["imageId"], "content": "whoami"})
        assert (res["data"]["error"], res["data"]["errorCode"]) == (REFUSED_BUILTINS, "sandbox_unavailable")
        messages = await client.request("image_messages_request", {"imageId": earlier["imageId"]})
        assert messages["data"]["messages"] == []

        # images without sandbox tools work as before
        events = await client.turn(chat_only["imageId"], "hello")
        assert events[-1]["data"]["status"] == "completed"
        health = (await http.get("/health")).json()
        assert health == {"status": "ok", "version": health["version"], "auth": "open"}
        caplog.set_level(logging.INFO, logger="agentvm.serve")
        banner(srv.runtime, srv.port)
        said = [r.getMessage() for r in caplog.records if r.name == "agentvm.serve" and r.levelno == logging.WARNING]
        assert said == [f"Images with sandbox tools are refused: {WHY}"]


async def test_the_unsafe_opt_in_runs_tools_and_is_shouted(traversable_dir: Path, port: int,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    force_host(monkeypatch, "no-bwrap-not-root")
    driver = ScriptedDriver(parse_script(script(port)))
    async with in_process(traversable_dir / "data", driver=driver, unsafe_unsandboxed_tools=True) as srv, \
            StockClient(srv.url) as client, httpx.AsyncClient(base_url=srv.http) as http:
        image = await client.new_image("c-unsafe", tools=["bash", "read_file"])
        [ran] = tool_results(await client.turn(image["imageId"], "whoami"))
        assert ran["isError"] is False and f"ran-as-{os.geteuid()}" in ran["result"]  # the server's own user
        # what the opt-in gives away: the tool reaches the server's API on loopback
        [reached] = tool_results(await client.turn(image["imageId"], "loopback"))
        assert '"status":"ok"' in reached["result"], reached

        health = (await http.get("/health")).json()
        warning = ("tools run UNSANDBOXED (AVM_UNSAFE_UNSANDBOXED_TOOLS=1): bubblewrap is not usable (bwrap is not "
                   "installed), and the server does not run as root (tools would run as its own user); a tool can "
                   "read the server's keys, database and logs and call its API on loopback")
        assert health == {"status": "ok", "version": health["version"], "auth": "open", "sandbox": "unsafe-unsandboxed",
                          "warnings": [warning]}
        caplog.set_level(logging.INFO, logger="agentvm.serve")
        banner(srv.runtime, srv.port)
        shouted = [r for r in caplog.records if r.name == "agentvm.serve" and r.levelno == logging.WARNING]
        assert [r.getMessage() for r in shouted] == [
            f"WARNING: {warning}. Unset AVM_UNSAFE_UNSANDBOXED_TOOLS once bubblewrap is installed or the server "
            "runs as root."]


def test_the_opt_in_is_a_flag_and_an_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from avm.runner import arguments
    from avm.serve_cmd import flag_values, serve, settings_from

    def parsed(*argv: str) -> dict[str, object]:
        return flag_values(arguments(serve.make_context("serve", list(argv))))

    assert parsed("--unsafe-unsandboxed-tools") == {"unsafe_unsandboxed_tools": True}
    assert parsed() == {}
    flagged = settings_from(parsed("--unsafe-unsandboxed-tools"))
    assert isinstance(flagged, Settings) and flagged.unsafe_unsandboxed_tools is True
    plain = settings_from(parsed())
    assert isinstance(plain, Settings) and plain.unsafe_unsandboxed_tools is False
    monkeypatch.setenv("AVM_UNSAFE_UNSANDBOXED_TOOLS", "1")
    assert Settings().unsafe_unsandboxed_tools is True


@needs_root
@pytest.mark.parametrize("forced", [None, "no-bwrap"])
async def test_a_tool_cannot_reach_the_servers_port(traversable_dir: Path, port: int, forced: str | None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With bubblewrap (this host) and, forced without it, as root (uid drop + network namespace)."""
    if forced is not None:
        force_host(monkeypatch, "no-bwrap")
    driver = ScriptedDriver(parse_script(script(port)))
    async with in_process(traversable_dir / "data", driver=driver) as srv, StockClient(srv.url) as client, \
            httpx.AsyncClient(base_url=srv.http) as http:
        assert srv.runtime.tool_sandbox is not None
        expected_mode = "uid" if forced else "bubblewrap"
        if forced is None and srv.runtime.tool_sandbox.mode != "bubblewrap":
            pytest.skip("bubblewrap not usable here")
        assert srv.runtime.tool_sandbox.mode == expected_mode
        assert (await http.get("/health")).json()["status"] == "ok"  # the port answers the test itself
        image = await client.new_image("c-probe", tools=["bash"])
        [res] = tool_results(await client.turn(image["imageId"], "loopback"))
        assert res["isError"] is True, res
        assert '"status"' not in res["result"]
        assert "Connection refused" in res["result"] or "Network is unreachable" in res["result"], res["result"]
        [who] = tool_results(await client.turn(image["imageId"], "whoami"))
        assert "ran-as-0" not in who["result"] and "ran-as-" in who["result"]  # the container's own uid
