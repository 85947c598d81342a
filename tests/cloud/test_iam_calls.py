"""Every AWS call a handler makes is allowed by its role in template.yaml (issue 18, finding 2).

Each function runs a representative scenario as the cloud runs it: the WebSocket functions and
`chat_turn` behind the emulated API Gateway edge, `http_api` with API Gateway HTTP events, the
streaming app of `chat_stream` over ASGI, the scheduled and stream-fed functions with their events,
and the turn host in-process. Every API call they make is recorded with the function that made it
(tests/support/aws_calls.py), turned into the authorizations AWS makes (action, resource ARN,
condition keys) and evaluated against that function's role after the SAM transform
(tests/support/role_policies.py). A missing permission fails with the function, action and resource.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from agentvm.adapters.aws.botocore_async import dummy_session
from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.ecs_tasks import ContainerTaskRecord
from agentvm.auth.api_keys import new_key
from agentvm.cloud import runtime as cloud_runtime
from agentvm.domain.models import TurnStatus
from agentvm.hosting.turn_sweep import SWEEP_GRACE_MS
from agentvm.ids import now_ms
from tests.aws_fixtures import REGION, moto_table, put_new_key, without_agentvm_env
from tests.cloud.test_container_tier import TENANT as CONTAINER_TENANT
from tests.cloud.test_container_tier import Cloud as ContainerCloud
from tests.cloud.test_container_tier import cloud, data
from tests.cloud.test_handlers import http_event
from tests.cloud.test_turn_sweep import TENANT as SWEEP_TENANT
from tests.cloud.test_turn_sweep import _queued_turn
from tests.support import aws_calls
from tests.support.aws_calls import RECORDER, Call
from tests.support.cloud_edge import cloud_edge, load_handler
from tests.support.role_policies import Stack, denied
from tests.support.stock_client import StockClient
from tests.support.turn_hosts import InProcessHost, create_queue, queue_depth
from tests.template.template_model import _sam_transformed, _template

__all__ = ["cloud", "data"]  # the container-tier test's fixtures, reused

TENANT = "t-iam"


@pytest.fixture(autouse=True)
def _recorder() -> Iterator[None]:
    """Installed before any fixture builds a client; each test sees its own calls only."""
    with aws_calls.recording():
        yield


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    """The template CloudFormation gets (SAM transformed); the source template without the SAM CLI venv."""
    return _sam_transformed() or _template()


@dataclass
class Deployment:
    stack: Stack
    store: DynamoDBStore
    token: str  # a user key of TENANT
    operator: str  # an operator key: the deployment's configuration
    moto: str


@pytest.fixture
async def deployment(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
                     ) -> AsyncIterator[Deployment]:
    """A stack's table, bucket and config path on moto, the handlers' environment set as the template sets it."""
    without_agentvm_env(monkeypatch)
    bucket = f"agentvm-{uuid.uuid4().hex[:12]}"
    s3: Any = dummy_session(REGION).create_client("s3", endpoint_url=moto_endpoint, region_name=REGION)
    s3.create_bucket(Bucket=bucket)
    s3.close()
    # the LLM key in Secrets Manager, as LlmSecretArn names it (read, then handed to the offline driver)
    secrets: Any = dummy_session(REGION).create_client("secretsmanager", endpoint_url=moto_endpoint,
                                                       region_name=REGION)
    secret_arn = secrets.create_secret(Name=f"agentvm/llm-{uuid.uuid4().hex[:8]}", SecretString="sk-ant-iam")["ARN"]
    secrets.close()
    offline = cloud_runtime.build_driver
    monkeypatch.setattr(cloud_runtime, "build_driver", lambda settings, api_key: offline(settings, None))
    async with moto_table(moto_endpoint) as store:
        stack = Stack(name=f"avm-iam-{uuid.uuid4().hex[:8]}", table=store.table_name, bucket=bucket,
                      llm_secret_arn=secret_arn)
        _, token = await put_new_key(store, TENANT)
        operator_key, operator = new_key("ops", ("operator",))
        await DynamoDBKeys(store).put_key(operator_key)
        env = {"AVM_TABLE_NAME": store.table_name, "AVM_BUCKET": bucket, "AVM_CONFIG_PATH": stack.config_path,
               "AVM_LLM_SECRET_ARN": secret_arn, "AVM_AWS_ENDPOINT_URL": moto_endpoint,
               "AVM_WS_ENDPOINT": moto_endpoint, "AVM_RELIABLE_WRAPPER": "false", "AVM_STREAM_FLUSH_MS": "0",
               "AVM_CHAT_TURN_FUNCTION": f"{stack.chat_turn_function}:live"}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        cloud_runtime.reset()
        try:
            yield Deployment(stack, store, token, operator, moto_endpoint)
        finally:
            cloud_runtime.reset()


def recorded(function: str) -> list[Call]:
    return RECORDER.calls(function)


def operations(function: str) -> set[str]:
    return {f"{c.service}:{c.operation}" for c in recorded(function)}


def assert_allowed(template: dict[str, Any], stack: Stack, *functions: str) -> None:
    for function in functions:
        assert recorded(function), f"{function} made no AWS call: the scenario did not run it"
    problems = denied([c for c in RECORDER.calls() if c.function in functions], template, stack)
    assert problems == [], "calls the role does not allow:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------------ WebSocket tier

async def _ws_scenario(d: Deployment, url: str) -> str:
    """A client's session: connect, create an image, one turn, list, close. Returns the session id."""
    async with StockClient(url, ack=False) as client:
        image = await client.new_image("c-iam")
        events = await client.turn(image["imageId"], "hello")
        assert events[-1]["type"] == "turn_response" and events[-1]["data"]["status"] == "completed"
        await client.request("image_list_request", {})
        await client.request("image_get_request", {"imageId": image["imageId"]})
        return str(image["sessionId"])


async def test_the_websocket_functions_and_chat_turn_make_only_allowed_calls(
        deployment: Deployment, template: dict[str, Any]) -> None:
    d = deployment
    async with cloud_edge(moto_endpoint=d.moto, token=d.token, table_name=d.stack.table) as edge:
        for name, value in edge.handler_env().items():
            os.environ[name] = value
        await _ws_scenario(d, edge.url)
        await edge.settle(include_invokes=True, timeout=30)
    assert len(edge.calls("chat_turn")) == 1
    assert {"dynamodb:PutItem", "dynamodb:GetItem"} <= operations("ws_connect")
    assert "lambda:Invoke" in operations("ws_default")
    assert {"apigatewaymanagementapi:PostToConnection", "secretsmanager:GetSecretValue"} <= operations("chat_turn")
    assert "dynamodb:DeleteItem" in operations("ws_disconnect") or "dynamodb:BatchWriteItem" in operations(
        "ws_disconnect")
    assert_allowed(template, d.stack, "ws_connect", "ws_default", "chat_turn", "ws_disconnect")


async def test_the_turn_host_and_the_dispatcher_that_feeds_it_make_only_allowed_calls(
        deployment: Deployment, template: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    d = deployment
    queue_url = create_queue(d.moto, d.stack.turn_queue + "-" + uuid.uuid4().hex[:8])
    stack = Stack(**{**d.stack.__dict__, "turn_queue": queue_url.rsplit("/", 1)[-1]})
    # poll 0: moto serves one request at a time, a long poll would hold every other call; the host
    # never refuses for CPU here (the busy test process is not its load)
    for name, value in {"AVM_TURN_QUEUE_URL": queue_url, "AVM_TURN_HOST_POLL_S": "0",
                        "AVM_TURN_HOST_HEARTBEAT_S": "1", "AVM_TURN_HOST_VCPU": "64",
                        "AVM_TURN_HOST_MAX_CPU": "1"}.items():
        monkeypatch.setenv(name, value)
    async with cloud_edge(moto_endpoint=d.moto, token=d.token, table_name=stack.table) as edge:
        for name, value in edge.handler_env().items():
            monkeypatch.setenv(name, value)
        host = await asyncio.to_thread(InProcessHost().start)
        try:
            await _ws_scenario(d, edge.url)
            await _until_idle(host, d.moto, queue_url, taken=1)
            # a queued turn whose dispatch failed (ws_default then releases the lease it would have
            # handed on): the sweep (past the grace) reads the host directory and starts a runner (the
            # host when its record says it takes turns, else chat_turn)
            rt = await cloud_runtime.runtime().ready()
            session_id, _, _, handoff = await _queued_turn(rt, "c-iam-sweep")
            assert await rt.leases.release(SWEEP_TENANT, session_id, handoff.owner, next_seq=handoff.next_seq)
            await rt.store.close()
            sweep = load_handler("turn_sweep")
            sweep.now_ms = lambda: now_ms() + SWEEP_GRACE_MS + 1000  # type: ignore[attr-defined]
            report = await asyncio.to_thread(sweep.handler, {}, None)
            assert (report["sessions"], report["dispatched"], report["failed"]) == (1, 1, 0), report
            await _until_completed(d.store, SWEEP_TENANT, session_id)
            await edge.settle(include_invokes=True, timeout=30)
            await _until_idle(host, d.moto, queue_url, taken=1)
        finally:
            await asyncio.to_thread(host.stop)
    assert "sqs:SendMessage" in operations("ws_default")
    assert {"sqs:ReceiveMessage", "sqs:DeleteMessageBatch", "apigatewaymanagementapi:PostToConnection",
            "secretsmanager:GetSecretValue"} <= operations("turn_host")
    # the host directory (PK TURNHOST) is read under the dynamodb:LeadingKeys condition of ListTurnHosts
    swept = operations("turn_sweep")
    assert {"dynamodb:Query", "dynamodb:GetItem"} <= swept and swept & {"sqs:SendMessage", "lambda:Invoke"}
    ran = [f for f in ("ws_default", "turn_host", "turn_sweep", "chat_turn") if recorded(f)]
    assert ran[:3] == ["ws_default", "turn_host", "turn_sweep"]
    assert_allowed(template, stack, *ran)


async def _until_completed(store: DynamoDBStore, tenant_id: str, session_id: str) -> None:
    deadline = time.monotonic() + 30
    while not (turns := await store.list_turns(tenant_id, session_id)) or any(
            t.status != TurnStatus.COMPLETED for t in turns):
        assert time.monotonic() < deadline, f"the swept session's turns did not complete: {turns}"
        await asyncio.sleep(0.05)


async def _until_idle(host: InProcessHost, moto: str, queue_url: str, *, taken: int) -> None:
    """Until the host has taken `taken` session runs in all, finished them, and the queue is empty
    (an empty queue alone is not enough: the host takes what it received after deleting it)."""
    assert host.host is not None
    deadline = time.monotonic() + 30
    while not (host.host.counts.taken >= taken and host.idle()
               and await asyncio.to_thread(queue_depth, moto, queue_url) == 0):
        assert time.monotonic() < deadline, (f"the turn host did not take {taken} runs and become idle: "
                                             f"{host.host.counts}, running {list(host.host.running)}")
        await asyncio.sleep(0.05)


# ------------------------------------------------------------------------------------ HTTP functions

def _http(function: str = "http_api") -> Any:
    api = load_handler(function)

    def call(method: str, path: str, token: str | None, body: Any = None, query: str = "") -> tuple[int, Any]:
        response = api.handler(http_event(method, path, token=token, body=body, query=query), None)
        text = response.get("body")
        return response["statusCode"], json.loads(text) if text and text.startswith(("{", "[")) else text

    return call


async def test_http_api_makes_only_allowed_calls(deployment: Deployment, template: dict[str, Any]) -> None:
    d = deployment
    await asyncio.to_thread(_http_api_scenario, d)
    ops = operations("http_api")
    assert {"ssm:PutParameter", "ssm:DeleteParameter", "ssm:GetParametersByPath", "dynamodb:Query"} <= ops
    assert_allowed(template, d.stack, "http_api")


def _http_api_scenario(d: Deployment) -> None:
    call = _http()
    assert call("GET", "/health", None)[0] == 200
    for path in ("/v1/usage", "/v1/budgets", "/v1/auth/keys", "/v1/resources", "/v1/logs", "/v1/metrics"):
        status, body = call("GET", path, d.token)
        assert status == 200, (path, body)
    assert call("GET", "/v1/usage/export", d.token, query="period=2026-11")[0] == 200
    status, created = call("POST", "/v1/resources", d.token, {"kind": "prompt", "name": "greeting",
                                                            "version": "1.0.0", "content": {"text": "Hi"}})
    assert status == 201, created
    assert call("GET", f"/v1/resources/{created['resourceId']}", d.token)[0] == 200
    assert call("DELETE", f"/v1/resources/{created['resourceId']}", d.token)[0] == 204
    _config_scenario(call, d)


def _config_scenario(call: Any, d: Deployment) -> None:
    """PUT/DELETE /v1/config/{key} with an operator key: the runtime layer in SSM, audited."""
    status, body = call("PUT", "/v1/config/llm.model", d.operator, {"value": "claude-haiku-4-5"})
    assert (status, body["source"]) == (200, "runtime"), body
    status, body = call("GET", "/v1/config", d.operator)
    assert status == 200 and body["values"]["llm.model"]["layers"]["runtime"] == "claude-haiku-4-5"
    assert call("GET", "/v1/config/audit", d.operator)[0] == 200
    assert call("DELETE", "/v1/config/llm.model", d.operator)[0] == 200


def _stream_client() -> httpx.AsyncClient:
    from agentvm.cloud.stream_app import create_stream_app

    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_stream_app()), base_url="http://stream",
                             timeout=30)


async def _sse_turn(http: httpx.AsyncClient, token: str, message: str) -> dict[str, Any]:
    """One chat turn over SSE; its `done` event."""
    async with aconnect_sse(http, "POST", "/api/v1/chat/completions", headers={"authorization": f"Bearer {token}"},
                            json={"agent_type": "chat_basic", "message": message}) as source:
        assert source.response.status_code == 200
        events = [e async for e in source.aiter_sse()]
    done: dict[str, Any] = json.loads(events[-1].data)
    assert (events[-1].event, done["status"]) == ("done", "completed"), done
    return done


async def test_chat_stream_makes_only_allowed_calls(deployment: Deployment, template: dict[str, Any]) -> None:
    """The streaming app runs in this test's loop: the calls of the requests served inside
    `invoking` are chat_stream's."""
    d = deployment
    auth = {"authorization": f"Bearer {d.token}"}
    ops = {"authorization": f"Bearer {d.operator}"}
    with aws_calls.invoking("chat_stream"):
        async with _stream_client() as http:
            done = await _sse_turn(http, d.token, "hello stream")
            history = await http.get("/api/v1/chat/history", params={"session_id": done["session_id"]},
                                     headers=auth)
            assert history.status_code == 200
            assert (await http.get("/v1/images", headers=auth)).status_code == 200
            put = await http.put("/v1/config/llm.model", json={"value": "claude-haiku-4-5"}, headers=ops)
            assert put.status_code == 200, put.text
            assert (await http.delete("/v1/config/llm.model", headers=ops)).status_code == 200
        await cloud_runtime.runtime().store.close()
    assert {"ssm:PutParameter", "ssm:DeleteParameter", "dynamodb:UpdateItem",
            "secretsmanager:GetSecretValue"} <= operations("chat_stream")
    assert_allowed(template, d.stack, "chat_stream")


# ------------------------------------------------------------------------------------ scheduled and stream-fed

async def test_the_scheduled_and_stream_fed_functions_make_only_allowed_calls(
        deployment: Deployment, template: dict[str, Any]) -> None:
    d = deployment
    # a session with a finished turn and its usage record (the set-up's own calls are nobody's)
    async with _stream_client() as http:
        done = await _sse_turn(http, d.token, "hello archive")
    await cloud_runtime.runtime().store.close()
    cloud_runtime.reset()
    await asyncio.to_thread(_scheduled_scenario, d, done["session_id"])
    assert "dynamodb:Query" in operations("turn_sweep")
    assert {"dynamodb:Query", "s3:PutObject", "s3:ListObjectsV2", "s3:GetObject"} <= operations("usage_export")
    assert {"s3:PutObject", "dynamodb:UpdateItem"} <= operations("history_archive")
    assert_allowed(template, d.stack, "turn_sweep", "usage_export", "history_archive")


def _scheduled_scenario(d: Deployment, session_id: str) -> None:
    from tests.adapters.test_history_archive import record

    load_handler("turn_sweep").handler({}, None)
    out = load_handler("usage_export").handler({"day": time.strftime("%Y-%m-%d", time.gmtime())}, None)
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert out["files"][f"exports/focus/daily/{today}.csv"] > 0, out  # the turn's usage
    assert (out["monthly"]["through"], out["missing"]) == (today, []), out  # earlier days written, month joined
    items = _history_items(d, session_id)
    assert len(items) >= 3, "the turn stored no history"
    load_handler("history_archive").handler({"Records": [record(i, n) for n, i in enumerate(items)]}, None)


def _history_items(d: Deployment, session_id: str) -> list[dict[str, Any]]:
    ddb: Any = dummy_session(REGION).create_client("dynamodb", endpoint_url=d.moto, region_name=REGION)
    try:
        items = ddb.scan(TableName=d.stack.table)["Items"]
    finally:
        ddb.close()
    pk = f"SESS#{TENANT}#{session_id}"
    return [i for i in items if i["PK"]["S"] == pk and i["SK"]["S"].startswith(("MSG#", "TURN#"))]


# ------------------------------------------------------------------------------------ the container tier

async def test_chat_turn_escalating_to_the_container_tier_makes_only_allowed_calls(
        cloud: ContainerCloud, template: dict[str, Any]) -> None:
    """A tool turn: chat_turn stops at the first sandbox tool and starts the container's task (the
    worker's own calls are TenantWorkerRole's: tests/cloud/test_tenant_scope.py)."""
    [definition] = (await cloud.ecs.list_task_definitions())["taskDefinitionArns"][-1:]
    async with StockClient(cloud.edge.url, ack=False) as client:
        image = await client.new_image("c-iam-tools", tools=["bash", "read_file", "write_file"])
        start = len(client.events)
        await client.request("message_send_request", {"imageId": image["imageId"], "content": "use the tools"})
        await client.wait_for(lambda e: e.get("type") == "tool_call_message", 10, start)
        await cloud.edge.settle(include_invokes=True)
    assert len((await cloud.ecs.list_tasks(cluster=cloud.cluster))["taskArns"]) == 1
    assert "ecs:RunTask" in operations("chat_turn")
    stack = Stack(name="avm-iam-ct", table=cloud.store.table_name, bucket=cloud.bucket, worker_cluster=cloud.cluster,
                  worker_task_definition=definition)
    assert_allowed(template, stack, "ws_connect", "ws_default", "chat_turn")
    # the grant is the container tier's: without it (no WorkerImageUri) the same calls are refused
    refused = denied(RECORDER.calls("chat_turn"), template, Stack(**{**stack.__dict__,
                                                                     "conditions": {"HasWorkerImage": False}}))
    assert [p.split(" on ")[0] for p in refused] == ["chat_turn: ecs:RunTask", "chat_turn: ecs:TagResource"]


async def test_deleting_an_image_asks_the_live_container_task_with_allowed_calls(
        cloud: ContainerCloud, template: dict[str, Any]) -> None:
    """ws_default deletes an image with a stdio MCP server while the container's task runs: it writes
    the server onto the task's record (`stop_mcp`), with a call its role allows."""
    [definition] = (await cloud.ecs.list_task_definitions())["taskDefinitionArns"][-1:]
    task = ContainerTaskRecord(cloud.store, CONTAINER_TENANT, "c-iam-mcp", "task-iam")
    assert await task.register(60)  # the container's task is live
    async with StockClient(cloud.edge.url, ack=False) as client:
        image = await client.new_image("c-iam-mcp", mcpServers={"files": {"command": "/usr/bin/true"}})
        before = len(recorded("ws_default"))
        await client.request("image_delete_request", {"imageId": image["imageId"]})
        await cloud.edge.settle()
    [(name, _)] = (await task.poll()).stop_mcp
    assert name == "files"
    assert "dynamodb:UpdateItem" in {f"{c.service}:{c.operation}" for c in recorded("ws_default")[before:]}
    stack = Stack(name="avm-iam-ct", table=cloud.store.table_name, bucket=cloud.bucket, worker_cluster=cloud.cluster,
                  worker_task_definition=definition)
    assert_allowed(template, stack, "ws_connect", "ws_default")


# ------------------------------------------------------------------------------------ the check can fail

def _without(template: dict[str, Any], role: str, sid: str) -> dict[str, Any]:
    changed = copy.deepcopy(template)
    resources = changed["Resources"]
    for policy in resources[role]["Properties"]["Policies"] if role in resources else \
            resources[role.removesuffix("Role")]["Properties"]["Policies"]:
        document = policy.get("PolicyDocument", policy)
        before = len(document["Statement"])
        document["Statement"] = [s for s in document["Statement"] if not (isinstance(s, dict) and s.get("Sid") == sid)]
        if len(document["Statement"]) < before:
            return changed
    raise AssertionError(f"{role} has no statement {sid}")


async def test_a_permission_removed_from_the_role_fails_the_check(deployment: Deployment,
                                                                   template: dict[str, Any]) -> None:
    d = deployment
    await asyncio.to_thread(lambda: _config_scenario(_http(), d))
    assert denied(RECORDER.calls("http_api"), template, d.stack) == []
    problems = denied(RECORDER.calls("http_api"), _without(template, "HttpApiFunctionRole", "WriteConfig"), d.stack)
    parameter = f"arn:aws:ssm:us-east-1:123456789012:parameter{d.stack.config_path}llm.model"
    assert problems == [f"http_api: ssm:PutParameter on {parameter} (role HttpApiFunctionRole)",
                        f"http_api: ssm:DeleteParameter on {parameter} (role HttpApiFunctionRole)"]
    # a grant on another stack's path is no grant: the resource pattern is checked, not only the action
    other = Stack(**{**d.stack.__dict__, "name": d.stack.name + "-other"})
    assert any("ssm:PutParameter" in p for p in denied(RECORDER.calls("http_api"), template, other))


# ------------------------------------------------------------------------------------ Bedrock

async def test_a_bedrock_call_is_allowed_only_for_the_models_the_deployment_names(template: dict[str, Any],
                                                                                   aws_env: None) -> None:
    """A real ConverseStream of the Bedrock driver (against a fake endpoint speaking its event stream),
    recorded as each LLM-calling role would make it, against the BedrockModels parameter."""
    from agentvm.adapters.aws.botocore_async import default_session
    from agentvm.drivers.base import LLMRequest
    from agentvm.drivers.bedrock_converse import BedrockConverseDriver
    from tests.fakes import fake_bedrock as br
    from tests.fakes.http_stub import StubServer

    profile, nova = "us.anthropic.claude-haiku-4-5-20251001-v1:0", "amazon.nova-lite-v1:0"
    with StubServer() as server:
        driver = BedrockConverseDriver(region=REGION, endpoint_url=server.base_url, max_retries=0,
                                       session=default_session())
        for function in ("chat_turn", "chat_stream", "turn_host"):
            for model in (profile, nova):
                server.enqueue(br.stream([br.message_start(), *br.text(0, ["Hi"]), br.message_stop("end_turn"),
                                          br.metadata(5, 1)]))
                with aws_calls.invoking(function):
                    request = LLMRequest(model, [{"role": "user", "content": "hello"}], max_tokens=16)
                    assert [type(e).__name__ async for e in driver.stream(request)][-1] == "MessageStop"
        await driver.aclose()
    calls = RECORDER.calls()
    assert [(c.function, c.service, c.operation, c.params["modelId"]) for c in calls] == [
        (f, "bedrock-runtime", "ConverseStream", m) for f in ("chat_turn", "chat_stream", "turn_host")
        for m in (profile, nova)]
    stack = Stack(name="avm-iam-br", table="t", bucket="b", bedrock_models="anthropic.claude-haiku-4-5*")
    roles = {"chat_turn": "ChatTurnFunctionRole", "chat_stream": "ChatStreamFunctionRole",
             "turn_host": "TurnHostTaskRole"}
    action = "bedrock:InvokeModelWithResponseStream"
    # the profile and the model it routes to are granted; Nova is not named by the parameter
    assert denied(calls, template, stack) == [
        f"{f}: {action} on arn:aws:bedrock:us-east-1::foundation-model/{nova} (role {roles[f]})" for f in roles]
    assert denied(calls, template, Stack(**{**stack.__dict__, "bedrock_models": "*"})) == []
    # blank (the default): no Bedrock permission at all
    none = denied(calls, template, Stack(**{**stack.__dict__, "conditions": {"HasBedrockModels": False}}))
    assert len(none) == 3 * 3 and all(action in line for line in none)
