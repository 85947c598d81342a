"""Tool and sandbox resources: checked when registered, resolved and pinned into images by their
type (built-in, MCP server, HTTP endpoint), HTTP tools called in the function tier and only at
public addresses unless the deployment allows private ones, sandbox limits applied to the tools."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentvm.domain.sandbox_limits import Limits, limits_for
from agentvm.domain.sandbox_spec import check_sandbox_content
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from agentvm.tools.resource_tools import HttpTools, check_tool_content
from tests.support.servers import in_process
from tests.support.stock_client import StockClient

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mcp_echo_server.py"


class _Endpoint(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, dict[str, str], bytes]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        type(self).seen.append((self.command, self.path, dict(self.headers), body))
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("location", "http://example.com/")
            self.end_headers()
            return
        if self.path.startswith("/fail"):
            payload, status = b"upstream says no", 503
        elif self.path.startswith("/big"):
            payload, status = b"x" * (300 * 1024), 200
        else:
            question = json.loads(body)["city"] if body else self.path
            payload, status = f"sunny in {question}".encode(), 200
        self.send_response(status)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    _Endpoint.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def http_spec(url: str, **extra: Any) -> dict[str, Any]:
    return {"name": "weather", "url": url, "method": "POST", "description": "Weather of a city",
            "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}}, "headers": {},
            "timeoutS": 5.0, **extra}


@pytest.mark.parametrize(("content", "error"), [
    ({"type": "plugin"}, "type: one of builtin, mcp, http"),
    ({"type": "builtin", "name": "rm"}, "name: one of bash, read_file, write_file, edit_file, list_files"),
    ({"type": "builtin", "name": "bash", "x": 1}, "x: unknown key (a builtin tool has type, name)"),
    ({"type": "mcp", "server": {"command": ""}}, "server.command: must be a non-empty string"),
    ({"type": "http", "url": "ftp://x", "description": "d", "inputSchema": {"type": "object"}},
     "url: an http(s) URL with a host"),
    ({"type": "http", "url": "https://u:p@x.test/", "description": "d", "inputSchema": {"type": "object"}},
     "url: no credentials in the URL"),
    ({"type": "http", "url": "https://x.test/", "description": "d", "inputSchema": {"type": "array"}},
     'inputSchema: a JSON schema with "type": "object"'),
    ({"type": "http", "url": "https://x.test/", "description": "", "inputSchema": {"type": "object"}},
     "description: 1 to 2000 characters (the model reads it to decide when to call)"),
    ({"type": "http", "url": "https://x.test/", "description": "d", "inputSchema": {"type": "object"},
      "headers": {"Authorization": "Bearer sk-secret"}},
     "headers.Authorization: no credentials in a resource (its content is readable by whoever may read the "
     "resource)"),
    ({"type": "http", "url": "https://x.test/", "description": "d", "inputSchema": {"type": "object"},
      "timeoutS": 60}, "timeoutS: a number of seconds above 0, at most 30"),
    ({"type": "http", "url": "https://x.test/", "method": "DELETE", "description": "d",
      "inputSchema": {"type": "object"}}, "method: one of GET, POST"),
])
def test_tool_content_is_checked(content: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_tool_content(content)
    assert str(caught.value) == error


@pytest.mark.parametrize(("content", "error"), [
    ({"limits": {"timeoutS": 0}}, "limits.timeoutS: an integer from 1 to 3600"),
    ({"limits": {"gpus": 1}}, "limits.gpus: unknown limit (one of timeoutS, cpuS, memoryMb, fileSizeMb, "
                              "processes, outputBytes)"),
    ({"limits": {}}, "limits: an object with any of timeoutS, cpuS, memoryMb, fileSizeMb, processes, outputBytes"),
    ({"limits": {"cpuS": 5}, "packages": ["numpy"]},
     "packages: not supported: tools run in the deployment's container image (infra/container/Dockerfile); "
     "add packages there"),
])
def test_sandbox_content_is_checked(content: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_sandbox_content(content)
    assert str(caught.value) == error


def test_a_sandbox_lowers_the_deployments_limits_and_never_raises_them() -> None:
    ceiling = Limits(timeout_s=30, memory_bytes=1 << 30)
    lowered = limits_for(ceiling, {"limits": {"timeoutS": 2, "memoryMb": 4096, "processes": 8}})
    assert (lowered.timeout_s, lowered.memory_bytes, lowered.processes) == (2.0, 1 << 30, 8)
    assert limits_for(ceiling, None) is ceiling


async def test_http_tools_post_get_fail_cut_and_do_not_follow_redirects(endpoint: str) -> None:
    tools = HttpTools([http_spec(f"{endpoint}/weather"),
                       http_spec(f"{endpoint}/q", name="lookup", method="GET"),
                       http_spec(f"{endpoint}/fail", name="failing"),
                       http_spec(f"{endpoint}/big", name="big"),
                       http_spec(f"{endpoint}/redirect", name="moved")], allow_private=True)
    assert [s["name"] for s in tools.schemas()] == ["weather", "lookup", "failing", "big", "moved"]
    assert tools.needs_sandbox("weather") is False
    ok = await tools.run("weather", {"city": "Oslo"})
    assert (ok.output, ok.is_error) == ("sunny in Oslo", False)
    method, path, headers, body = _Endpoint.seen[-1]
    assert (method, path, json.loads(body)) == ("POST", "/weather", {"city": "Oslo"})
    assert headers["host"] == endpoint.split("://")[1] and headers["user-agent"] == "AgentVM-http-tool"
    got = await tools.run("lookup", {"city": "Rome", "days": 2})
    assert got.output == "sunny in /q?city=Rome&days=2"
    failed = await tools.run("failing", {})
    assert (failed.output, failed.is_error) == ("failing: HTTP 503 from 127.0.0.1\nupstream says no", True)
    big = await tools.run("big", {})
    assert big.output.endswith("\n[response cut at 262,144 bytes]") and len(big.output) < 263_000
    moved = await tools.run("moved", {})
    assert moved.is_error and moved.output.startswith("moved: HTTP 302 from 127.0.0.1")
    assert len(_Endpoint.seen) == 5  # the redirect was not followed


async def test_http_tools_reach_only_public_addresses_by_default(endpoint: str) -> None:
    tools = HttpTools([http_spec(f"{endpoint}/weather"),
                       http_spec("http://169.254.169.254/latest/meta-data/", name="metadata"),
                       http_spec("http://localhost:9/", name="local"),
                       http_spec("http://[::1]:9/", name="v6")])
    for name, address in (("weather", "127.0.0.1"), ("metadata", "169.254.169.254"), ("v6", "::1")):
        refused = await tools.run(name, {"city": "Oslo"})
        assert refused.is_error, name
        assert refused.output.endswith(f"resolves to {address}, which is not a public address"), refused.output
    local = await tools.run("local", {})
    assert local.is_error and "which is not a public address" in local.output
    assert _Endpoint.seen == []  # nothing was sent


SCRIPT = """
rules:
  - match: "^weather"
    responses:
      - tool_calls: [{id: toolu_w, name: weather, input: {city: "Bergen"}}]
      - text: ["It is sunny."]
  - match: "^slow"
    responses:
      - tool_calls: [{id: toolu_s, name: bash, input: {command: "sleep 5; echo done"}}]
      - text: ["Too slow."]
"""


async def test_images_pin_tool_and_sandbox_resources_and_run_them(tmp_path: Path, endpoint: str) -> None:
    driver = ScriptedDriver(parse_script(SCRIPT))
    async with in_process(tmp_path / "data", driver=driver, http_tools_allow_private=True) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http, StockClient(srv.url) as ws:
        async def register(**body: Any) -> dict[str, Any]:
            res = await http.post("/v1/resources", json={"version": "1.0.0", **body})
            assert res.status_code == 201, res.text
            return dict(res.json())

        refused = await http.post("/v1/resources", json={
            "kind": "tool", "name": "leaky", "version": "1.0.0",
            "content": {"type": "http", "url": "https://x.test/", "description": "d",
                        "inputSchema": {"type": "object"}, "headers": {"X-Api-Key": "sk-1"}}})
        assert refused.status_code == 400 and refused.json()["error"]["message"].startswith(
            "content.headers.X-Api-Key: no credentials in a resource")
        await register(kind="tool", name="shell", content={"type": "builtin", "name": "bash"})
        await register(kind="tool", name="weather", content={
            "type": "http", "url": f"{endpoint}/weather", "description": "Weather of a city",
            "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
        await register(kind="tool", name="echo", content={
            "type": "mcp", "server": {"command": sys.executable, "args": [str(FIXTURE)]}})
        await register(kind="sandbox", name="tight", content={"limits": {"timeoutS": 1}})
        refs = ["resource://tools/shell", "resource://tools/weather@^1", "resource://tools/echo"]
        await register(kind="agent", name="field-agent", content={
            "systemPrompt": "Help.", "tools": ["read_file", *refs], "sandbox": "resource://sandboxes/tight"},
            dependencies=[*refs, "resource://sandboxes/tight"])

        built = await http.post("/v1/images", json={"containerId": "c-rt", "agent": "resource://agents/field-agent"})
        assert built.status_code == 201, built.text
        image = built.json()
        assert image["tools"] == ["read_file", "bash"] and image["mcpServers"] == ["echo"]
        assert image["pins"] == {"resource://agents/field-agent": "1.0.0", "resource://tools/shell": "1.0.0",
                                 "resource://tools/weather": "1.0.0", "resource://tools/echo": "1.0.0",
                                 "resource://sandboxes/tight": "1.0.0"}
        assert image["sources"]["sandbox"] == "resource://sandboxes/tight@1.0.0"
        stored = await srv.runtime.store.get_image("local", image["imageId"])
        assert stored is not None and stored.config["sandbox"] == {"limits": {"timeoutS": 1}}
        assert [h["name"] for h in stored.config["httpTools"]] == ["weather"]

        # the HTTP tool runs in the function tier (no container), with the pinned URL. (An image
        # with a stdio MCP server starts its turns in the container tier until its tools are listed.)
        refs = ["resource://tools/shell", "resource://tools/weather"]
        await register(kind="agent", name="weather-agent", content={
            "tools": refs, "sandbox": "resource://sandboxes/tight@1.0.0"}, dependencies=refs)
        image_id = (await ws.new_image("c-rt", agent="resource://agents/weather-agent"))["imageId"]
        events = await ws.turn(image_id, "weather in Bergen?")
        [result] = [e["data"] for e in events if e["type"] == "tool_result"]
        assert (result["result"], result["isError"]) == ("sunny in Bergen", False)
        assert events[-1]["data"]["tier"] == "function" and srv.runtime.container_tier.dispatches == 0

        # the sandbox's 1 s limit holds for the image's bash, below the deployment's 30 s
        events = await ws.turn(image_id, "slow please", timeout=20)
        [result] = [e["data"] for e in events if e["type"] == "tool_result"]
        assert "[killed: the command ran longer than 1 s]" in result["result"]
        assert "done" not in result["result"]

        # the same tools from the image config directly (AgentX image_create_request)
        direct = await ws.new_image("c-rt", tools=["resource://tools/weather"])
        pinned = await srv.runtime.store.get_image("local", direct["imageId"])
        assert pinned is not None and pinned.config["pins"] == {"resource://tools/weather": "1.0.0"}
        unknown = await ws.request("image_create_request", {"containerId": "c-rt", "config": {"tools": ["rm"]}})
        assert unknown["data"]["error"] == (
            "image_create_request: data.config.tools: unknown tool 'rm' (built-in: bash, read_file, "
            "write_file, edit_file, list_files; or resource://tools/<name>[@spec])")
        wrong = await ws.request("image_create_request", {"containerId": "c-rt",
                                                          "config": {"tools": ["resource://tools/nope"]}})
        assert wrong["data"]["error"] == "resource://tools/nope: no resource"


async def test_http_tools_refuse_private_addresses_in_a_turn_by_default(tmp_path: Path, endpoint: str) -> None:
    driver = ScriptedDriver(parse_script(SCRIPT))
    async with in_process(tmp_path / "data", driver=driver) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http, StockClient(srv.url) as ws:
        await http.post("/v1/resources", json={"kind": "tool", "name": "weather", "version": "1.0.0", "content": {
            "type": "http", "url": f"{endpoint}/weather", "description": "Weather of a city",
            "inputSchema": {"type": "object"}}})
        image = await ws.new_image("c-pub", tools=["resource://tools/weather"])
        events = await ws.turn(image["imageId"], "weather in Bergen?")
        [result] = [e["data"] for e in events if e["type"] == "tool_result"]
        assert result["isError"] is True
        assert result["result"] == "weather: refused: 127.0.0.1 resolves to 127.0.0.1, which is not a public address"
        assert _Endpoint.seen == []
