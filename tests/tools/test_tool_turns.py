"""Tool-using turns on `avm serve`: the scripted model calls the built-in tools, the engine runs them in
the container's workspace, and the events follow the spec's tool order (docs/protocol.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentvm.drivers.scripted import ScriptedDriver, parse_script
from tests.support.servers import in_process
from tests.support.stock_client import StockClient

SCRIPT = """
rules:
  - match: "^use the tools"
    responses:
      - text: ["Let me look."]
        tool_calls: [{id: toolu_ls, name: bash, input: {command: "ls"}}]
      - tool_calls: [{id: toolu_write, name: write_file,
                      input: {path: projects/notes.txt, content: "hello from the agent\\n"}}]
      - tool_calls: [{id: toolu_read, name: read_file, input: {path: projects/notes.txt}}]
      - text: ["The file ", "says hello."]
  - match: "^escape"
    responses:
      - tool_calls: [{id: toolu_x, name: read_file, input: {path: ../../agentvm.db}}]
      - text: ["Refused."]
"""

# one LLM call that plans a tool: its events, then the tool's (spec §3.9 B, docs/protocol.md)
CALL = ["message_start", "conversation_start", "tool_use_start", "tool_planned", "input_json_delta",
        "input_json_delta", "tool_use_stop", "tool_call_message", "message_stop"]
RUN = ["tool_executing", "tool_result", "tool_result_message"]


def tool_turn_types(text_first: bool) -> list[str]:
    first = ["message_start", "conversation_start", "text_delta", "conversation_responding", *CALL[2:],
             "assistant_message"] if text_first else CALL
    final = ["message_start", "conversation_start", "text_delta", "conversation_responding", "text_delta",
             "message_stop", "assistant_message"]
    return [*first, *RUN, *CALL, *RUN, *CALL, *RUN, *final, "conversation_end", "turn_response"]


@pytest.fixture
def driver() -> ScriptedDriver:
    return ScriptedDriver(parse_script(SCRIPT))


def session_events(client: StockClient, start: int) -> list[dict[str, Any]]:
    return [e for e in client.events[start:] if "seq" in e and e["type"] not in ("message_persisted", "user_message")]


async def test_bash_write_read_turn_runs_in_the_containers_workspace(tmp_path: Path, driver: ScriptedDriver) -> None:
    data = tmp_path / "data"
    async with in_process(data, driver=driver) as srv, StockClient(srv.url) as client:
        image = await client.new_image("c-tools", tools=["bash", "read_file", "write_file"])
        other = await client.new_image("c-other", tools=["bash"])
        start = len(client.events)
        events = await client.turn(image["imageId"], "use the tools please")
        got = session_events(client, start)
        assert [e["type"] for e in got] == tool_turn_types(text_first=True)
        results = {e["data"]["toolCallId"]: e["data"] for e in got if e["type"] == "tool_result"}
        assert results["toolu_ls"]["isError"] is False
        assert results["toolu_ls"]["result"].split("\n")[1:] == ["output", "projects", "temp"]
        assert results["toolu_write"]["result"] == "Wrote 21 bytes to projects/notes.txt"
        assert results["toolu_read"]["result"] == "hello from the agent\n"
        executing = [e["data"] for e in got if e["type"] == "tool_executing"]
        assert executing[1]["input"] == {"path": "projects/notes.txt", "content": "hello from the agent\n"}
        # the answer streams after the last tool result
        last_result = max(i for i, e in enumerate(got) if e["type"] == "tool_result")
        assert [e["data"]["text"] for e in got[last_result:] if e["type"] == "text_delta"] == ["The file ",
                                                                                             "says hello."]
        assert events[-1]["data"]["status"] == "completed"
        # the file is in that container's workspace only
        workspace = data / "containers" / "c-tools" / "workspace"
        assert (workspace / "projects" / "notes.txt").read_text() == "hello from the agent\n"
        assert not (data / "containers" / "c-other" / "workspace" / "projects" / "notes.txt").exists()
        assert other["imageId"] != image["imageId"]
        # the stored history holds the calls and results in order, once each
        history = (await client.request("image_messages_request", {"imageId": image["imageId"]}))["data"]["messages"]
        kinds = [m["subtype"] for m in history]
        # as the events came: the call is stored when planned, the text when its message closes
        assert kinds == ["user", "tool-call", "assistant", "tool-result", "tool-call", "tool-result", "tool-call",
                         "tool-result", "assistant"]


async def test_a_path_out_of_the_workspace_is_an_error_result_and_the_turn_goes_on(
        tmp_path: Path, driver: ScriptedDriver) -> None:
    async with in_process(tmp_path / "data", driver=driver) as srv, StockClient(srv.url) as client:
        image = await client.new_image("c-escape", tools=["read_file"])
        start = len(client.events)
        await client.turn(image["imageId"], "escape now")
        [result] = [e["data"] for e in session_events(client, start) if e["type"] == "tool_result"]
        assert result["isError"] is True
        assert "'..' leaves the workspace" in result["result"]
        assert "sqlite" not in result["result"].lower()


async def test_an_image_without_tools_offers_none_to_the_model(tmp_path: Path) -> None:
    from tests.support.scripts import RecordingDriver

    recorder = RecordingDriver(ScriptedDriver(parse_script(SCRIPT)))
    async with in_process(tmp_path / "data", driver=recorder) as srv, StockClient(srv.url) as client:
        plain = await client.new_image("c-plain")
        await client.turn(plain["imageId"], "hello")
        assert not (tmp_path / "data" / "containers" / "c-plain").exists()  # no tools: no workspace
        tooled = await client.new_image("c-plain", tools=["bash"])
        await client.turn(tooled["imageId"], "hello")
    assert recorder.requests[0].tools == []
    assert [t["name"] for t in recorder.requests[1].tools] == ["bash"]
    assert recorder.requests[1].tools[0]["input_schema"]["required"] == ["command"]


async def test_the_same_turn_through_the_anthropic_sdk_against_the_fake_endpoint(tmp_path: Path) -> None:
    from agentvm.drivers.anthropic_sdk import AnthropicDriver
    from tests.fakes.fake_anthropic import FakeAnthropic, Reply, Text, ToolUse

    with FakeAnthropic() as fake:
        fake.enqueue(
            Reply([Text(["Let me look."]), ToolUse("toolu_01A", "bash", {"command": "ls"})], stop_reason="tool_use"),
            Reply([ToolUse("toolu_01B", "write_file", {"path": "projects/notes.txt",
                                                       "content": "hello from the agent\n"}, chunks=4)],
                  stop_reason="tool_use"),
            Reply([ToolUse("toolu_01C", "read_file", {"path": "projects/notes.txt"})], stop_reason="tool_use"),
            Reply([Text(["The file ", "says hello."])]))
        driver = AnthropicDriver("sk-ant-test-key", base_url=fake.base_url, max_retries=0)
        async with in_process(tmp_path / "data", driver=driver) as srv, StockClient(srv.url) as client:
            image = await client.new_image("c-sdk", tools=["bash", "read_file", "write_file"])
            start = len(client.events)
            await client.turn(image["imageId"], "use the tools please")
            got = session_events(client, start)
        requests = fake.requests
    types = [e["type"] for e in got]
    # the real API streams each tool input as an empty first delta plus its pieces
    assert types.count("tool_use_stop") == 3 and types.count("tool_result") == 3
    assert types[-4:] == ["message_stop", "assistant_message", "conversation_end", "turn_response"]
    stops = [e["data"] for e in got if e["type"] == "tool_use_stop"]
    assert stops[1] == {"toolCallId": "toolu_01B", "toolName": "write_file",
                        "input": {"path": "projects/notes.txt", "content": "hello from the agent\n"}}
    results = [e["data"] for e in got if e["type"] == "tool_result"]
    assert [r["isError"] for r in results] == [False, False, False]
    assert results[2]["result"] == "hello from the agent\n"
    assert (tmp_path / "data" / "containers" / "c-sdk" / "workspace" / "projects" / "notes.txt").exists()
    # the model got the tools, then each result in the next request, with the tool_use ids
    assert [t["name"] for t in requests[0].body["tools"]] == ["bash", "read_file", "write_file"]
    last = requests[3].body["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert last[-1]["content"][0] == {"type": "tool_result", "tool_use_id": "toolu_01C",
                                      "content": "hello from the agent\n", "is_error": False}
