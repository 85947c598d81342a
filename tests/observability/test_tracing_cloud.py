"""OpenTelemetry traces of the Lambda handlers, behind the emulated API Gateway edge on moto: a span per
invocation, the frame's `ws.message` under `ws_default`'s, the turn with its LLM and tool calls under
`chat_turn`'s, all exported before each invocation returns (the batch processor would hold them a
minute: only the handlers' flush sends them)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from httpx_sse import aconnect_sse
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from agentvm.cloud import runtime as cloud_runtime
from agentvm.observability import tracing
from tests.aws_fixtures import moto_table, put_new_key, without_agentvm_env
from tests.support.cloud_edge import CloudEdge, cloud_edge, load_handler
from tests.support.scripts import reference_driver
from tests.support.spans import named, one, parent_id, span_id, wait_spans
from tests.support.stock_client import StockClient
from tests.support.stream_server import stream_server

TENANT = "tenant-otel"
EVENTS = Path(__file__).resolve().parents[1] / "cloud" / "events"


@pytest.fixture
def batched() -> Iterator[InMemorySpanExporter]:
    """Tracing on, spans held by a batch processor until a flush (its schedule: one minute)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    tracing.setup(provider)
    try:
        yield exporter
    finally:
        tracing.reset()
        provider.shutdown()


@pytest.fixture
async def edge(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CloudEdge]:
    without_agentvm_env(monkeypatch)
    driver = reference_driver()
    monkeypatch.setattr(cloud_runtime, "build_driver", lambda *args, **kwargs: driver)
    async with moto_table(moto_endpoint) as store:
        _, token = await put_new_key(store, TENANT)
        async with cloud_edge(moto_endpoint=moto_endpoint, token=token, table_name=store.table_name) as running:
            env = {**running.handler_env(), "AVM_CHAT_TURN_FUNCTION": "agentvm-chat-turn:live",
                   "AVM_RELIABLE_WRAPPER": "false"}
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            yield running


async def test_the_handlers_emit_invocation_message_and_turn_spans_flushed_before_they_return(
        edge: CloudEdge, batched: InMemorySpanExporter) -> None:
    async with StockClient(edge.url) as ws:
        image = await ws.new_image("c-otel")
        events = await ws.turn(image["imageId"], "tool turn", timeout=30)
        await edge.settle(include_invokes=True)
        finished = batched.get_finished_spans()  # no flush here: what the handlers flushed

    turn_id = next(e for e in events if e["type"] == "turn_response")["data"]["turnId"]
    turn = one(finished, "turn")
    assert dict(turn.attributes or {}) | {"agentvm.session_id": None} == {
        "agentvm.tenant_id": TENANT, "agentvm.session_id": None, "agentvm.turn_id": turn_id,
        "agentvm.image_id": image["imageId"], "agentvm.container_id": "c-otel", "agentvm.tier": "function",
        "agentvm.resumed": False, "agentvm.status": "completed", "agentvm.stop_reason": "end_turn",
        "agentvm.escalated": False, "gen_ai.response.model": "claude-x", "gen_ai.usage.input_tokens": 240,
        "gen_ai.usage.output_tokens": 25, "agentvm.llm_calls": 2,
        "agentvm.cost_usd": (turn.attributes or {})["agentvm.cost_usd"],
        "agentvm.list_cost_usd": (turn.attributes or {})["agentvm.list_cost_usd"]}
    assert (turn.attributes or {})["agentvm.session_id"] == image["sessionId"]

    # the turn runs under a chat_turn invocation's span, which continues the trace of the frame that
    # queued the turn (its traceparent rides in the invoke's payload)
    invocation = next(s for s in named(finished, "chat_turn") if span_id(s) == parent_id(turn))
    send = one(finished, "ws.message", agentvm__command="message_send")
    assert parent_id(invocation) == span_id(send) and invocation.kind == SpanKind.INTERNAL
    assert invocation.context is not None and send.context is not None and turn.context is not None
    assert invocation.context.trace_id == send.context.trace_id == turn.context.trace_id
    assert (invocation.attributes or {})["faas.name"] == "chat_turn"
    assert (invocation.attributes or {})["faas.trigger"] == "other"
    assert (invocation.attributes or {})["cloud.provider"] == "aws"
    assert isinstance((invocation.attributes or {})["faas.invocation_id"], str)
    calls = named(finished, "llm.call")
    tools = named(finished, "tool.call")
    assert len(calls) == 2 and len(tools) == 1
    assert {parent_id(s) for s in (*calls, *tools)} == {span_id(turn)}
    assert sorted((s.attributes or {})["gen_ai.usage.input_tokens"] for s in calls) == [100, 140]  # type: ignore[type-var]
    assert (tools[0].attributes or {})["gen_ai.tool.name"] == "Bash"

    # each frame but ACKs: a ws.message under its ws_default invocation (API Gateway's $default route)
    messages = named(finished, "ws.message")
    defaults = {span_id(s): s for s in named(finished, "ws_default")}
    assert sorted(str((m.attributes or {}).get("agentvm.command")) for m in messages) == [
        "None", "container_create", "image_create", "message_send"]
    assert all(parent_id(m) in defaults for m in messages)
    assert all((d.attributes or {})["faas.trigger"] == "http" and d.parent is None for d in defaults.values())
    assert len(named(finished, "ws_connect")) == 1
    assert {s.name for s in finished} == {"ws_connect", "ws_default", "ws.message", "chat_turn", "turn", "llm.call",
                                          "tool.call"}


def test_http_api_request_span_under_its_invocation(spans: InMemorySpanExporter) -> None:
    event = json.loads((EVENTS / "http_health.json").read_text())
    response = load_handler("http_api").handler(event, None)
    assert response["statusCode"] == 200
    finished = spans.get_finished_spans()
    assert sorted(s.name for s in finished) == ["GET /health", "http_api"]
    invocation, request = one(finished, "http_api"), one(finished, "GET /health")
    assert invocation.parent is None and (invocation.attributes or {})["faas.trigger"] == "http"
    assert parent_id(request) == span_id(invocation) and request.kind == SpanKind.SERVER
    assert (request.attributes or {})["http.route"] == "/health"
    assert (request.attributes or {})["http.response.status_code"] == 200


def test_an_invocation_continues_the_callers_trace(spans: InMemorySpanExporter) -> None:
    event = json.loads((EVENTS / "http_health.json").read_text())
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    event["headers"]["traceparent"] = f"00-{caller_trace}-{caller_span}-01"
    assert load_handler("http_api").handler(event, None)["statusCode"] == 200
    invocation, request = one(spans.get_finished_spans(), "http_api"), one(spans.get_finished_spans(), "GET /health")
    assert invocation.parent is not None and invocation.parent.span_id == int(caller_span, 16)
    assert invocation.context is not None and invocation.context.trace_id == int(caller_trace, 16)
    assert parent_id(request) == span_id(invocation)


@pytest.fixture
async def stream_app(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch,
                     batched: InMemorySpanExporter) -> AsyncIterator[tuple[str, str]]:
    """chat_stream's app under uvicorn (as behind the Lambda Web Adapter), built with traces on."""
    async with stream_server(moto_endpoint, monkeypatch, (TENANT,)) as (url, tokens):
        yield url, tokens[TENANT]


async def test_chat_stream_flushes_a_requests_spans_and_its_turns(stream_app: tuple[str, str],
                                                                  batched: InMemorySpanExporter) -> None:
    base, token = stream_app
    async with httpx.AsyncClient(base_url=base, timeout=20) as http, aconnect_sse(
            http, "POST", "/api/v1/chat/completions", json={"agent_type": "chat_basic", "message": "hello cloud"},
            headers={"authorization": f"Bearer {token}"}) as source:
        assert source.response.status_code == 200
        assert [e.event async for e in source.aiter_sse()][-1] == "done"
    # exported by the app's flush after the request (the batch processor alone would wait a minute)
    finished = await wait_spans(batched, lambda f: bool(named(f, "POST /api/v1/chat/completions")))
    request = one(finished, "POST /api/v1/chat/completions")
    turn = one(finished, "turn")
    [call] = named(finished, "llm.call")
    assert request.kind == SpanKind.SERVER and (request.attributes or {})["http.response.status_code"] == 200
    assert parent_id(turn) == span_id(request) and parent_id(call) == span_id(turn)
    assert (turn.attributes or {})["agentvm.status"] == "completed"
    assert (turn.attributes or {})["agentvm.tenant_id"] == TENANT
