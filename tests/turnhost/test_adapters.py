"""The turn-host adapters on moto: the SQS queue (send, batch receive, batch delete, malformed
messages dropped) and the directory on the table (heartbeat, list, deregister)."""

from __future__ import annotations

import uuid

from agentvm.adapters.aws.botocore_async import new_client
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.dynamodb_turn_hosts import DynamoDBTurnHosts
from agentvm.adapters.aws.sqs_turn_queue import SqsTurnQueue
from agentvm.domain.models import LeaseHandoff
from agentvm.domain.turn_hosts import TurnHostRecord, TurnRequest
from tests.aws_fixtures import REGION


async def test_the_queue_round_trip(aws_env: None, moto_endpoint: str) -> None:
    sqs = new_client("sqs", endpoint_url=moto_endpoint, region_name=REGION)
    url = (await sqs.create_queue(QueueName=f"turns-{uuid.uuid4().hex[:8]}"))["QueueUrl"]
    queue = SqsTurnQueue(url, endpoint_url=moto_endpoint, region_name=REGION)
    try:
        for i in range(12):
            await queue.send("t1", f"s{i}", handoff=LeaseHandoff(f"ws/turn-{i}", i + 1) if i % 2 else None)
        await sqs.send_message(QueueUrl=url, MessageBody='{"tenantId": 5}')
        got: list[TurnRequest] = []
        while len(got) < 12:
            batch = await queue.receive(10, 0)
            assert len(batch) <= 10
            await queue.delete(batch)
            got += batch
        assert sorted(int(r.session_id[1:]) for r in got) == list(range(12))
        assert {r.tenant_id for r in got} == {"t1"} and all(r.receipt for r in got)
        # the lease a ws_default passed on travels with the request
        assert {r.session_id: r.handoff for r in got} == {
            f"s{i}": LeaseHandoff(f"ws/turn-{i}", i + 1) if i % 2 else None for i in range(12)}
        attrs = (await sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]))["Attributes"]
        assert (attrs["ApproximateNumberOfMessages"], attrs["ApproximateNumberOfMessagesNotVisible"]) == ("0", "0")
        assert await queue.receive(10, 0) == []
    finally:
        await queue.close()
        await sqs.close()


async def test_the_directory_on_the_table(aws_env: None, moto_endpoint: str) -> None:
    store = DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", endpoint_url=moto_endpoint, region_name=REGION)
    await store.open()
    await store.create_table()
    try:
        hosts = DynamoDBTurnHosts(store)
        assert await hosts.list_hosts() == []
        a = TurnHostRecord("host-a#1", 1_000, 200, 3, True)
        await hosts.heartbeat(a)
        await hosts.heartbeat(TurnHostRecord("host-b", 2_000, 10, 10, False))
        await hosts.heartbeat(TurnHostRecord("host-a#1", 3_000, 200, 4, True))
        assert sorted(await hosts.list_hosts(), key=lambda h: h.host_id) == [
            TurnHostRecord("host-a#1", 3_000, 200, 4, True), TurnHostRecord("host-b", 2_000, 10, 10, False)]
        item = (await store.client.get_item(TableName=store.table_name,
                                            Key={"PK": {"S": "TURNHOST"}, "SK": {"S": "HOST#host-a%231"}}))["Item"]
        assert item["expires_at"] == {"N": str(3 + 3600)}
        await hosts.deregister("host-a#1")
        assert [h.host_id for h in await hosts.list_hosts()] == ["host-b"]
    finally:
        await store.close()
