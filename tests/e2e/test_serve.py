"""End to end: a real `avm serve` process, real WebSocket clients that behave like the stock one."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentvm import __version__
from tests.fakes.fake_anthropic import FakeAnthropic, FakeUsage, Reply, Text, ToolUse
from tests.support.raw_ws import client_frame, open_raw, read_until_close
from tests.support.servers import REPO, serve, stop_serve
from tests.support.stock_client import StockClient

pytestmark = pytest.mark.e2e


def logs(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


async def test_health_and_the_stock_client_flow(tmp_path: Path) -> None:
    with serve(tmp_path / "data") as srv:
        async with httpx.AsyncClient() as http:
            health = await http.get(f"{srv.http}/health", timeout=5)
        assert health.status_code == 200 and health.json() == {"status": "ok", "version": __version__, "auth": "open"}
        for path in ("/ws", "/"):
            async with StockClient(f"ws://127.0.0.1:{srv.port}{path}") as c:
                await c.request("container_create_request", {"containerId": "user-alice"})
                res = await c.request("image_create_request", {"containerId": "user-alice",
                                                               "config": {"name": "My Assistant",
                                                                          "systemPrompt": "be brief"}})
                image = res["data"]["record"]
                assert c.subscribed == [image["sessionId"]]  # from __subscriptions
                start = len(c.events)
                await c.request("message_send_request", {"imageId": image["imageId"], "content": "Hello!"})
                end = await c.wait_type("conversation_end", start=start)
                deltas = [e["data"]["text"] for e in c.events[start:] if e["type"] == "text_delta"]
                assistant = next(e for e in c.events[start:] if e["type"] == "assistant_message")
                assert "".join(deltas) == "You said: Hello!" and len(deltas) > 1
                assert assistant["data"]["content"][0]["text"] == "".join(deltas)
                assert end["data"] == {"reason": "completed"}
                assert c.acks_sent == len(c.raw)  # every frame came wrapped and was ACKed
        # a text frame that is not UTF-8 closes its connection (1007), logged as one line
        sock = await open_raw(srv.port)
        try:
            await asyncio.get_running_loop().sock_sendall(sock, client_frame(b"\xff\xfe{}"))
            assert (await read_until_close(sock, 10))[1] == 1007
        finally:
            sock.close()
        stop_serve(srv)
        entries = logs(srv.log())
    (bad_frame,) = [e for e in entries if e["msg"] == "Invalid UTF-8 sequence received from client."]
    assert bad_frame["level"] == "INFO" and "exc" not in bad_frame and "Traceback" not in srv.log()
    banner = next(e for e in entries if e.get("event") == "startup")
    assert banner["driver"] == "scripted" and "offline" in str(banner["msg"]) and banner["port"] == srv.port
    turns = [e for e in entries if e.get("msg") == "turn finished"]
    assert len(turns) == 2 and all(str(t["turn_id"]).startswith("turn_") for t in turns)
    assert all(e["level"] in {"INFO", "WARNING", "DEBUG"} for e in entries)  # no errors logged


async def test_restart_keeps_history_and_the_llm_context_continues(tmp_path: Path) -> None:
    """The real anthropic SDK against the fake Anthropic endpoint, across a restart."""
    data = tmp_path / "data"
    with FakeAnthropic(api_key="sk-test-123") as fake:
        env = {"LLM_API_KEY": "sk-test-123", "AVM_LLM_BASE_URL": fake.base_url, "AVM_LLM_MODEL": "claude-test-1"}
        fake.enqueue(Reply(blocks=(Text(["Nice to ", "meet you."]),), usage=FakeUsage(30, 6)))
        with serve(data, env=env) as srv:
            async with StockClient(srv.url) as c:
                image = await c.new_image("c1", name="Kept", systemPrompt="be brief")
                first = await c.turn(image["imageId"], "I am Ada.")
        assert "Nice to meet you." in json.dumps(first)
        tr = next(e for e in first if e["type"] == "turn_response")["data"]
        assert tr["usage"]["inputTokens"] == 30 and tr["usage"]["outputTokens"] == 6
        assert tr["model"] == "claude-test-1" and tr["cost"]["currency"] == "USD"

        fake.enqueue(Reply(blocks=(Text("You are Ada."),)))
        with serve(data, env=env) as srv:
            async with StockClient(srv.url) as c:
                got = (await c.request("image_get_request", {"imageId": image["imageId"]}))["data"]["record"]
                assert got["name"] == "Kept"
                await c.turn(image["imageId"], "Who am I?")
                history = (await c.request("image_messages_request",
                                           {"imageId": image["imageId"]}))["data"]["messages"]
            log_text = srv.log()
        sent = fake.requests[-1].body
        assert sent["model"] == "claude-test-1" and sent["system"] == "be brief"
        assert sent["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "I am Ada."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Nice to meet you."}]},
            {"role": "user", "content": [{"type": "text", "text": "Who am I?"}]}]
        assert [m["subtype"] for m in history] == ["user", "assistant", "user", "assistant"]
        assert "sk-test-123" not in log_text


async def test_tool_use_through_the_real_sdk(tmp_path: Path) -> None:
    with FakeAnthropic() as fake:
        env = {"LLM_API_KEY": "sk-x", "AVM_LLM_BASE_URL": fake.base_url}
        fake.enqueue(Reply(blocks=(Text("Checking."), ToolUse("toolu_9", "lookup", {"q": "weather"}, chunks=3)),
                           stop_reason="tool_use"),
                     Reply(blocks=(Text("Could not look it up."),)))
        with serve(tmp_path / "data", env=env) as srv:
            async with StockClient(srv.url) as c:
                image = await c.new_image("c1")
                events = await c.turn(image["imageId"], "weather?")
    get = {e["type"]: e["data"] for e in events}
    assert get["tool_use_stop"] == {"toolCallId": "toolu_9", "toolName": "lookup", "input": {"q": "weather"}}
    assert "".join(e["data"]["partialJson"] for e in events if e["type"] == "input_json_delta") == \
        '{"q": "weather"}'
    assert get["tool_result"]["isError"] is True
    second = fake.requests[1].body["messages"]
    assert second[1]["content"][1] == {"type": "tool_use", "id": "toolu_9", "name": "lookup",
                                       "input": {"q": "weather"}}
    assert second[2]["content"][0]["tool_use_id"] == "toolu_9"


async def test_two_hundred_concurrent_connections_each_run_a_turn(tmp_path: Path) -> None:
    with serve(tmp_path / "data") as srv:
        async def one(i: int) -> str:
            async with StockClient(srv.url) as c:
                image = await c.new_image(f"user-{i}")
                events = await c.turn(image["imageId"], f"message {i}", timeout=60)
                assert [e["type"] for e in events][-2:] == ["conversation_end", "turn_response"]
                assert not [e for e in c.events if e["type"] in ("system_error", "error_occurred")]
                return "".join(e["data"]["text"] for e in events if e["type"] == "text_delta")
        texts = await asyncio.gather(*(one(i) for i in range(200)))
        async with httpx.AsyncClient() as http:
            listed = (await http.get(f"{srv.http}/health", timeout=5)).json()
    assert texts == [f"You said: message {i}" for i in range(200)]
    assert listed["status"] == "ok"


def test_public_address_is_refused_without_keys(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "avm.cli", "serve", "--host", "0.0.0.0", "--data-dir",
                          str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 2
    assert "refusing to listen on 0.0.0.0" in out.stderr and "API keys" in out.stderr


def test_bad_settings_are_reported_without_a_traceback(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "avm.cli", "serve", "--port", "70000", "--data-dir",
                          str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 2
    assert out.stderr == "avm serve: --port 70000: must be a whole number from 0 to 65535 (0 picks a free port)\n"
