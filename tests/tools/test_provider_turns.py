"""The same tool-using agent turn on `avm serve` through each upstream driver, each against a fake
speaking its provider's real wire format (Anthropic Messages SSE, OpenAI Chat Completions SSE, Bedrock
ConverseStream event stream): the protocol events a client sees are the same, the tool results go
back to the model in each provider's shape, and each call's usage reaches the ledger under the
driver's provider name."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import botocore.session
import pytest

from agentvm.domain.models import Usage
from agentvm.ids import now_ms
from agentvm.ports import Driver
from tests.aws_fixtures import aws_env  # noqa: F401  (a fixture)
from tests.fakes import fake_bedrock as br
from tests.fakes import fake_openai as oa
from tests.fakes.fake_anthropic import FakeAnthropic, FakeUsage, Reply, Text, ToolUse
from tests.fakes.http_stub import StubServer
from tests.support.servers import in_process
from tests.support.stock_client import StockClient

WRITE = {"path": "projects/notes.txt", "content": "hi from the model\n"}
READ = {"path": "projects/notes.txt"}
WRITE_PIECES = ['{"path": "projects/notes.txt", ', '"content": "hi from', ' the model\\n"}']
READ_PIECES = ['{"path": ', '"projects/notes.txt"}']
USAGES = [Usage(120, 30), Usage(160, 12), Usage(190, 8)]


def _anthropic_replies() -> list[Reply]:
    return [
        Reply([Text(["Let me write it."]), ToolUse("call_w", "write_file", WRITE, partial_json=WRITE_PIECES)],
              stop_reason="tool_use", usage=FakeUsage(120, 30)),
        Reply([ToolUse("call_r", "read_file", READ, partial_json=READ_PIECES)], stop_reason="tool_use",
              usage=FakeUsage(160, 12)),
        Reply([Text(["The file ", "says hi."])], usage=FakeUsage(190, 8)),
    ]


def _openai_replies() -> list[Any]:
    return [
        oa.stream([oa.role_chunk(), *oa.text_chunks(["Let me write it."]),
                   *oa.tool_call_chunks(0, "call_w", "write_file", WRITE_PIECES), oa.finish_chunk("tool_calls"),
                   oa.usage_chunk(120, 30)]),
        oa.stream([*oa.tool_call_chunks(0, "call_r", "read_file", READ_PIECES), oa.finish_chunk("tool_calls"),
                   oa.usage_chunk(160, 12)]),
        oa.text_reply(["The file ", "says hi."], prompt=190, completion=8),
    ]


def _bedrock_replies() -> list[Any]:
    return [
        br.stream([br.message_start(), *br.text(0, ["Let me write it."]),
                   *br.tool_use(1, "call_w", "write_file", WRITE_PIECES), br.message_stop("tool_use"),
                   br.metadata(120, 30)]),
        br.stream([br.message_start(), *br.tool_use(0, "call_r", "read_file", READ_PIECES),
                   br.message_stop("tool_use"), br.metadata(160, 12)]),
        br.text_reply(["The file ", "says hi."], input_tokens=190, output_tokens=8),
    ]


@pytest.fixture
def upstream(request: pytest.FixtureRequest, aws_env: None  # noqa: F811  (the fixture imported above)
             ) -> Iterator[tuple[str, Driver, Callable[[], list[Any]]]]:
    """(provider, its driver, the requests its fake received as JSON bodies), with the turn's three
    replies queued."""
    kind = request.param
    if kind == "anthropic":
        from agentvm.drivers.anthropic_lite import AnthropicLiteDriver

        with FakeAnthropic() as fake:
            fake.enqueue(*_anthropic_replies())
            yield kind, AnthropicLiteDriver("sk-ant-k", base_url=fake.base_url, max_retries=0), \
                lambda: [r.body for r in fake.requests]
        return
    with StubServer() as server:
        driver: Driver
        if kind == "openai":
            from agentvm.drivers.openai_compat import OpenAICompatDriver

            server.enqueue(*_openai_replies())
            driver = OpenAICompatDriver("sk-proj-k", base_url=server.base_url + "/v1", max_retries=0)
        else:
            from agentvm.drivers.bedrock_converse import BedrockConverseDriver

            server.enqueue(*_bedrock_replies())
            driver = BedrockConverseDriver(region="us-east-1", endpoint_url=server.base_url, max_retries=0,
                                           session=botocore.session.Session())
        yield kind, driver, lambda: [r.json for r in server.requests]


async def _run_turn(tmp_path: Path, driver: Driver) -> tuple[list[dict[str, Any]], list[Any]]:
    async with in_process(tmp_path / "data", driver=driver) as srv, StockClient(srv.url) as client:
        image = await client.new_image("c-up", tools=["read_file", "write_file"])
        start = len(client.events)
        await client.turn(image["imageId"], "write then read the notes")
        got = [e for e in client.events[start:]
               if "seq" in e and e["type"] not in ("message_persisted", "user_message")]
        meter = srv.runtime.services.deps.meter
        assert meter is not None
        records = await meter.ledger.list_usage("local", since_ms=now_ms() - 86_400_000, until_ms=now_ms() + 1)
    aclose = getattr(driver, "aclose", None)
    if aclose is not None:
        await aclose()
    return got, sorted((r for r in records if "#llm#" in r.record_id), key=lambda r: r.record_id)


def _comparable(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Each event's type, and its data where it does not name a generated id or a time."""
    keep = {"text_delta", "input_json_delta", "tool_use_start", "tool_use_stop", "tool_executing", "tool_result",
            "message_stop", "conversation_end"}
    return [(e["type"], e["data"] if e["type"] in keep else None) for e in events]


def _call(call_id: str, name: str, tool_input: dict[str, str], pieces: list[str], result: str,
          text: str | None = None) -> list[tuple[str, Any]]:
    """One model call planning one tool after optional text, then the tool's run (docs/protocol.md)."""
    head: list[tuple[str, Any]] = [("message_start", None), ("conversation_start", None)]
    if text is not None:
        head += [("text_delta", {"text": text}), ("conversation_responding", None)]
    return [*head, ("tool_use_start", {"toolCallId": call_id, "toolName": name}), ("tool_planned", None),
            *[("input_json_delta", {"partialJson": p}) for p in pieces],
            ("tool_use_stop", {"toolCallId": call_id, "toolName": name, "input": tool_input}),
            ("tool_call_message", None), ("message_stop", {"stopReason": "tool_use"}),
            *([("assistant_message", None)] if text is not None else []),
            ("tool_executing", {"toolId": call_id, "toolName": name, "input": tool_input}),
            ("tool_result", {"toolCallId": call_id, "result": result, "isError": False}),
            ("tool_result_message", None)]


EXPECTED = [
    *_call("call_w", "write_file", WRITE, WRITE_PIECES, "Wrote 18 bytes to projects/notes.txt", "Let me write it."),
    *_call("call_r", "read_file", READ, READ_PIECES, WRITE["content"]),
    ("message_start", None), ("conversation_start", None), ("text_delta", {"text": "The file "}),
    ("conversation_responding", None), ("text_delta", {"text": "says hi."}),
    ("message_stop", {"stopReason": "end_turn"}), ("assistant_message", None),
    ("conversation_end", {"reason": "completed"}), ("turn_response", None),
]


@pytest.mark.parametrize("upstream", ["anthropic", "openai", "bedrock"], indirect=True)
async def test_a_tool_turn_through_each_provider(tmp_path: Path,
                                                 upstream: tuple[str, Driver, Callable[[], list[Any]]]) -> None:
    kind, driver, sent = upstream
    got, records = await _run_turn(tmp_path, driver)

    types = [e["type"] for e in got]
    assert types.count("tool_use_stop") == 2 and types.count("tool_result") == 2
    assert types[-4:] == ["message_stop", "assistant_message", "conversation_end", "turn_response"]
    stops = [e["data"] for e in got if e["type"] == "tool_use_stop"]
    assert stops == [{"toolCallId": "call_w", "toolName": "write_file", "input": WRITE},
                     {"toolCallId": "call_r", "toolName": "read_file", "input": READ}]
    assert [e["data"]["partialJson"] for e in got if e["type"] == "input_json_delta"] == WRITE_PIECES + READ_PIECES
    results = [e["data"] for e in got if e["type"] == "tool_result"]
    assert [r["isError"] for r in results] == [False, False]
    assert results[1]["result"] == WRITE["content"]
    assert got[-1]["data"]["status"] == "completed"
    assert (tmp_path / "data" / "containers" / "c-up" / "workspace" / "projects" / "notes.txt").read_text() == \
        WRITE["content"]
    # every provider's turn reaches the client as the same protocol events
    assert _comparable(got) == EXPECTED

    # one ledger record per call, under the driver's provider, with the usage the upstream reported
    assert [(r.provider, r.usage, r.status) for r in records] == [(kind, u, "completed") for u in USAGES]
    assert got[-1]["data"]["usage"] == sum(USAGES, Usage()).to_wire()

    # the tool results went back in the provider's own shape, with the call ids
    bodies = sent()
    assert len(bodies) == 3
    last = bodies[2]
    if kind == "anthropic":
        assert last["messages"][-1]["content"][0] == {"type": "tool_result", "tool_use_id": "call_r",
                                                      "content": WRITE["content"], "is_error": False}
    elif kind == "openai":
        assert [m["role"] for m in last["messages"]] == ["user", "assistant", "tool", "assistant", "tool"]
        assert last["messages"][1]["tool_calls"][0]["function"] == {"name": "write_file",
                                                                    "arguments": json.dumps(WRITE)}
        assert last["messages"][-1] == {"role": "tool", "tool_call_id": "call_r", "content": WRITE["content"]}
        assert [t["function"]["name"] for t in last["tools"]] == ["read_file", "write_file"]
    else:
        assert [m["role"] for m in last["messages"]] == ["user", "assistant", "user", "assistant", "user"]
        assert last["messages"][-1]["content"] == [{"toolResult": {
            "toolUseId": "call_r", "content": [{"text": WRITE["content"]}], "status": "success"}}]
        assert [t["toolSpec"]["name"] for t in last["toolConfig"]["tools"]] == ["read_file", "write_file"]


@pytest.mark.parametrize("kind", ["openai", "bedrock"])
async def test_a_stream_that_breaks_bills_the_output_streamed(tmp_path: Path, kind: str,
                                                               aws_env: None) -> None:  # noqa: F811
    """Cut after "Hello there" (11 bytes): the call is billed that output, estimated (docs/billing.md).
    These providers report usage only at the end of the stream, so no input count exists yet (Anthropic
    reports its input in message_start): the upstream read the input, so the record bills the request's
    input bound, the hold's own estimate (drivers/token_bounds.worst_input_tokens), never 0."""
    with StubServer() as server:
        driver: Driver
        if kind == "openai":
            from agentvm.drivers.openai_compat import OpenAICompatDriver

            server.enqueue(oa.stream([oa.role_chunk(), *oa.text_chunks(["Hello", " there"])], done=False, cut=True))
            driver = OpenAICompatDriver("sk-proj-k", base_url=server.base_url, max_retries=0)
        else:
            from agentvm.drivers.bedrock_converse import BedrockConverseDriver

            server.enqueue(br.stream([br.message_start(), *br.text(0, ["Hello", " there"])[:2]], cut=True))
            driver = BedrockConverseDriver(region="us-east-1", endpoint_url=server.base_url, max_retries=0,
                                           session=botocore.session.Session())
        async with in_process(tmp_path / "data", driver=driver) as srv, StockClient(srv.url) as client:
            image = await client.new_image("c-cut")
            events = await client.turn(image["imageId"], "hello")
            meter = srv.runtime.services.deps.meter
            assert meter is not None
            records = await meter.ledger.list_usage("local", since_ms=now_ms() - 86_400_000, until_ms=now_ms() + 1)
        aclose = getattr(driver, "aclose", None)
        if aclose is not None:
            await aclose()

    errors = [e["data"] for e in events if e["type"] == "error_occurred"]
    assert errors and errors[0]["code"] == "connection_error", events
    [record] = [r for r in records if "#llm#" in r.record_id]
    # 72: the turn's request (the default system prompt and "hello", no tools) at a token per byte
    assert (record.provider, record.usage, record.estimated, record.status) == (
        kind, Usage(72, len("Hello there")), True, "failed")
