"""OpenTelemetry traces of `avm serve` (agentvm.observability.tracing; docs/observability.md, "Traces"):
a scripted turn with a tool call, over the WebSocket, and an HTTP request, exported to memory."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import httpx
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agentvm.domain.models import Usage
from agentvm.money import cost_of
from tests.support.scripts import reference_driver
from tests.support.servers import in_process
from tests.support.spans import named, one, parent_id, span_id, wait_spans
from tests.support.stock_client import StockClient

# what the turn and its tool hold ("tool turn" of tests/support/scripts.py): never in a span
TEXTS = ("tool turn", "Let me check.", "Two files.", "a.txt", "b.txt", "command")


def attribute_texts(finished: tuple[ReadableSpan, ...]) -> list[str]:
    return [str(v) for s in finished for v in (s.attributes or {}).values()]


async def test_a_turn_with_a_tool_call_and_an_http_request_make_the_expected_span_tree(
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    async with in_process(tmp_path / "data", driver=reference_driver()) as srv:
        async with StockClient(srv.url) as ws:
            image = await ws.new_image("c-otel")
            events = await ws.turn(image["imageId"], "tool turn")
            async with httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
                listed = await http.get("/v1/images", params={"containerId": "c-otel", "token": "avm_sk_secret"})
                assert listed.status_code == 200
                missing = await http.get("/v1/images/img_nope")
                assert missing.status_code == 404
        finished = await wait_spans(spans, lambda f: bool(named(f, "WS /ws")) and bool(named(f, "turn")))

    turn_id = next(e for e in events if e["type"] == "turn_response")["data"]["turnId"]
    # exactly these spans: the WebSocket connection, one per frame but ACKs, the turn, its two LLM
    # calls and its tool call, and the two HTTP requests
    assert sorted(s.name for s in finished) == sorted([
        "WS /ws", "ws.message", "ws.message", "ws.message", "ws.message", "turn", "llm.call", "llm.call",
        "tool.call", "GET /v1/images", "GET /v1/images/{image_id}"])

    connection = one(finished, "WS /ws")
    assert connection.kind == SpanKind.SERVER and connection.parent is None
    # each frame the root of its own trace, linked to its connection's span (open for hours)
    messages = named(finished, "ws.message")
    assert {parent_id(m) for m in messages} == {None}
    assert [[link.context.span_id for link in m.links] for m in messages] == [[span_id(connection)]] * 4
    assert len({m.context.trace_id for m in messages if m.context is not None}) == 4
    assert sorted(str((m.attributes or {}).get("agentvm.command")) for m in messages) == [
        "None", "container_create", "image_create", "message_send"]  # None: the stock client's subscribe
    send = one(finished, "ws.message", agentvm__command="message_send")
    assert dict(send.attributes or {}) == {
        "agentvm.frame": "request", "agentvm.command": "message_send", "agentvm.tenant_id": "local",
        "agentvm.connection_id": (send.attributes or {})["agentvm.connection_id"]}

    # the turn: a child of the message that queued it; its LLM calls and tool call its children
    turn = one(finished, "turn")
    assert parent_id(turn) == span_id(send) and turn.context is not None and send.context is not None
    assert turn.context.trace_id == send.context.trace_id
    first, second = sorted(named(finished, "llm.call"), key=lambda s: s.start_time or 0)
    tool = one(finished, "tool.call")
    assert {parent_id(first), parent_id(second), parent_id(tool)} == {span_id(turn)}
    assert (first.start_time or 0) < (tool.start_time or 0) < (second.start_time or 0)

    cost1 = cost_of(Usage(100, 20), "claude-x")
    cost2 = cost_of(Usage(140, 5, 80), "claude-x")
    assert dict(first.attributes or {}) == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "scripted", "gen_ai.request.model": "scripted",
        "gen_ai.request.max_tokens": 4096, "agentvm.call": 1, "gen_ai.response.model": "claude-x",
        "gen_ai.response.id": "msg_01A", "gen_ai.response.finish_reasons": ("tool_use",),
        "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 20,
        "gen_ai.usage.cache_read.input_tokens": 0, "gen_ai.usage.cache_creation.input_tokens": 0,
        "agentvm.usage_estimated": False, "agentvm.cost_usd": str(cost1.billed),
        "agentvm.list_cost_usd": str(cost1.list)}
    assert (second.attributes or {})["gen_ai.usage.input_tokens"] == 140
    assert (second.attributes or {})["gen_ai.usage.cache_read.input_tokens"] == 80
    assert (second.attributes or {})["gen_ai.response.finish_reasons"] == ("end_turn",)
    assert (second.attributes or {})["agentvm.cost_usd"] == str(cost2.billed)
    assert dict(tool.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "Bash", "gen_ai.tool.call.id": "toolu_01",
        "agentvm.tool.is_error": False}

    billed = cost1.billed + cost2.billed
    assert Decimal(str((turn.attributes or {})["agentvm.cost_usd"])) == billed
    assert dict(turn.attributes or {}) == {
        "agentvm.tenant_id": "local", "agentvm.session_id": image["sessionId"], "agentvm.turn_id": turn_id,
        "agentvm.image_id": image["imageId"], "agentvm.container_id": "c-otel", "agentvm.tier": "function",
        "agentvm.resumed": False, "agentvm.status": "completed", "agentvm.stop_reason": "end_turn",
        "agentvm.escalated": False, "gen_ai.response.model": "claude-x", "gen_ai.usage.input_tokens": 240,
        "gen_ai.usage.output_tokens": 25, "agentvm.llm_calls": 2, "agentvm.cost_usd": str(billed),
        "agentvm.list_cost_usd": str(cost1.list + cost2.list)}
    assert all(s.status.status_code == StatusCode.UNSET for s in (turn, first, second, tool))

    # HTTP requests: FastAPI's own server spans, each the root of its trace, on agentvm's provider
    listed_span = one(finished, "GET /v1/images")
    assert listed_span.kind == SpanKind.SERVER and listed_span.parent is None
    assert (listed_span.attributes or {})["http.route"] == "/v1/images"
    assert (listed_span.attributes or {})["http.response.status_code"] == 200
    assert (listed_span.attributes or {})["url.query"] == "containerId=c-otel&token=REDACTED"
    not_found = one(finished, "GET /v1/images/{image_id}")
    assert (not_found.attributes or {})["http.response.status_code"] == 404
    assert all(s.resource.attributes.get("service.name") for s in finished)

    # no message text, tool input or output, and no key in any attribute
    values = attribute_texts(finished)
    assert not [v for v in values for text in (*TEXTS, "avm_sk_secret") if text in v]


async def test_a_failed_tool_call_and_a_failed_turn_are_marked(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    async with in_process(tmp_path / "data", driver=reference_driver()) as srv, StockClient(srv.url) as ws:
        image = await ws.new_image("c-otel-err")
        await ws.turn(image["imageId"], "unknown tool")
        await ws.turn(image["imageId"], "error turn")
        finished = await wait_spans(spans, lambda f: len(named(f, "turn")) == 2)

    ok, failed = sorted(named(finished, "turn"), key=lambda s: s.start_time or 0)
    tool = one(finished, "tool.call")
    assert parent_id(tool) == span_id(ok)
    assert (tool.attributes or {})["gen_ai.tool.name"] == "nope"
    assert (tool.attributes or {})["agentvm.tool.is_error"] is True
    assert (ok.attributes or {})["agentvm.status"] == "completed"
    # a turn that failed on the LLM's error: its code, never its message
    assert (failed.attributes or {})["agentvm.status"] == "failed"
    assert (failed.attributes or {})["agentvm.error_code"] == "rate_limit_error"
    [call] = [s for s in named(finished, "llm.call") if parent_id(s) == span_id(failed)]
    assert (call.attributes or {})["gen_ai.usage.input_tokens"] == 0
    assert "Rate limit exceeded" not in " ".join(attribute_texts(finished))
    # the second turn is not a child of the first message's span (the session's task began there)
    sends = sorted((s for s in named(finished, "ws.message")
                    if (s.attributes or {}).get("agentvm.command") == "message_send"), key=lambda s: s.start_time or 0)
    assert [parent_id(ok), parent_id(failed)] == [span_id(sends[0]), span_id(sends[1])]
