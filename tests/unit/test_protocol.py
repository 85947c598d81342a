from __future__ import annotations

import json
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from agentvm.domain.models import Usage
from agentvm.money import cost_of, price_for
from agentvm.protocol.envelope import classify, encode, event, wrap
from agentvm.protocol.events import EVENT_DATA, EVENT_META


def test_wrapper_payload_is_a_json_string_holding_the_event() -> None:
    payload = encode(event("text_delta", {"text": 'he said "hi"\n'}, {"sessionId": "s"}, timestamp=5, seq=3))
    frame = json.loads(wrap("conn_1_7", payload))
    assert set(frame) == {"__msgId", "__payload"} and frame["__msgId"] == "conn_1_7"
    assert isinstance(frame["__payload"], str)
    assert json.loads(frame["__payload"]) == {
        "type": "text_delta", "timestamp": 5, "data": {"text": 'he said "hi"\n'}, "source": "agent",
        "category": "stream", "intent": "notification", "context": {"sessionId": "s"}, "seq": 3}


def test_classify_frames() -> None:
    assert classify('{"__ack": "x", "type": "subscribe"}').kind == "ack"
    assert classify('{"type": "subscribe", "sessionId": "s"}').kind == "subscribe"
    assert classify('{"type": "auth", "headers": {}}').kind == "auth"
    assert classify('{"type": "image_get_request"}').kind == "request"
    assert classify('{"type": "made_up"}').kind == "other"
    for bad in ["", "{", "[]", "1", "null", b"\xff\xfe"]:
        assert classify(bad).kind == "invalid"


def test_every_event_has_metadata_and_a_data_model() -> None:
    assert set(EVENT_META) == set(EVENT_DATA)
    # the 27 notification types the reference puts on the wire, less the two we do not send
    wire = {"message_start", "text_delta", "message_stop", "tool_use_start", "input_json_delta", "tool_use_stop",
            "tool_result", "error_received", "conversation_start", "conversation_responding",
            "conversation_end", "tool_planned", "tool_executing", "error_occurred", "assistant_message",
            "tool_call_message", "tool_result_message", "error_message", "interrupted", "message_persisted",
            "session_destroyed", "container_created", "agent_registered", "agent_unregistered", "system_error"}
    assert wire <= set(EVENT_META)
    assert EVENT_META["error_received"] == ("agent", "state", "notification")
    assert EVENT_META["message_persisted"] == ("session", "persist", "result")


def test_billed_cost_is_list_price_times_markup_in_decimal() -> None:
    usage = Usage(input_tokens=1_000_000, output_tokens=100_000, cache_read_tokens=200_000,
                  cache_write_tokens=10_000)
    cost = cost_of(usage, "claude-sonnet-4-5-20250929")
    # 3.00 + 1.50 + 0.06 + 0.0375 = 4.5975 list; × 1.05
    assert cost.list == Decimal("4.59750000") and cost.billed == Decimal("4.82737500")
    assert cost.to_wire() == {"list": "4.59750000", "billed": "4.82737500", "currency": "USD"}
    assert price_for("claude-opus-4-1").output == Decimal("75")
    assert price_for("unknown-model").output == Decimal("75")  # never under-bill
    assert cost_of(Usage(5, 5), "scripted").billed == 0


def test_tiny_and_zero_costs_are_written_in_fixed_point() -> None:
    # str(Decimal) would give "8.0E-7" and "0E-8"
    assert cost_of(Usage(1, 0), "claude-3-5-haiku").to_wire() == {
        "list": "0.00000080", "billed": "0.00000084", "currency": "USD"}
    assert cost_of(Usage(5, 5), "scripted").to_wire() == {"list": "0.00000000", "billed": "0.00000000",
                                                          "currency": "USD"}


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.binary(),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                              lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=20)
                 .map(json.dumps)))
def test_classify_never_raises(frame: str | bytes) -> None:
    assert classify(frame).kind in {"ack", "subscribe", "auth", "request", "other", "invalid"}
