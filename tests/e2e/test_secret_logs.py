"""No log line of a real `avm serve` holds a secret of an MCP server's config or of a client's URL,
whoever writes it (issue 15, point 12): httpx logs every request's full URL at INFO, uvicorn logs a
WebSocket's path with its query string; the server turns those loggers down and redacts query
credentials, credential headers and the MCP servers' configured values from every line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.fakes.fake_anthropic import FakeAnthropic, Reply, Text, ToolUse
from tests.support.servers import serve, stop_serve
from tests.support.stock_client import StockClient
from tests.tools.test_mcp import EchoOverHttp

pytestmark = pytest.mark.e2e

URL_TOKEN = "PLANTEDqueryT0ken4242"
HEADER_KEY = "PLANTEDheaderK3y4242"
WS_TOKEN = "PLANTEDwsT0ken4242"


async def test_planted_tokens_never_reach_the_logs(tmp_path: Path) -> None:
    http = EchoOverHttp("http")
    async with http as mcp_url:
        with FakeAnthropic() as fake:
            fake.enqueue(Reply(blocks=(ToolUse("toolu_1", "mcp__web__echo", {"text": "over http"}),),
                               stop_reason="tool_use"),
                         Reply(blocks=(ToolUse("toolu_2", "mcp__web__header", {"name": "x-api-key"}),),
                               stop_reason="tool_use"),
                         Reply(blocks=(Text("Done."),)))
            env = {"LLM_API_KEY": "sk-x", "AVM_LLM_BASE_URL": fake.base_url, "AVM_LOG_LEVEL": "DEBUG"}
            data = tmp_path / "data"
            with serve(data, env=env, timeout=90) as srv:
                # a client's credential in the upgrade URL (the open local mode ignores it)
                async with StockClient(f"{srv.url}?token={WS_TOKEN}") as c:
                    image = await c.new_image("c1", mcpServers={"web": {
                        "type": "http", "url": f"{mcp_url}?token={URL_TOKEN}", "headers": {"X-Api-Key": HEADER_KEY}}})
                    events = await c.turn(image["imageId"], "call it", timeout=30)
                await asyncio.to_thread(stop_serve, srv)  # the MCP server in this loop answers its goodbye
                output = srv.log()
    results = [e["data"] for e in events if e["type"] == "tool_result"]
    # the server did use the secrets: the call went through with the URL and the header
    assert [(r["isError"], r["result"]) for r in results] == [(False, "echo: over http"), (False, HEADER_KEY)]
    log_file = (data / "logs" / "avm.log").read_text()
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert any(e.get("msg") == "mcp server started" for e in lines), output  # the MCP server's lines are there
    assert any(e.get("msg") == "turn finished" for e in lines)
    for text in (output, log_file):
        for planted in (URL_TOKEN, HEADER_KEY, WS_TOKEN):
            assert planted not in text, [line for line in text.splitlines() if planted in line]
