"""The scheduler on `avm serve`: a turn starts in the function tier and goes to the container tier only
when the model calls a tool that needs a sandbox; the session's seqs stay one gap-free order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from agentvm.drivers.base import ToolOutcome
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from agentvm.engine.runner import fit_result
from tests.support.servers import in_process
from tests.support.stock_client import StockClient

SCRIPT = """
rules:
  - match: "^just chat"
    responses:
      - text: ["Hello ", "there."]
  - match: "^think then list"
    responses:
      - text: ["Looking."]
        tool_calls: [{id: toolu_ls, name: list_files, input: {}}]
      - text: ["Done."]
  - match: "^scripted tool"
    responses:
      - tool_calls: [{id: toolu_s, name: lookup, input: {q: x}, result: "42"}]
      - text: ["It is 42."]
"""


def seqs(client: StockClient, image_id: str) -> list[int]:
    return [e["seq"] for e in client.events if "seq" in e and (e.get("context") or {}).get("imageId") == image_id]


async def test_a_turn_without_tool_calls_never_starts_the_container_tier(tmp_path: Path) -> None:
    driver = ScriptedDriver(parse_script(SCRIPT))
    async with in_process(tmp_path / "data", driver=driver) as srv, StockClient(srv.url) as client:
        tier = srv.runtime.container_tier
        image = await client.new_image("c-chat", tools=["bash", "list_files"])  # tools offered, none called
        events = await client.turn(image["imageId"], "just chat")
        assert events[-1]["data"]["tier"] == "function"
        assert events[-1]["data"]["status"] == "completed"
        # a tool whose result the (scripted) model supplies needs no sandbox either
        events = await client.turn(image["imageId"], "scripted tool")
        assert events[-1]["data"]["tier"] == "function"
        assert tier.dispatches == 0
        assert tier.active == {}
        assert not (tmp_path / "data" / "containers" / "c-chat").exists()  # no workspace was made


async def test_an_escalated_turn_keeps_one_gap_free_seq_order(tmp_path: Path) -> None:
    driver = ScriptedDriver(parse_script(SCRIPT))
    async with in_process(tmp_path / "data", driver=driver) as srv, StockClient(srv.url) as client:
        tier = srv.runtime.container_tier
        image = await client.new_image("c-tools", tools=["list_files"])
        await client.turn(image["imageId"], "just chat")
        events = await client.turn(image["imageId"], "think then list")
        assert tier.dispatches == 1
        assert list(tier.active) == [("local", "c-tools")]
        done = events[-1]["data"]
        assert (done["tier"], done["status"]) == ("container", "completed")
        live = seqs(client, image["imageId"])  # all but its own user_message events
        types = [e["type"] for e in events]
        # the function tier's last events, then the container tier's first, in one order
        at = types.index("tool_use_stop")
        assert types[at:at + 7] == ["tool_use_stop", "tool_call_message", "message_stop", "assistant_message",
                             "tool_executing", "tool_result", "tool_result_message"]
        # the whole log, replayed from the store: both turns, the escalation included, without a gap
        async with StockClient(srv.url) as late:
            await late.send_raw({"type": "subscribe", "sessionId": image["sessionId"], "afterSeq": 0})
            await late.wait_for(lambda e: e.get("seq") == live[-1], 5.0, 0)
            got = seqs(late, image["imageId"])
        assert got == list(range(1, len(got) + 1))
        assert set(live) < set(got)
        history = (await client.request("image_messages_request", {"imageId": image["imageId"]}))["data"]["messages"]
        assert [m["subtype"] for m in history][-4:] == ["tool-call", "assistant", "tool-result", "assistant"]
        # the model saw the call and its result after the hand-off, once each
        second = (await client.turn(image["imageId"], "just chat"))[-1]["data"]
        assert second["tier"] == "function"
        assert tier.dispatches == 1


async def test_without_a_container_tier_a_sandbox_tool_ends_the_turn_with_a_clear_error(tmp_path: Path) -> None:
    driver = ScriptedDriver(parse_script(SCRIPT))
    async with in_process(tmp_path / "data", driver=driver) as srv, StockClient(srv.url) as client:
        deps = srv.runtime.services.deps
        deps.container_tier = None
        deps.sandbox_tools = None
        image = await client.new_image("c-none", tools=["list_files"])
        events = await client.turn(image["imageId"], "think then list")
        types = [e["type"] for e in events]
        assert types[-6:] == ["message_stop", "assistant_message", "error_received", "error_message",
                              "error_occurred", "turn_response"]
        error: dict[str, Any] = next(e["data"] for e in events if e["type"] == "error_occurred")
        assert error["code"] == "container_unavailable"
        assert error["message"] == "This runtime has no container tier: tools that need a sandbox cannot run."
        assert events[-1]["data"]["status"] == "failed"
        # the next message works and the broken call does not reach the model's context
        assert (await client.turn(image["imageId"], "just chat"))[-1]["data"]["status"] == "completed"


def test_a_big_tool_result_is_cut_to_fit_one_frame() -> None:
    small = ToolOutcome("x" * 1000)
    assert fit_result(small, 24 * 1024) is small
    # quotes and control characters take more room as JSON than as text: the JSON text is what counts
    big = ToolOutcome('"\x01' * 20_000, is_error=True)
    fitted = fit_result(big, 24 * 1024)
    assert len(orjson.dumps(fitted.output)) <= 24 * 1024
    assert fitted.is_error is True
    assert fitted.output.endswith("\n[output truncated: 40,000 bytes in total]")
    assert fitted.output.startswith('"\x01"\x01')
