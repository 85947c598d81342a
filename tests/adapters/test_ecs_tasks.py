"""The container tier on ECS (moto): one task per container, started once, reused while its
heartbeat lives; the container-task record's worker side; RunTask failures keep the session pending."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import botocore.session
import pytest
from botocore.stub import Stubber

from agentvm.adapters.aws.botocore_async import AsyncBotocoreClient, new_client
from agentvm.adapters.aws.clients import LazyClient
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.ecs_tasks import (
    ContainerStartFailed,
    ContainerTaskRecord,
    EcsContainerTier,
    container_task_pk,
)
from agentvm.adapters.aws.tenant_scope import TenantNotScopable
from agentvm.errors import AgentVMError

pytestmark = pytest.mark.usefixtures("aws_env")

CONTAINER_NAME = "worker"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Ecs:
    """A moto cluster with a Fargate task definition, and the network a task needs."""

    client: AsyncBotocoreClient
    source: LazyClient
    cluster: str
    task_definition: str
    subnet: str
    security_group: str
    run_task_calls: list[dict[str, Any]]

    async def task_arns(self) -> list[str]:
        resp = await self.client.list_tasks(cluster=self.cluster)
        return list(resp["taskArns"])


@pytest.fixture
async def store(aws_session: botocore.session.Session, moto_endpoint: str) -> AsyncIterator[DynamoDBStore]:
    s = DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", session=aws_session, endpoint_url=moto_endpoint,
                      clock=Clock())
    await s.open()
    await s.create_table()
    yield s
    await s.close()


@pytest.fixture
async def ecs(aws_session: botocore.session.Session, moto_endpoint: str) -> AsyncIterator[Ecs]:
    ec2 = new_client("ec2", session=aws_session, endpoint_url=moto_endpoint)
    vpc = (await ec2.create_vpc(CidrBlock="10.0.0.0/16"))["Vpc"]["VpcId"]
    await ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})  # as in template.yaml
    subnet = (await ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24"))["Subnet"]["SubnetId"]
    group = (await ec2.create_security_group(GroupName=f"sg-{uuid.uuid4().hex[:8]}", Description="worker",
                                             VpcId=vpc))["GroupId"]
    await ec2.close()
    # The tier gets its client the way production does: a LazyClient, created on first use.
    source = LazyClient("ecs", session=aws_session, endpoint_url=moto_endpoint)
    client = await source.get()
    calls: list[dict[str, Any]] = []

    def capture(params: dict[str, Any], **_: Any) -> None:
        calls.append(params)

    client.meta.events.register("provide-client-params.ecs.RunTask", capture)
    cluster = f"agentvm-{uuid.uuid4().hex[:8]}"
    await client.create_cluster(clusterName=cluster)
    family = f"worker-{uuid.uuid4().hex[:8]}"
    task_def = await client.register_task_definition(
        family=family, requiresCompatibilities=["FARGATE"], networkMode="awsvpc", cpu="512", memory="1024",
        runtimePlatform={"cpuArchitecture": "ARM64", "operatingSystemFamily": "LINUX"},
        containerDefinitions=[{"name": CONTAINER_NAME, "image": "agentvm-worker:latest", "essential": True,
                               "memory": 1024}])  # moto sums container memory
    yield Ecs(client, source, cluster, task_def["taskDefinition"]["taskDefinitionArn"], subnet, group, calls)
    await source.close()


def make_tier(store: DynamoDBStore, ecs: Ecs, **overrides: Any) -> EcsContainerTier:
    params: dict[str, Any] = {
        "cluster": ecs.cluster, "task_definition": ecs.task_definition, "subnets": [ecs.subnet],
        "security_groups": [ecs.security_group], "container_name": CONTAINER_NAME, **overrides}
    return EcsContainerTier(store, ecs.source, **params)


@pytest.fixture
def tier(store: DynamoDBStore, ecs: Ecs) -> EcsContainerTier:
    return make_tier(store, ecs)


async def record(store: DynamoDBStore, tenant: str = "t1", container: str = "c1") -> dict[str, Any]:
    resp = await store.client.get_item(TableName=store.table_name, ConsistentRead=True,
                                       Key={"PK": {"S": container_task_pk(tenant, container)}, "SK": {"S": "CTASK"}})
    return dict(resp.get("Item", {}))


def pending_of(item: dict[str, Any]) -> set[str]:
    return set(item["pending"]["SS"]) if "pending" in item else set()


def clock_of(store: DynamoDBStore) -> Clock:
    clock = store._clock
    assert isinstance(clock, Clock)
    return clock


async def test_first_start_runs_one_task_with_the_container_override_and_network(
        store: DynamoDBStore, ecs: Ecs, tier: EcsContainerTier) -> None:
    await tier.start("t1", "c1", "s1")

    arns = await ecs.task_arns()
    assert len(arns) == 1
    (task,) = (await ecs.client.describe_tasks(cluster=ecs.cluster, tasks=arns))["tasks"]
    assert task["launchType"] == "FARGATE"
    assert task["startedBy"] == "agentvm"
    assert task["taskDefinitionArn"] == ecs.task_definition
    (override,) = task["overrides"]["containerOverrides"]
    assert override["name"] == CONTAINER_NAME
    assert {e["name"]: e["value"] for e in override["environment"]} == {
        "AVM_WORKER_TENANT_ID": "t1", "AVM_WORKER_CONTAINER_ID": "c1", "AVM_WORKER_HEARTBEAT_TTL_S": "60"}
    details = {d["name"]: d["value"] for a in task["attachments"] for d in a["details"]}
    assert details["subnetId"] == ecs.subnet

    (call,) = ecs.run_task_calls
    assert call["networkConfiguration"] == {"awsvpcConfiguration": {
        "subnets": [ecs.subnet], "securityGroups": [ecs.security_group], "assignPublicIp": "ENABLED"}}
    assert call["count"] == 1 and call["propagateTags"] == "TASK_DEFINITION"

    item = await record(store)
    assert pending_of(item) == {"s1"}
    assert item["task_owner"]["S"].startswith("starting:")
    assert int(item["task_until"]["N"]) == int(clock_of(store).now * 1000) + 120_000
    assert item["task_arn"]["S"] == arns[0]
    assert (item["tenant_id"]["S"], item["container_id"]["S"]) == ("t1", "c1")
    assert call["clientToken"] == item["task_owner"]["S"].removeprefix("starting:")


async def test_private_subnets_disable_the_public_ip(store: DynamoDBStore, ecs: Ecs) -> None:
    await make_tier(store, ecs, assign_public_ip=False).start("t1", "c1", "s1")
    (call,) = ecs.run_task_calls
    assert call["networkConfiguration"]["awsvpcConfiguration"]["assignPublicIp"] == "DISABLED"


async def test_a_live_task_takes_further_sessions_without_another_run_task(
        store: DynamoDBStore, ecs: Ecs, tier: EcsContainerTier) -> None:
    await tier.start("t1", "c1", "s1")
    await tier.start("t1", "c1", "s2")  # still starting: the claim is live
    assert len(await ecs.task_arns()) == 1
    assert pending_of(await record(store)) == {"s1", "s2"}

    worker = ContainerTaskRecord(store, "t1", "c1", "task-1")
    assert await worker.register(60)
    clock_of(store).now += 200  # past the start grace, but the worker beats
    assert await worker.beat(60)
    await tier.start("t1", "c1", "s3")
    await tier.start("t1", "c1", "s1")  # a session already pending stays once
    assert len(await ecs.task_arns()) == 1
    assert await worker.pending() == {"s1", "s2", "s3"}

    # another container of the tenant gets its own task
    await tier.start("t1", "c2", "s9")
    assert len(await ecs.task_arns()) == 2


async def test_concurrent_escalations_start_one_task(store: DynamoDBStore, ecs: Ecs, tier: EcsContainerTier) -> None:
    await asyncio.gather(*(tier.start("t1", "c1", f"s{i}") for i in range(6)))
    assert len(await ecs.task_arns()) == 1
    assert pending_of(await record(store)) == {f"s{i}" for i in range(6)}


async def test_an_expired_heartbeat_or_start_claim_starts_a_new_task(
        store: DynamoDBStore, ecs: Ecs, tier: EcsContainerTier) -> None:
    clock = clock_of(store)
    await tier.start("t1", "c1", "s1")
    old = ContainerTaskRecord(store, "t1", "c1", "task-1")
    assert await old.register(60)
    clock.now += 61  # the worker died: its heartbeat expired
    await tier.start("t1", "c1", "s2")
    assert len(await ecs.task_arns()) == 2
    assert (await record(store))["task_owner"]["S"].startswith("starting:")
    assert await old.beat(60) is False  # the stalled worker learns it lost the container
    assert await old.finish() is False

    clock.now += 121  # the second task never registered: its start claim expires too
    await tier.start("t1", "c1", "s3")
    assert len(await ecs.task_arns()) == 3
    assert pending_of(await record(store)) == {"s1", "s2", "s3"}


async def test_worker_register_beat_pending_done_finish(store: DynamoDBStore, ecs: Ecs,
                                                       tier: EcsContainerTier) -> None:
    clock = clock_of(store)
    await tier.start("t1", "c1", "s1")
    worker = ContainerTaskRecord(store, "t1", "c1", "task-1")
    other = ContainerTaskRecord(store, "t1", "c1", "task-2")
    assert await worker.register(60)  # takes over the start claim
    assert await worker.register(60)  # re-entrant
    assert await other.register(60) is False  # a live owner keeps the container
    assert await other.beat(60) is False
    assert await worker.beat(60)
    item = await record(store)
    assert item["task_owner"]["S"] == "task-1"
    assert int(item["task_until"]["N"]) == int(clock.now * 1000) + 60_000

    assert await worker.pending() == {"s1"}
    assert await worker.finish() is False  # work is pending
    await worker.done(["s1"])
    assert await worker.pending() == set()
    assert "pending" not in await record(store)  # DynamoDB drops the emptied set

    # A session escalates after the worker's last look at `pending`: finish refuses, nothing is lost.
    assert await worker.pending() == set()
    await tier.start("t1", "c1", "s2")
    assert len(await ecs.task_arns()) == 1  # the live worker takes it
    assert await worker.finish() is False
    assert await worker.pending() == {"s2"}
    await worker.done({"s2"})
    assert await other.finish() is False  # not the owner
    assert await worker.finish() is True
    assert await record(store) == {}

    # finished: the next escalation starts a new task
    await tier.start("t1", "c1", "s3")
    assert len(await ecs.task_arns()) == 2
    await worker.done(["s3"])  # done on a record it no longer owns still removes the session
    assert await worker.pending() == set()
    await worker.done([])


async def test_a_deleted_images_mcp_servers_reach_the_live_task_only(store: DynamoDBStore, ecs: Ecs,
                                                                       tier: EcsContainerTier) -> None:
    clock = clock_of(store)
    # no task: nothing runs its servers, so nothing is written
    assert await tier.stop_mcp_servers("t1", "c1", {("files", "f1")}) is False
    assert await record(store) == {}
    assert await tier.stop_mcp_servers("t1", "c1", set()) is False

    await tier.start("t1", "c1", "s1")
    worker = ContainerTaskRecord(store, "t1", "c1", "task-1")
    assert await worker.register(60)
    assert await tier.stop_mcp_servers("t1", "c1", {("files", "f1"), ("web", "f2")}) is True
    assert await tier.stop_mcp_servers("t1", "c1", {("files", "f1")}) is True  # a set: once
    assert await tier.stop_mcp_servers("t1", "c2", {("files", "f1")}) is False  # another container
    assert set((await record(store))["stop_mcp"]["SS"]) == {"files:f1", "web:f2"}
    # one read gives the worker both: the sessions to serve and the servers to stop
    work = await worker.poll()
    assert (work.pending, work.stop_mcp) == ({"s1"}, {("files", "f1"), ("web", "f2")})
    await worker.stopped({("files", "f1")})
    assert (await worker.poll()).stop_mcp == {("web", "f2")}
    await worker.stopped({("web", "f2")})
    assert "stop_mcp" not in await record(store)  # DynamoDB drops the emptied set
    await worker.done({"s1"})
    assert await worker.finish() is True

    # a task whose heartbeat expired runs nothing any more: no write
    await tier.start("t1", "c1", "s2")
    assert await worker.register(60)
    clock.now += 61
    assert await tier.stop_mcp_servers("t1", "c1", {("files", "f1")}) is False
    assert "stop_mcp" not in await record(store)


async def test_register_takes_over_an_expired_owner_or_a_missing_record(store: DynamoDBStore) -> None:
    clock = clock_of(store)
    first = ContainerTaskRecord(store, "t1", "c1", "task-1")
    second = ContainerTaskRecord(store, "t1", "c1", "task-2")
    assert await first.register(30)  # no record yet: created
    assert await first.pending() == set()
    assert await second.register(30) is False
    clock.now += 31
    assert await second.register(30)
    assert await first.beat(30) is False
    assert (await record(store))["task_owner"]["S"] == "task-2"


async def test_release_hands_the_container_to_the_next_escalation(store: DynamoDBStore, ecs: Ecs,
                                                                 tier: EcsContainerTier) -> None:
    await tier.start("t1", "c1", "s1")
    worker = ContainerTaskRecord(store, "t1", "c1", "task-1")
    assert await worker.register(60)
    assert await worker.release() is True
    assert await worker.release() is False
    assert await worker.beat(60) is False
    await tier.start("t1", "c1", "s2")
    assert len(await ecs.task_arns()) == 2
    assert pending_of(await record(store)) == {"s1", "s2"}


def test_worker_task_id_cannot_look_like_a_start_claim(store: DynamoDBStore) -> None:
    with pytest.raises(ValueError):
        ContainerTaskRecord(store, "t1", "c1", "starting:abc")
    with pytest.raises(ValueError):
        ContainerTaskRecord(store, "t1", "c1", "")


async def test_keys_are_escaped_per_tenant_and_container(store: DynamoDBStore, ecs: Ecs,
                                                        tier: EcsContainerTier) -> None:
    # a tenant id with "#" cannot get a tenant-scoped task at all (adapters/aws/tenant_scope.py): refused
    # before anything is stored; container ids are escaped in the key
    with pytest.raises(TenantNotScopable, match="cannot have a tenant-scoped sandbox"):
        await tier.start("a#b", "c", "s1")
    await tier.start("a", "b#c", "s2")
    await tier.start("a", "b", "s3")
    assert "Item" not in await store.client.get_item(
        TableName=store.table_name, Key={"PK": {"S": container_task_pk("a#b", "c")}, "SK": {"S": "CTASK"}})
    assert pending_of(await record(store, "a", "b#c")) == {"s2"}
    assert pending_of(await record(store, "a", "b")) == {"s3"}
    assert len(await ecs.task_arns()) == 2


@pytest.mark.parametrize("broken", ["task_definition", "cluster"])
async def test_run_task_error_releases_the_claim_and_keeps_the_session(
        store: DynamoDBStore, ecs: Ecs, tier: EcsContainerTier, broken: str) -> None:
    bad = make_tier(store, ecs, **{broken: f"missing-{uuid.uuid4().hex[:6]}"})
    with pytest.raises(ContainerStartFailed) as raised:
        await bad.start("t1", "c1", "s1")
    error = raised.value
    assert isinstance(error, AgentVMError)
    assert error.code == "container_start_failed"
    assert "c1" in error.message and "RunTask" in error.message
    item = await record(store)
    assert pending_of(item) == {"s1"}
    assert "task_owner" not in item and "task_until" not in item
    assert item["last_start_error"]["S"]

    await tier.start("t1", "c1", "s2")  # the next escalation retries at once
    assert len(await ecs.task_arns()) == 1
    item = await record(store)
    assert pending_of(item) == {"s1", "s2"}
    assert "last_start_error" not in item


async def test_run_task_failures_raise_and_release_the_claim(store: DynamoDBStore, ecs: Ecs,
                                                             tier: EcsContainerTier) -> None:
    client = await ecs.source.get()
    with Stubber(client.raw) as stub:
        stub.add_response("run_task", {"tasks": [], "failures": [
            {"arn": "arn:aws:ecs:us-east-1:123456789012:container-instance/x", "reason": "RESOURCE:MEMORY"}]})
        with pytest.raises(ContainerStartFailed, match="RESOURCE:MEMORY"):
            await tier.start("t1", "c1", "s1")
        stub.assert_no_pending_responses()
    item = await record(store)
    assert pending_of(item) == {"s1"}
    assert "task_owner" not in item
    assert item["last_start_error"]["S"] == "RESOURCE:MEMORY"


def test_tier_needs_a_subnet(store: DynamoDBStore, ecs: Ecs) -> None:
    with pytest.raises(ValueError):
        make_tier(store, ecs, subnets=[])
