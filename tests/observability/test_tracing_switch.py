"""When traces are on (the standard OTEL_* variables) and what being off costs: no opentelemetry module
imported by agentvm (the Lambda cold path), and a real OTLP http/protobuf export when on."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agentvm.observability import tracing
from tests.bench.cold_imports import lambda_env
from tests.support.servers import start_serve, stop_serve

REPO = Path(__file__).resolve().parents[2]
FUNCTIONS = sorted(p.name for p in (REPO / "functions").iterdir() if (p / "handler.py").is_file())
# these build a FastAPI app, and FastAPI itself imports the opentelemetry API (its native telemetry)
FASTAPI_HANDLERS = {"http_api"}


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "svc"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
    ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, True),
])
def test_the_standard_variables_decide(env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(env) is on


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AVM_", "AWS_"))}
    env["PYTHONPATH"] = os.pathsep.join(str(REPO / d) for d in ("shared", "local", "client"))
    return {**env, **(extra or {})}


def run_child(code: str, env: dict[str, str], cwd: Path = REPO) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# Imports what opens spans, opens one of each kind, then lists the opentelemetry modules loaded.
USE_SPANS = """
import json, sys
import agentvm.engine.runner, agentvm.api.ws_router, agentvm.hosting.local_host
from agentvm.observability import tracing
tracing.remember("turn_1")
with tracing.span("turn", {"agentvm.turn_id": "turn_1"}, origin="turn_1") as s:
    tracing.set_attributes(s, {"gen_ai.usage.input_tokens": 1})
tracing.flush()
print(json.dumps({"on": tracing.enabled(), "telemetry": tracing.fastapi_telemetry(),
                  "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry"))}, default=str))
"""


def test_off_by_default_no_opentelemetry_module_is_imported() -> None:
    out = run_child(USE_SPANS, child_env())
    assert out == {"on": False, "telemetry": {"tracing": False}, "otel": []}


def test_sdk_disabled_wins_and_imports_nothing() -> None:
    out = run_child(USE_SPANS, child_env({"OTEL_SDK_DISABLED": "true",
                                          "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}))
    assert out == {"on": False, "telemetry": {"tracing": False}, "otel": []}


@pytest.mark.parametrize("function", FUNCTIONS)
def test_a_lambda_handler_imports_no_opentelemetry_when_off(function: str) -> None:
    """The handler module's import (the cold path) and a span, as its first invocation opens one."""
    folder = REPO / "functions" / function
    code = f"""
import json, sys
sys.path.insert(0, {str(folder)!r})
import handler
from agentvm.observability import tracing
with tracing.span({function!r}):
    pass
tracing.flush()
print(json.dumps({{"otel": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
                   "fastapi": "fastapi" in sys.modules}}))
"""
    out = run_child(code, {**lambda_env(function, folder), "PYTHONPATH": str(REPO / "shared")}, cwd=folder)
    otel = list(out["otel"])  # type: ignore[call-overload]
    assert not [m for m in otel if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))]
    if function in FASTAPI_HANDLERS:
        assert out["fastapi"] is True and "opentelemetry.trace" in otel  # FastAPI's, not ours
    else:
        assert otel == []


def test_console_exporter_when_asked_with_the_default_service_name() -> None:
    code = USE_SPANS.replace("tracing.flush()", "tracing.flush(); sys.stdout.flush()")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env({"OTEL_TRACES_EXPORTER": "console"}),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["on"] is True and "opentelemetry.sdk.trace" in last["otel"]
    assert last["telemetry"]["operation_spans"] is False and "TracerProvider" in last["telemetry"]["tracer_provider"]
    assert not [m for m in last["otel"] if m.startswith("opentelemetry.exporter.otlp")]
    exported = json.loads(proc.stdout[:proc.stdout.rindex("\n{\"on\"")])
    assert exported["name"] == "turn" and exported["parent_id"] is None
    assert exported["attributes"] == {"agentvm.turn_id": "turn_1", "gen_ai.usage.input_tokens": 1}
    assert exported["resource"]["attributes"]["service.name"] == "agentvm"


class _Collector(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.received.append((self.path, self.headers.get("content-type") or "", body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    received: list[tuple[str, str, bytes]] = []
    handler = type("Collector", (_Collector,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def test_on_with_the_endpoint_spans_go_to_the_collector_over_otlp_http_protobuf(
        collector: tuple[str, list[tuple[str, str, bytes]]], monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, received = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agentvm-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")  # nothing leaves before the flush
    tracing.reset()
    try:
        with tracing.span("turn", {"agentvm.turn_id": "turn_9"}), tracing.span("llm.call", {"agentvm.call": 1}):
            pass
        assert received == []
        tracing.flush()
        [(path, content_type, body)] = received
        assert path == "/v1/traces" and content_type == "application/x-protobuf"
        request = ExportTraceServiceRequest.FromString(body)
        [resource_spans] = request.resource_spans
        resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
        assert resource["service.name"] == "agentvm-test"
        spans = {s.name: s for scope in resource_spans.scope_spans for s in scope.spans}
        assert set(spans) == {"turn", "llm.call"}
        assert spans["llm.call"].parent_span_id == spans["turn"].span_id
        assert {a.key: a.value.string_value for a in spans["turn"].attributes} == {"agentvm.turn_id": "turn_9"}
    finally:
        tracing.reset()


def test_an_unsupported_protocol_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    tracing.reset()
    try:
        with pytest.raises(tracing.TracingSetupError, match=r"^OTEL_EXPORTER_OTLP_PROTOCOL=grpc: not supported: "):
            tracing.setup()
    finally:
        tracing.reset()


def test_avm_serve_refuses_an_unsupported_protocol_in_one_line(tmp_path: Path) -> None:
    env = child_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    proc = subprocess.run([sys.executable, "-m", "avm.cli", "serve", "--port", "0", "--data-dir", str(tmp_path / "d")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "avm serve: OTEL_EXPORTER_OTLP_PROTOCOL=grpc: not supported: AgentVM exports OTLP over http/protobuf "
        "(a collector's port 4318): unset it or set http/protobuf")
    assert "Traceback" not in proc.stderr


def test_avm_serve_with_the_console_exporter_writes_its_request_spans(tmp_path: Path) -> None:
    sp = start_serve(tmp_path / "data", env={"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "avm-e2e"})
    try:
        assert httpx.get(f"{sp.http}/health", timeout=5).status_code == 200
    finally:
        stop_serve(sp)  # SIGTERM: uvicorn re-raises it after the lifespan's end, which flushed the spans
    log = sp.log()
    assert '"name": "GET /health"' in log and '"service.name": "avm-e2e"' in log
    assert '"http.response.status_code": 200' in log
