"""The cloud container tier end to end: `chat_turn` escalates a tool turn, ECS (moto) gets one RunTask,
and the worker entry (`agentvm.worker`, run in-process) resumes the turn in the same seq order, runs
the tools in the container's workspace, pushes it to S3 and exits when idle."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentvm.adapters.aws.botocore_async import new_client
from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.ecs_tasks import container_task_pk
from agentvm.adapters.local.local_process import probe_host
from agentvm.auth.api_keys import new_key
from agentvm.cloud import runtime as cloud_runtime
from agentvm.config import Settings
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from agentvm.worker.__main__ import serve
from tests.aws_fixtures import REGION
from tests.support.cloud_edge import CloudEdge, cloud_edge
from tests.support.stock_client import StockClient
from tests.tools.test_mcp import _exists, gone
from tests.tools.test_mcp_turns import server_config
from tests.tools.test_tool_turns import SCRIPT as TOOL_SCRIPT
from tests.tools.test_tool_turns import tool_turn_types

SCRIPT = TOOL_SCRIPT + """
  - match: "^just chat"
    responses:
      - text: ["Hello."]
  - match: "^who are you"
    responses:
      - tool_calls: [{id: toolu_who, name: mcp__fixture__whoami, input: {}}]
      - text: ["Noted."]
"""
TENANT = "tenant-ct"
TENANT_ROLE_ARN = "arn:aws:iam::123456789012:role/agentvm-tenant-worker"


@dataclass
class Cloud:
    edge: CloudEdge
    store: DynamoDBStore
    ecs: Any
    cluster: str
    bucket: str
    data: Path


@pytest.fixture
def data(traversable_dir: Path) -> Path:
    return traversable_dir


@pytest.fixture
async def cloud(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch,
                data: Path) -> AsyncIterator[Cloud]:
    for name in list(os.environ):
        if name.startswith(("AVM_", "LLM_", "ANTHROPIC_")):
            monkeypatch.delenv(name)
    driver = ScriptedDriver(parse_script(SCRIPT))
    monkeypatch.setattr(cloud_runtime, "build_driver", lambda *args, **kwargs: driver)
    table = f"agentvm-{uuid.uuid4().hex[:16]}"
    bucket = f"agentvm-{uuid.uuid4().hex[:12]}"
    store = DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION)
    await store.open()
    await store.create_table()
    s3 = new_client("s3", endpoint_url=moto_endpoint, region_name=REGION)
    await s3.create_bucket(Bucket=bucket)
    ec2 = new_client("ec2", endpoint_url=moto_endpoint, region_name=REGION)
    vpc = (await ec2.create_vpc(CidrBlock="10.0.0.0/16"))["Vpc"]["VpcId"]
    await ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})  # as in template.yaml
    subnet = (await ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24"))["Subnet"]["SubnetId"]
    group = (await ec2.create_security_group(GroupName=f"sg-{uuid.uuid4().hex[:8]}", Description="worker",
                                             VpcId=vpc))["GroupId"]
    ecs = new_client("ecs", endpoint_url=moto_endpoint, region_name=REGION)
    cluster = f"agentvm-{uuid.uuid4().hex[:8]}"
    await ecs.create_cluster(clusterName=cluster)
    task_def = (await ecs.register_task_definition(
        family="agentvm-worker", requiresCompatibilities=["FARGATE"], networkMode="awsvpc", cpu="512", memory="1024",
        runtimePlatform={"cpuArchitecture": "ARM64", "operatingSystemFamily": "LINUX"},
        containerDefinitions=[{"name": "worker", "image": "agentvm-worker:latest", "essential": True,
                               "memory": 1024}]))["taskDefinition"]["taskDefinitionArn"]
    key, token = new_key(TENANT)
    await DynamoDBKeys(store).put_key(key)
    try:
        async with cloud_edge(moto_endpoint=moto_endpoint, token=token, table_name=table) as edge:
            env = {**edge.handler_env(), "AVM_CHAT_TURN_FUNCTION": "agentvm-chat-turn:live",
                   "AVM_RELIABLE_WRAPPER": "false", "AVM_STREAM_FLUSH_MS": "0", "AVM_BUCKET": bucket,
                   "AVM_ECS_CLUSTER": cluster, "AVM_ECS_TASK_DEFINITION": task_def, "AVM_ECS_SUBNETS": subnet,
                   "AVM_ECS_SECURITY_GROUPS": group, "AVM_ECS_CONTAINER_NAME": "worker",
                   "AVM_DATA_DIR": str(data / "worker"), "AVM_WORKER_IDLE_S": "1",
                   "AVM_WORKER_TENANT_ROLE_ARN": TENANT_ROLE_ARN}
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            yield Cloud(edge, store, ecs, cluster, bucket, data)
    finally:
        for client in (s3, ec2, ecs):
            await client.close()
        await store.close()


async def run_worker(monkeypatch: pytest.MonkeyPatch, container_id: str) -> int:
    """What RunTask starts: the worker entry, with the overrides the dispatcher gave the task."""
    monkeypatch.setenv("AVM_WORKER_TENANT_ID", TENANT)
    monkeypatch.setenv("AVM_WORKER_CONTAINER_ID", container_id)
    return await asyncio.wait_for(serve(Settings()), 30)


async def test_a_tool_turn_escalates_to_one_task_that_resumes_it_and_exits_when_idle(
        cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    async with StockClient(cloud.edge.url, ack=False) as client:
        image = await client.new_image("c-tools", tools=["bash", "read_file", "write_file"])
        await client.turn(image["imageId"], "just chat")
        assert (await cloud.ecs.list_tasks(cluster=cloud.cluster))["taskArns"] == []  # no tool: no task
        start = len(client.events)
        await client.request("message_send_request", {"imageId": image["imageId"], "content": "use the tools"})
        await client.wait_for(lambda e: e.get("type") == "tool_call_message", 10, start)
        await cloud.edge.settle(include_invokes=True)

        # chat_turn stopped at the first sandbox tool and started the container's task, once
        [arn] = (await cloud.ecs.list_tasks(cluster=cloud.cluster))["taskArns"]
        [task] = (await cloud.ecs.describe_tasks(cluster=cloud.cluster, tasks=[arn]))["tasks"]
        [override] = task["overrides"]["containerOverrides"]
        env = {e["name"]: e["value"] for e in override["environment"]}
        assert (env["AVM_WORKER_TENANT_ID"], env["AVM_WORKER_CONTAINER_ID"]) == (TENANT, "c-tools")
        assert not any(e.get("type") == "tool_executing" for e in client.events[start:])

        turns = await run_worker(monkeypatch, "c-tools")
        assert turns == 1
        await client.wait_for(lambda e: e.get("type") == "turn_response", 10, start)
        got = [e for e in client.events[start:] if "seq" in e and e["type"] not in ("message_persisted",
                                                                                       "user_message")]
        assert [e["type"] for e in got] == tool_turn_types(text_first=True)
        done = got[-1]["data"]
        assert (done["status"], done["tier"]) == ("completed", "container")
        results = {e["data"]["toolCallId"]: e["data"]["result"] for e in got if e["type"] == "tool_result"}
        assert results["toolu_read"] == "hello from the agent\n"

        # one gap-free seq order in the stored log, across chat_turn, the hand-off and the worker
        logged = [e.seq for e in await cloud.store.read_events(TENANT, image["sessionId"], 0)]
        assert logged == list(range(1, len(logged) + 1))
        assert [e["seq"] for e in got] == sorted(e["seq"] for e in got)

        # the workspace went back to S3; the task's record is gone (it finished idle)
        s3 = new_client("s3", endpoint_url=cloud.edge.moto_endpoint, region_name=REGION)
        try:
            obj = await s3.get_object(Bucket=cloud.bucket, Key=f"workspaces/{TENANT}/c-tools/projects/notes.txt")
            assert await asyncio.to_thread(obj["Body"].read) == b"hello from the agent\n"
        finally:
            await s3.close()
        item = await cloud.store.client.get_item(
            TableName=cloud.store.table_name, ConsistentRead=True,
            Key={"PK": {"S": container_task_pk(TENANT, "c-tools")}, "SK": {"S": "CTASK"}})
        assert "Item" not in item

        # the next chat turn runs in the function tier again, without a task
        events = await client.turn(image["imageId"], "just chat")
        assert events[-1]["data"]["tier"] == "function"
        assert len((await cloud.ecs.list_tasks(cluster=cloud.cluster))["taskArns"]) == 1
        history = (await client.request("image_messages_request", {"imageId": image["imageId"]}))["data"]["messages"]
        assert [m["subtype"] for m in history][1:10] == [
            "assistant", "user", "tool-call", "assistant", "tool-result", "tool-call", "tool-result", "tool-call",
            "tool-result"]


async def test_deleting_an_image_stops_its_mcp_servers_in_the_container_task(
        cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    host = probe_host()
    if host.prlimit is None or (os.geteuid() == 0 and host.setpriv is None):
        pytest.skip("util-linux's prlimit (and setpriv as root) are needed to start a sandboxed server")
    # the fixture server lies outside /usr: the uid and the rlimits confine it, not bubblewrap; the task
    # stays long enough after the turn for the delete to reach it (it exits after idling 8 s)
    monkeypatch.setenv("AVM_SANDBOX_ISOLATION", "none")
    monkeypatch.setenv("AVM_UNSAFE_UNSANDBOXED_TOOLS", str(os.geteuid() != 0).lower())
    monkeypatch.setenv("AVM_WORKER_IDLE_S", "8")
    async with StockClient(cloud.edge.url, ack=False) as client:
        image = await client.new_image("c-mcp", mcpServers={"fixture": server_config(cloud.data)})
        start = len(client.events)
        # a turn of an image with a stdio server starts in the container tier: its task starts the server
        await client.request("message_send_request", {"imageId": image["imageId"], "content": "who are you"})
        await cloud.edge.settle(include_invokes=True)
        worker = asyncio.get_running_loop().create_task(run_worker(monkeypatch, "c-mcp"))
        await client.wait_for(lambda e: e.get("type") == "turn_response", 20, start)
        [result] = [e["data"] for e in client.events[start:] if e.get("type") == "tool_result"]
        pid = json.loads(result["result"])["pid"]
        assert _exists(pid)

        await client.request("image_delete_request", {"imageId": image["imageId"]})
        await cloud.edge.settle()
        # the delete asked the live task (its record) to stop the server, and the task did, while it runs on
        assert await gone(pid, within_s=5)
        assert not worker.done()
        # taken off the record once stopped (the worker writes that right after the kill: wait for it)
        deadline = asyncio.get_running_loop().time() + 5
        while True:
            item = await cloud.store.client.get_item(
                TableName=cloud.store.table_name, ConsistentRead=True,
                Key={"PK": {"S": container_task_pk(TENANT, "c-mcp")}, "SK": {"S": "CTASK"}})
            if "stop_mcp" not in item["Item"] or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
        assert "stop_mcp" not in item["Item"]
        assert await worker == 1
