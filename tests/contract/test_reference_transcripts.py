"""Event order of text, tool and error turns against the recorded reference traffic
(`tests/fixtures/agentx_transcripts/`, copied from the design material), with AgentVM's
documented fixes applied to the reference (docs/protocol.md, "Differences from the reference")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.stock_client import StockClient

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "agentx_transcripts"


def reference_events(name: str) -> list[dict[str, Any]]:
    """Server→client events of a transcript from the message_send_request on."""
    lines = [json.loads(line) for line in (TRANSCRIPTS / name).read_text().splitlines() if line.strip()]
    out: list[dict[str, Any]] = []
    started = False
    for rec in lines:
        if rec.get("dir") == "out" and rec["frame"].get("type") == "message_send_request":
            started = True
        elif rec.get("dir") == "in" and started:
            out.append(rec["ev"])
    return out


def apply_documented_fixes(ref: list[str]) -> list[str]:
    """The reference order turned into AgentVM's order by the fixes listed in docs/protocol.md."""
    out: list[str] = []
    responding_sent = False
    pending_executing = 0
    for t in ref:
        if t in ("text_content_block_start", "text_content_block_stop"):
            continue  # fix: no pass-through block events (no client uses them; frames cost money)
        if t == "message_start":
            responding_sent = False
        if t == "conversation_responding":
            if responding_sent:
                continue  # fix: once per LLM message
            responding_sent = True
        if t == "tool_executing":
            pending_executing += 1  # fix: sent when the tool runs, with its input
            continue
        if t == "tool_result" and pending_executing:
            out.append("tool_executing")
            pending_executing -= 1
        out.append(t)
        if t in ("conversation_end", "error_occurred"):
            out.append("turn_response")  # extension: usage and cost at the end of every turn
    return out


@pytest.mark.parametrize(("transcript", "content"), [
    ("ref-text-turn.jsonl", "Hello!"),
    ("ref-tool-turn.jsonl", "tool turn"),
    ("ref-error-turn.jsonl", "error turn"),
])
async def test_turn_event_order_matches_reference(client: StockClient, transcript: str, content: str) -> None:
    image = await client.new_image("probe-c", name="Probe", systemPrompt="be brief")
    start = len(client.events)
    await client.request("message_send_request", {"imageId": image["imageId"], "content": content})
    await client.wait_type("turn_response", start=start)
    expected = apply_documented_fixes([e["type"] for e in reference_events(transcript)])
    assert client.types(start) == expected


async def test_text_turn_data_matches_reference(client: StockClient) -> None:
    image = await client.new_image("probe-c", name="Probe", systemPrompt="be brief")
    events = await client.turn(image["imageId"], "Hello!")
    by_type = {e["type"]: e for e in events}
    ref = {e["type"]: e for e in reference_events("ref-text-turn.jsonl")}
    for t in ("message_start", "conversation_start", "message_stop", "conversation_end"):
        assert by_type[t]["data"] == ref[t]["data"], t
        assert (by_type[t]["source"], by_type[t]["category"], by_type[t]["intent"]) == (
            ref[t]["source"], ref[t]["category"], ref[t]["intent"])
    deltas = [e["data"]["text"] for e in events if e["type"] == "text_delta"]
    assert deltas == ["Hello", " there"]
    am = by_type["assistant_message"]
    assert am["data"]["content"] == ref["assistant_message"]["data"]["content"]
    assert am["data"]["content"][0]["text"] == "".join(deltas)
    assert am["data"]["id"] == "msg_01TEXT" and am["data"]["role"] == "assistant"
    # Full context on every session event; seq strictly increasing.
    for e in events:
        assert set(e["context"]) == {"containerId", "imageId", "agentId", "sessionId"}
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_tool_turn_data_matches_reference_with_real_ids(client: StockClient) -> None:
    image = await client.new_image("probe-c", name="Probe")
    events = await client.turn(image["imageId"], "tool turn")
    get = {e["type"]: e["data"] for e in events}
    assert get["tool_use_start"] == {"toolCallId": "toolu_01", "toolName": "Bash"}
    assert get["tool_planned"] == {"toolId": "toolu_01", "toolName": "Bash"}
    # fixes: real ids and input on tool_use_stop and tool_executing
    assert get["tool_use_stop"] == {"toolCallId": "toolu_01", "toolName": "Bash", "input": {"command": "ls"}}
    assert get["tool_executing"] == {"toolId": "toolu_01", "toolName": "Bash", "input": {"command": "ls"}}
    assert "".join(e["data"]["partialJson"] for e in events if e["type"] == "input_json_delta") == \
        '{"command":"ls"}'
    call = get["tool_call_message"]
    assert call["toolCall"] == {"type": "tool-call", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}}
    assert call["parentId"] == "msg_01A" and call["subtype"] == "tool-call"
    assert get["tool_result"] == {"toolCallId": "toolu_01", "result": "a.txt\nb.txt", "isError": False}
    assert get["tool_result_message"]["toolResult"] == {
        "type": "tool-result", "id": "toolu_01", "name": "Bash", "output": {"type": "text", "value": "a.txt\nb.txt"}}
    stops = [e["data"] for e in events if e["type"] == "message_stop"]
    assert stops == [{"stopReason": "tool_use"}, {"stopReason": "end_turn"}]
    assert [e["data"]["content"][0]["text"] for e in events if e["type"] == "assistant_message"] == [
        "Let me check.", "Two files."]
    tr = get["turn_response"]
    assert tr["usage"] == {"inputTokens": 240, "outputTokens": 25, "cacheReadTokens": 80, "cacheWriteTokens": 0}
    assert tr["status"] == "completed" and tr["tier"] == "function" and tr["model"] == "claude-x"
    # an unknown model is priced like the most expensive family (15/75/1.50 per million): never under-bill
    # (240 × 15 + 25 × 75 + 80 × 1.50) / 1e6 = 0.005595; billed × 1.05
    assert tr["cost"] == {"list": "0.00559500", "billed": "0.00587475", "currency": "USD"}


async def test_error_turn_data_matches_reference(client: StockClient) -> None:
    image = await client.new_image("probe-c", name="Probe")
    events = await client.turn(image["imageId"], "error turn")
    ref = {e["type"]: e["data"] for e in reference_events("ref-error-turn.jsonl")}
    get = {e["type"]: e["data"] for e in events}
    assert get["error_received"] == ref["error_received"]
    assert get["error_occurred"] == ref["error_occurred"]
    assert {k: v for k, v in get["error_message"].items() if k not in ("id", "timestamp")} == \
        {k: v for k, v in ref["error_message"].items() if k not in ("id", "timestamp")}
    assert get["turn_response"]["status"] == "failed"
    assert "conversation_end" not in get
