"""Powertools logging, EMF metrics and tracing of the Lambda handlers (agentvm.cloud.observability).

The handlers run in-process against DynamoDB and the management API on moto; the EMF blobs they print
to stdout are parsed and checked: names, values, units, and dimensions that never carry an id."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
from agentvm.auth.api_keys import new_key
from agentvm.cloud import observability
from agentvm.cloud import runtime as cloud_runtime
from agentvm.domain.models import ConnectionRecord, LeaseHandoff
from agentvm.domain.usage import model_family
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from tests.cloud.test_handlers import connect_event, event
from tests.support.cloud_edge import FUNCTIONS, REPO, load_handler
from tests.support.moto_posts import posted_frames

SCRIPT = """
rules:
  - match: "^count my tokens"
    responses:
      - text: ["Counted."]
        usage: {input_tokens: 120, output_tokens: 8, cache_read_tokens: 30, cache_write_tokens: 5}
"""
TENANT = "tenant-obs"


@dataclass
class Dispatched:
    calls: list[tuple[str, str]]
    handoffs: list[LeaseHandoff | None] = field(default_factory=list)

    async def start_turns(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None:
        self.calls.append((tenant_id, session_id))
        self.handoffs.append(handoff)


def emf_blobs(out: str) -> list[dict[str, Any]]:
    """The EMF blobs among stdout's lines."""
    blobs = []
    for line in out.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            blob = json.loads(line)
            if "CloudWatchMetrics" in blob["_aws"]:
                blobs.append(blob)
    return blobs


def metrics_of(blobs: list[dict[str, Any]]) -> dict[str, list[tuple[str, list[float], dict[str, str]]]]:
    """metric name → [(unit, values, dimensions)] over every blob."""
    out: dict[str, list[tuple[str, list[float], dict[str, str]]]] = {}
    for blob in blobs:
        [directive] = blob["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == "AgentVM"
        names = {name for dim_set in directive["Dimensions"] for name in dim_set}
        dims = {name: blob[name] for name in names}
        for metric in directive["Metrics"]:
            values = blob[metric["Name"]]
            out.setdefault(metric["Name"], []).append(
                (metric["Unit"], values if isinstance(values, list) else [values], dims))
    return out


def assert_no_ids(blobs: list[dict[str, Any]], ids: set[str]) -> None:
    """Every dimension is one of the low-cardinality names, and no value holds one of `ids`."""
    assert all(ids), ids
    for blob in blobs:
        [directive] = blob["_aws"]["CloudWatchMetrics"]
        for dim_set in directive["Dimensions"]:
            for name in dim_set:
                assert name in observability.DIMENSIONS | {"service"}, name
                value = blob[name]
                assert isinstance(value, str) and len(value) <= 32, (name, value)
                assert not any(i in value or value in i for i in ids), (name, value)
        # and no id anywhere else in the blob either (EMF turns every top-level key into a log field)
        text = json.dumps(blob)
        assert not any(i in text for i in ids), text


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> ScriptedDriver:
    driver = ScriptedDriver(parse_script(SCRIPT))
    monkeypatch.setattr(cloud_runtime, "build_driver", lambda *args, **kwargs: driver)
    return driver


def ws_frame(connection_id: str, frame: dict[str, Any]) -> dict[str, Any]:
    e = event("ws_default")
    e["requestContext"]["connectionId"] = connection_id
    e["body"] = json.dumps(frame)
    return e


def request(type_: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"type": type_, "timestamp": 1, "data": {**data, "requestId": f"r-{uuid.uuid4().hex[:6]}"}}


def test_chat_turn_emits_turn_token_and_duration_totals_and_logs_the_breakdowns(
        cloud: cloud_runtime.CloudRuntime, scripted: ScriptedDriver, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    key, _token = new_key(TENANT)
    cloud_runtime.run(DynamoDBKeys(cloud.store).put_key(key))
    conn = f"obs{uuid.uuid4().hex[:10]}="
    cloud_runtime.run(cloud.registry.put_connection(ConnectionRecord(conn, TENANT, key.key_id, 1)))
    dispatched = Dispatched([])
    cloud.__dict__["dispatcher"] = dispatched  # ws_default hands the turn over; this test runs chat_turn
    container = f"user-{uuid.uuid4().hex[:8]}"

    ws_default = load_handler("ws_default").handler
    ws_default(ws_frame(conn, request("container_create_request", {"containerId": container})), None)
    ws_default(ws_frame(conn, request("image_create_request", {"containerId": container,
                                                               "config": {"name": "obs"}})), None)
    [image] = [f for f in posted_frames(conn) if f["type"] == "image_create_response"]
    image_id = image["data"]["record"]["imageId"]
    ws_default(ws_frame(conn, request("message_send_request", {"imageId": image_id,
                                                               "content": "count my tokens"})), None)
    [(tenant, session_id)] = dispatched.calls
    assert tenant == TENANT
    capsys.readouterr()

    handoff = dispatched.handoffs[-1]
    assert handoff is not None
    with caplog.at_level(logging.INFO, logger="agentvm.engine.runner"):
        assert load_handler("chat_turn").handler({"tenantId": TENANT, "sessionId": session_id,
                                                  "handoff": handoff.to_wire()}, None) == {"ran": 1}

    out = capsys.readouterr().out
    blobs = emf_blobs(out)
    metrics = metrics_of(blobs)
    [(unit, values, dims)] = metrics["TurnsRun"]
    assert (unit, values) == ("Count", [1.0])
    only_function = {"service": "agentvm", "function": "chat_turn"}
    assert dims == only_function
    expected = {"InputTokens": 120.0, "OutputTokens": 8.0}
    for name, value in expected.items():
        [(unit, values, dims)] = metrics[name]
        assert (unit, values, dims) == ("Count", [value], only_function), name
    [(unit, values, dims)] = metrics["TurnDuration"]
    assert unit == "Milliseconds" and len(values) == 1 and values[0] >= 0
    assert dims == only_function
    assert "TurnErrors" not in metrics  # the turn did not fail
    assert set(metrics) == {"TurnsRun", "TurnDuration", *expected}
    # the breakdowns are log fields (Logs Insights), not billed dimensions
    [finished] = [r for r in caplog.records if r.getMessage() == "turn finished"]
    assert {k: getattr(finished, k) for k in ("status", "tier", "model_family", "input_tokens", "output_tokens",
                                              "cache_read_tokens", "cache_write_tokens", "tenant_id")} == {
        "status": "completed", "tier": "function", "model_family": "scripted", "input_tokens": 120,
        "output_tokens": 8, "cache_read_tokens": 30, "cache_write_tokens": 5, "tenant_id": TENANT}

    [turn] = cloud_runtime.run(cloud.store.list_turns(TENANT, session_id))
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (120, 8)  # what the metrics say
    ids = {TENANT, session_id, container, image_id, conn, key.key_id, turn.turn_id}
    assert_no_ids(blobs, ids)


def test_connect_counts_accepted_and_refused_connections(cloud: cloud_runtime.CloudRuntime,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    key, token = new_key(TENANT)
    cloud_runtime.run(DynamoDBKeys(cloud.store).put_key(key))
    handler = load_handler("ws_connect").handler
    capsys.readouterr()
    assert handler(connect_event(token), None) == {"statusCode": 200}
    assert handler(connect_event(None), None) == {"statusCode": 200}  # an `auth` frame comes next
    assert handler(connect_event(token[:-4] + "AAAA"), None)["statusCode"] == 401
    blobs = emf_blobs(capsys.readouterr().out)
    assert len(blobs) == 3  # one flush per invocation
    metrics = metrics_of(blobs)
    only_function = {"service": "agentvm", "function": "ws_connect"}
    assert metrics["ConnectionsAccepted"] == [("Count", [1.0], only_function)] * 2  # a key, an auth frame to come
    assert metrics["ConnectionsRefused"] == [("Count", [1.0], only_function)]
    assert_no_ids(blobs, {TENANT, key.key_id, event("ws_connect")["requestContext"]["connectionId"]})


def test_http_api_counts_requests_and_server_errors_apart(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    handler = load_handler("http_api")
    response = handler.handler(event("http_health"), None)
    assert response["statusCode"] == 200
    only_function = {"service": "agentvm", "function": "http_api"}
    assert metrics_of(emf_blobs(capsys.readouterr().out)) == {"Requests": [("Count", [1.0], only_function)]}
    monkeypatch.setattr(handler, "_asgi", lambda event, context: {"statusCode": 503})
    assert handler.handler(event("http_health"), None)["statusCode"] == 503
    assert metrics_of(emf_blobs(capsys.readouterr().out)) == {"Requests": [("Count", [1.0], only_function)],
                                                              "ServerErrors": [("Count", [1.0], only_function)]}


def test_an_invocation_without_metrics_prints_no_blob(cloud: cloud_runtime.CloudRuntime,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert load_handler("ws_disconnect").handler(event("ws_disconnect"), None) == {"statusCode": 200}
    assert emf_blobs(capsys.readouterr().out) == []


def test_metrics_are_flushed_when_the_handler_raises(capsys: pytest.CaptureFixture[str]) -> None:
    obs = observability.observe("unit")

    @obs.handler
    def broken(event: Any, context: Any) -> None:
        obs.metric("Attempts", observability.Count, 2)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        broken({}, None)
    [(unit, values, dims)] = metrics_of(emf_blobs(capsys.readouterr().out))["Attempts"]
    assert (unit, values, dims) == ("Count", [2.0], {"service": "agentvm", "function": "unit"})


def test_no_dimension_but_the_function_is_accepted() -> None:
    metrics = observability.InvocationMetrics("unit")
    with pytest.raises(ValueError, match=r"dimension\(s\) \['tenant_id'\] are not allowed"):
        metrics.add("TurnsRun", observability.Count, 1, tenant_id="acme")
    with pytest.raises(ValueError, match=r"dimension\(s\) \['session'\] are not allowed"):
        metrics.add("TurnsRun", observability.Count, 1, session="sess_1")
    for breakdown in ("model_family", "tier", "status", "reason", "status_class", "auth"):
        with pytest.raises(ValueError, match="put breakdowns in log fields"):
            metrics.add("TurnsRun", observability.Count, 1, **{breakdown: "x"})
    assert not metrics


@pytest.mark.parametrize(("model", "family"), [
    ("claude-sonnet-4-5-20250929", "claude-sonnet"), ("claude-3-5-haiku-latest", "claude-haiku"),
    ("claude-opus-4-1", "claude-opus"), ("claude-instant", "claude-other"), ("scripted", "scripted"),
    ("gpt-x", "other"), (None, "none")])
def test_model_family(model: str | None, family: str) -> None:
    assert model_family(model) == family


@dataclass
class FakeContext:
    function_name: str = "agentvm-prod-WsDefaultFunction-AbC123"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:agentvm-prod-WsDefault"
    aws_request_id: str = "c6af9ac6-7b61-11e6-9a41-93e812345678"


@pytest.fixture
def root_handler() -> Iterator[None]:
    """The Lambda set-up, undone afterwards: the powertools handler as the root logger's only handler."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    observability.install_root_handler("INFO")
    try:
        yield
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)


def test_stdlib_records_come_out_as_one_powertools_json_line_with_their_extras(
        root_handler: None, capsys: pytest.CaptureFixture[str]) -> None:
    obs = observability.observe("ws_default")
    module_log = logging.getLogger("agentvm.some_module")

    @obs.handler
    def handler(event: Any, context: Any) -> None:
        module_log.info("turn ended", extra={"turn_id": "turn_1", "bytes": 12, "token": "avmk_0123456789ab.s3cr3t"})
        module_log.warning("key avmk_0123456789ab.s3cr3t seen")

    handler(ws_frame("conn-1=", {}), FakeContext())
    logging.getLogger("botocore.sample").warning("a library line")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    first, second, library = lines
    assert first["message"] == "turn ended" and first["level"] == "INFO"
    assert first["logger"] == "agentvm.some_module" and first["service"] == "agentvm"
    assert (first["turn_id"], first["bytes"]) == ("turn_1", 12)
    assert first["token"] == "[redacted]"  # secrets redacted as agentvm.logs.JsonFormatter does
    assert first["function_name"] == FakeContext.function_name
    assert first["function_request_id"] == FakeContext.aws_request_id
    assert first["cold_start"] is True and first["function"] == "ws_default"
    assert first["connection_id"] == "conn-1="
    assert "s3cr3t" not in second["message"] and second["message"].startswith("key avmk_0123456789ab.")
    # the invocation's keys are gone once it returned; library records are JSON lines too
    assert library["logger"] == "botocore.sample" and "function_request_id" not in library


def test_tracing_is_a_no_op_without_the_sdk_or_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAMBDA_TASK_ROOT", "/var/task")
    monkeypatch.delenv("AWS_SAM_LOCAL", raising=False)
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    assert observability.tracing_enabled() is False
    monkeypatch.delenv("POWERTOOLS_TRACE_DISABLED")
    real = observability.importlib.util.find_spec
    monkeypatch.setattr(observability.importlib.util, "find_spec",
                        lambda name, *a: None if name == "aws_xray_sdk" else real(name, *a))
    assert observability.tracing_enabled() is False
    monkeypatch.delenv("LAMBDA_TASK_ROOT")
    monkeypatch.setattr(observability.importlib.util, "find_spec", real)
    assert observability.tracing_enabled() is False  # outside Lambda: no X-Ray daemon to send to


def test_a_handler_import_loads_powertools_but_never_the_xray_sdk() -> None:
    """In a fresh interpreter set up like Lambda (with the SDK installed in this venv): the import of
    every handler leaves aws_xray_sdk unloaded, and the root logger gets the powertools handler."""
    code = textwrap.dedent("""
        import importlib, json, logging, sys
        sys.path.insert(0, sys.argv[1])
        importlib.import_module("handler")
        root = logging.getLogger().handlers
        print(json.dumps({"xray": sorted(m for m in sys.modules if m.startswith("aws_xray_sdk")),
                          "powertools": "aws_lambda_powertools.logging" in sys.modules,
                          "root": [type(h).__name__ for h in root],
                          "formatter": type(root[0].formatter).__name__ if root else None}))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO / "shared"), "LAMBDA_TASK_ROOT": "/var/task",
           "AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9001", "AWS_LAMBDA_FUNCTION_NAME": "agentvm-test",
           "AVM_TABLE_NAME": "agentvm-test", "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}
    env.pop("POWERTOOLS_TRACE_DISABLED", None)
    for name in ("ws_connect", "ws_disconnect", "ws_default", "chat_turn", "http_api"):
        folder = FUNCTIONS / name
        proc = subprocess.run([sys.executable, "-c", code, str(folder)], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        assert report == {"xray": [], "powertools": True, "root": ["StreamHandler"],
                          "formatter": "LambdaPowertoolsFormatter"}, name
