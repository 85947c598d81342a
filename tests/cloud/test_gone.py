"""A client that disappears mid-turn in the cloud: API Gateway answers `GoneException` to posts.

The handlers run behind the emulated edge (tests/support/cloud_edge.py) on moto. The vanished client
gets no `$disconnect` here (API Gateway does not guarantee one), so what cleans up is the
`GoneException` path alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from agentvm.adapters.aws.dynamodb_connections import DynamoDBConnections
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.cloud import runtime as cloud_runtime
from agentvm.domain.models import TurnStatus
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from tests.aws_fixtures import moto_table, put_new_key, without_agentvm_env
from tests.support.cloud_edge import CloudEdge, cloud_edge
from tests.support.stock_client import StockClient

SCRIPT = """
rules:
  - match: "^long"
    responses:
      - text: ["one ", "two ", "three ", "four ", "five ", "six ", "seven ", "eight ", "nine ", "ten"]
        delay_ms: 100
        usage: {input_tokens: 20, output_tokens: 10}
"""
FULL_TEXT = "one two three four five six seven eight nine ten"


@dataclass
class Cloud:
    edge: CloudEdge
    store: DynamoDBStore
    registry: DynamoDBConnections
    driver: ScriptedDriver


@pytest.fixture
async def cloud(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cloud]:
    without_agentvm_env(monkeypatch)
    driver = ScriptedDriver(parse_script(SCRIPT))
    monkeypatch.setattr(cloud_runtime, "build_driver", lambda *args, **kwargs: driver)
    async with moto_table(moto_endpoint) as store:
        _, token = await put_new_key(store, "tenant-g")
        async with cloud_edge(moto_endpoint=moto_endpoint, token=token, table_name=store.table_name) as edge:
            env = {**edge.handler_env(), "AVM_CHAT_TURN_FUNCTION": "agentvm-chat-turn:live",
                   "AVM_RELIABLE_WRAPPER": "false", "AVM_STREAM_FLUSH_MS": "0"}
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            yield Cloud(edge, store, DynamoDBConnections(store), driver)


def session_events(client: StockClient, start: int) -> list[dict[str, Any]]:
    return [e for e in client.events[start:] if "seq" in e]


async def test_a_vanished_client_leaves_a_complete_turn_and_the_other_subscriber_gets_everything(
        cloud: Cloud) -> None:
    async with StockClient(cloud.edge.url, ack=False) as a:
        image = await a.new_image("c-gone")
        [a_conn] = cloud.edge.connection_ids()
        async with StockClient(cloud.edge.url, ack=False) as b:
            await b.request("image_get_request", {"imageId": image["imageId"]})  # b subscribes
            await cloud.edge.settle()
            await _vanish_mid_turn(cloud, a, b, image, a_conn)


async def _vanish_mid_turn(cloud: Cloud, a: StockClient, b: StockClient, image: dict[str, Any], a_conn: str) -> None:
    """a sends, a vanishes after the first delta; b (subscribed) must get the whole turn."""
    b_start = len(b.events)
    await a.request("message_send_request", {"imageId": image["imageId"], "content": "long answer"})
    await a.wait_type("text_delta")
    cloud.edge.vanish(a_conn)
    end = await b.wait_type("turn_response", start=b_start, timeout=20)
    await cloud.edge.settle(include_invokes=True)

    # b got the whole turn, in order, exactly once
    got = session_events(b, b_start)
    seqs = [e["seq"] for e in got]
    assert seqs == sorted(set(seqs))
    types = [e["type"] for e in got]
    assert types[:2] == ["message_persisted", "user_message"]
    assert types[-4:] == ["message_stop", "assistant_message", "conversation_end", "turn_response"]
    assert "".join(e["data"]["text"] for e in got if e["type"] == "text_delta") == FULL_TEXT
    assert end["data"]["status"] == "completed"
    stored = await cloud.store.read_events("tenant-g", image["sessionId"], 0)
    assert [e.seq for e in stored if e.seq >= seqs[0]] == seqs  # nothing b missed

    # the turn and its messages are stored complete
    [turn] = await cloud.store.list_turns("tenant-g", image["sessionId"])
    assert turn.status == TurnStatus.COMPLETED and turn.usage.output_tokens == 10
    messages = await cloud.store.list_messages("tenant-g", image["sessionId"])
    assert [m.body["content"] if m.body["subtype"] == "user" else m.body["content"][0]["text"]
            for m in messages] == ["long answer", FULL_TEXT]

    # the vanished connection left no record behind; b's are intact
    assert await cloud.registry.get_connection(a_conn) is None
    subscribers = {s.connection_id for s in await cloud.registry.subscribers("tenant-g", image["sessionId"])}
    assert a_conn not in subscribers and subscribers
    assert a_conn not in await cloud.registry.watchers("tenant-g", "c-gone")
    assert len(cloud.edge.connection_ids()) == 2  # a's socket is open: only its network path is gone


async def test_when_every_subscriber_is_gone_the_llm_stream_stops_and_the_turn_is_stored(cloud: Cloud) -> None:
    async with StockClient(cloud.edge.url, ack=False) as a:
        image = await a.new_image("c-alone")
        [a_conn] = cloud.edge.connection_ids()
        await a.request("message_send_request", {"imageId": image["imageId"], "content": "long answer"})
        await a.wait_type("text_delta")
        cloud.edge.vanish(a_conn)
        await cloud.edge.settle(include_invokes=True, timeout=20)

    [turn] = await cloud.store.list_turns("tenant-g", image["sessionId"])
    assert turn.status == TurnStatus.INTERRUPTED
    assert turn.error_code == "no_listeners"
    messages = await cloud.store.list_messages("tenant-g", image["sessionId"])
    partial = messages[-1].body["content"][0]["text"]
    assert partial.startswith("one ") and partial != FULL_TEXT  # stopped early: tokens nobody would see
    assert await cloud.registry.get_connection(a_conn) is None
