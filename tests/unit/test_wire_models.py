"""One source of truth for the wire: every event type the code emits has a model in
agentvm/protocol/events.py, the rare-event constructors match their models, and the frame check
that the test suites run on every received frame (tests/support/wire.py) catches each kind of
drift. docs/protocol.md, "Keeping the wire in line"."""

from __future__ import annotations

import ast
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from agentvm.domain.models import Usage
from agentvm.money import Cost
from agentvm.protocol import envelope
from agentvm.protocol import events as wire
from agentvm.protocol import messages as msgs
from agentvm.protocol.commands import ImageGetResponse, ImageMessagesResponse, ResponseData
from agentvm.protocol.wire_check import data_problems, frame_problems

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "shared" / "agentvm", ROOT / "functions", ROOT / "local"]
# the only calls that pass an event type through (every other caller names its type)
PASS_THROUGH = {("engine/channel.py", "event")}


def emitted_types() -> tuple[set[str], list[str]]:
    """Event types named in `<channel>.publish("type", …)` and `event("type", …)` calls; and the
    calls whose type is not a literal (outside the pass-through ones)."""
    found: set[str] = set()
    unnamed: list[str] = []
    for root in SOURCES:
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
                if name not in ("publish", "event"):
                    continue
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add(arg.value)
                elif (path.relative_to(root).as_posix(), name) not in PASS_THROUGH:
                    unnamed.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found, unnamed


def test_every_emitted_event_type_has_a_model() -> None:
    found, unnamed = emitted_types()
    assert len(found) >= 25  # the scan sees the emitters
    assert found <= set(wire.EVENT_DATA), f"emitted without a model: {sorted(found - set(wire.EVENT_DATA))}"
    assert not unnamed, f"event types passed as variables (name them, so that this test sees them): {unnamed}"


def _env(type_: str, data: dict[str, Any], **extra: Any) -> dict[str, Any]:
    seq = 1 if wire.EVENT_META[type_][0] in ("agent", "session") else None
    return envelope.event(type_, data, {"containerId": "c", "imageId": "i", "sessionId": "s"}, seq=seq,
                          **extra)


USAGE, COST = Usage(1, 2).to_wire(), Cost(list=Decimal("0.5"), billed=Decimal("0.525")).to_wire()

CONSTRUCTED: list[tuple[str, dict[str, Any]]] = [
    ("container_created", wire.container_created("c", 1)),
    ("agent_registered", wire.agent_registered("c", "a", "name", 1)),
    ("agent_unregistered", wire.agent_unregistered("c", "a")),
    ("message_persisted", wire.message_persisted("s", "m", 1)),
    ("session_destroyed", wire.session_destroyed("s", "a", "c")),
    ("interrupted", wire.interrupted("a", "c")),
    ("conversation_queued", wire.conversation_queued("m")),
    ("conversation_end", wire.conversation_end("completed")),
    ("tool_executing", wire.tool_executing("t", "bash", {"command": "ls"})),
    ("tool_result", wire.tool_result("t", [{"type": "text", "text": "x"}], False)),
    ("error_received", wire.error_received("boom", "rate_limit_error")),
    ("error_occurred", wire.error_occurred("rate_limit_error", "boom")),
    ("turn_response", wire.turn_response(turn_id="t", message_id=None, duration_ms=3, usage=USAGE, cost=COST,
                                         model="m", tier="function", stop_reason="end_turn", status="completed",
                                         timestamp=1)),
    ("user_message", msgs.user_message("m", "hi", 1)),
    ("assistant_message", msgs.assistant_message("m", "hi", 1)),
    ("tool_call_message", msgs.tool_call_message("m", "t", "bash", {}, "p", 1)),
    ("tool_result_message", msgs.tool_result_message("m", "t", "bash", {"a": 1}, True, 1)),
    ("error_message", msgs.error_message("m", "boom", "x", 1)),
]


@pytest.mark.parametrize(("type_", "data"), CONSTRUCTED, ids=[t for t, _ in CONSTRUCTED])
def test_constructors_build_what_the_models_describe(type_: str, data: dict[str, Any]) -> None:
    assert frame_problems(envelope.encode(_env(type_, data))) == []


def test_the_frame_check_catches_drift() -> None:
    def problems(frame: dict[str, Any]) -> list[str]:
        return frame_problems(envelope.encode(frame))

    ok = _env("tool_use_start", {"toolCallId": "t", "toolName": "bash"})
    assert problems(ok) == []
    assert problems(_env("tool_use_start", {"toolCallID": "t", "toolName": "bash"})) == [
        "tool_use_start: data.toolCallId: Field required",
        "tool_use_start: data.toolCallID: Extra inputs are not permitted"]
    assert "tool_use_start: data.tool_call_id: Extra inputs are not permitted" in problems(
        _env("tool_use_start", {"tool_call_id": "t", "toolName": "bash"}))  # names are camelCase only
    assert problems(_env("text_delta", {"text": 5})) == ["text_delta: data.text: Input should be a valid string"]
    assert problems({**ok, "extra": 1}) == ["tool_use_start: envelope: unknown field extra"]
    assert problems({**ok, "category": "state"})[0].startswith("tool_use_start: source/category/intent")
    assert problems({k: v for k, v in ok.items() if k != "seq"}) == [
        "tool_use_start: seq None: session events (and only they) carry a seq"]
    assert problems({**ok, "context": {"session": "s"}}) == [
        "tool_use_start: context.session: Extra inputs are not permitted"]
    assert frame_problems({"type": "made_up", "timestamp": 1, "data": {}, "source": "agent", "category": "state",
                           "intent": "notification", "seq": 1}) == [
        "made_up: no model for this event type (protocol/events.py)"]
    turn = wire.turn_response(turn_id="t", message_id="m", duration_ms=1, usage=USAGE, cost=COST, model=None,
                              tier="function", stop_reason=None, status="completed", timestamp=1)
    assert data_problems("turn_response", {**turn, "durationMs": 1.5}) == [
        "turn_response: data.durationMs: Input should be a valid integer"]
    assert data_problems("turn_response", {**turn, "status": "done"})[0].startswith("turn_response: data.status")


def test_responses_are_checked_against_their_command_models() -> None:
    got = envelope.response("image_get", ImageGetResponse(request_id="r", subscriptions=["s"]))
    assert frame_problems(got) == []
    assert frame_problems({**got, "context": {}}) == ["image_get_response: envelope: a response has no context"]
    assert frame_problems({**got, "data": {**got["data"], "subscriptions": ["s"]}}) == [
        "image_get_response: data.subscriptions: Extra inputs are not permitted"]
    # an unknown request type is answered, with an error
    assert frame_problems(envelope.response("teleport", ResponseData(request_id="r", error="x"))) == []
    assert frame_problems(envelope.response("teleport", ResponseData(request_id="r"))) == [
        "teleport_response: a response to an unknown command without an error"]


def test_cloud_references_and_truncated_frames_are_known_shapes() -> None:
    ref = {"type": "image_messages_response", "timestamp": 1, "source": "command", "category": "response",
           "intent": "result", "data": {"__ref": {"url": "https://x", "bytes": 3, "sha256": "ab"}, "requestId": "r"}}
    assert frame_problems(ref) == []
    cut = _env("tool_result", {"__truncated": True, "bytes": 200_000})
    assert frame_problems(cut) == []
    assert frame_problems({**cut, "data": {"__truncated": True}}) == ["tool_result: data.bytes: Field required"]


def test_history_messages_are_checked_against_the_message_models() -> None:
    history = [msgs.user_message("m1", "hi", 1), msgs.assistant_message("m2", "hello", 2)]
    ok = envelope.response("image_messages", ImageMessagesResponse(request_id="r", image_id="i", messages=history))
    assert frame_problems(ok) == []
    bad = {**ok, "data": {**ok["data"], "messages": [{**history[0], "text": "hi"}, {"subtype": "other"}]}}
    assert frame_problems(bad) == ["image_messages_response: data.messages.0.text: Extra inputs are not permitted",
                                   "image_messages_response: data.messages.1: no message model for subtype 'other'"]
