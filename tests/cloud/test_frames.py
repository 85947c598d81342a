"""Frames per turn in the cloud, behind the emulated API Gateway edge on moto: a stock client gets
one event per frame, its text coalesced within the bound of agentvm.engine.coalescer; a client that
asked for batched frames (`?frames=batch`) gets the same events, in the same order, in fewer frames.

Time is scaled by 1/10 (the cloud's 250 ms → 2 s window becomes 25 → 200 ms, the reply is 100 deltas
10 ms apart), so a turn takes about a second.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from agentvm.adapters.aws.dynamodb_connections import DynamoDBConnections
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.cloud import runtime as cloud_runtime
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from agentvm.engine.coalescer import max_text_frames
from tests.aws_fixtures import moto_table, put_new_key, without_agentvm_env
from tests.support.cloud_edge import CloudEdge, cloud_edge
from tests.support.stock_client import StockClient

FLUSH_MS, MAX_FLUSH_MS = 25, 200
DELTAS = 100
SCRIPT = f"""
rules:
  - match: "^long"
    responses:
      - text: {orjson.dumps([f"w{i} " for i in range(DELTAS)]).decode()}
        delay_ms: 10
        usage: {{input_tokens: 500, output_tokens: 500}}
"""
FULL_TEXT = "".join(f"w{i} " for i in range(DELTAS))
TENANT = "tenant-f"
CLOSING = ["message_stop", "assistant_message", "conversation_end", "turn_response"]


@dataclass
class Cloud:
    edge: CloudEdge
    store: DynamoDBStore
    registry: DynamoDBConnections


@pytest.fixture
async def cloud(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cloud]:
    without_agentvm_env(monkeypatch)
    driver = ScriptedDriver(parse_script(SCRIPT))
    monkeypatch.setattr(cloud_runtime, "build_driver", lambda *args, **kwargs: driver)
    async with moto_table(moto_endpoint) as store:
        _, token = await put_new_key(store, TENANT)
        async with cloud_edge(moto_endpoint=moto_endpoint, token=token, table_name=store.table_name) as edge:
            env = {**edge.handler_env(), "AVM_CHAT_TURN_FUNCTION": "agentvm-chat-turn:live",
                   "AVM_RELIABLE_WRAPPER": "false", "AVM_STREAM_FLUSH_MS": str(FLUSH_MS),
                   "AVM_STREAM_MAX_FLUSH_MS": str(MAX_FLUSH_MS)}
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            yield Cloud(edge, store, DynamoDBConnections(store))


def frame_types(frames: list[Any]) -> list[Any]:
    return [[e["type"] for e in f] if isinstance(f, list) else f["type"] for f in frames]


def flat(frames: list[Any]) -> list[dict[str, Any]]:
    return [e for f in frames for e in (f if isinstance(f, list) else [f])]


def same_frame(frames: list[Any], *groups: list[str]) -> None:
    """Each group (consecutive event types, first occurrence) arrived in one frame. Other events may
    share frames too (those queued while the previous post was in flight)."""
    where = [(i, e["type"]) for i, f in enumerate(frames) for e in (f if isinstance(f, list) else [f])]
    types = [t for _, t in where]
    for group in groups:
        start = next(i for i in range(len(types)) if types[i:i + len(group)] == group)
        assert len({where[i][0] for i in range(start, start + len(group))}) == 1, (group, frame_types(frames))


def check_text_bound(events: list[dict[str, Any]]) -> int:
    """The text frames of the turn's one message are within the bound for the time they span."""
    texts = [e for e in events if e["type"] == "text_delta"]
    assert "".join(e["data"]["text"] for e in texts) == FULL_TEXT
    span_ms = texts[-1]["timestamp"] - texts[0]["timestamp"] + 1  # timestamps are whole ms
    assert 2 <= len(texts) <= max_text_frames(span_ms, FLUSH_MS, MAX_FLUSH_MS)
    return len(texts)


async def turn(sender: StockClient, image_id: str, *others: StockClient) -> list[int]:
    """Send a long message from `sender`; wait for `turn_response` on every client. The index where each
    client's frames of this turn start (sender first)."""
    clients = (sender, *others)
    starts = [len(c.raw) for c in clients]
    events = [len(c.events) for c in clients]
    await sender.request("message_send_request", {"imageId": image_id, "content": "long answer please"})
    for client, start in zip(clients, events, strict=True):
        await client.wait_type("turn_response", start=start, timeout=30)
    return starts


async def test_stock_and_batched_clients_get_the_same_events_and_the_bounded_frames(cloud: Cloud) -> None:
    async with StockClient(cloud.edge.url, ack=False) as a, StockClient(cloud.edge.url, ack=False, batch=True) as b:
        image = await a.new_image("c-frames")
        await a.turn(image["imageId"], "hello")  # the first message also registers the agent
        await b.request("image_get_request", {"imageId": image["imageId"]})  # b subscribes
        await cloud.edge.settle(include_invokes=True)
        records = [await cloud.registry.get_connection(c) for c in cloud.edge.connection_ids()]
        [b_conn] = [r.connection_id for r in records if r is not None and r.batch]
        subs = {s.connection_id: s.batch for s in await cloud.registry.subscribers(TENANT, image["sessionId"])}
        assert subs[b_conn] is True and [v for c, v in subs.items() if c != b_conn] == [False]

        # ---- a (stock) sends; b (batched) watches
        a0, b0 = await turn(a, image["imageId"], b)
        await cloud.edge.settle(include_invokes=True)
        a_frames, b_frames = a.raw[a0:], b.raw[b0:]
        assert all(isinstance(f, dict) for f in a_frames)  # one event per frame, as ever
        n = check_text_bound(a_frames)
        assert frame_types(a_frames) == [
            "message_persisted", "message_send_response", "message_start", "conversation_start", "text_delta",
            "conversation_responding", *["text_delta"] * (n - 1), *CLOSING]  # 9 fixed frames + the text
        # the stock client's frames are the stored events, unchanged
        stored = await cloud.store.read_events(TENANT, image["sessionId"], a_frames[0]["seq"] - 1)
        assert [e for e in a_frames if "seq" in e] == [orjson.loads(e.payload) for e in stored
                                                       if e.type != "user_message"]  # not to its sender

        # b: the same session events, in the same order, in fewer frames
        b_events = flat(b_frames)
        assert [e for e in b_events if e["type"] != "user_message"] == [e for e in a_frames if "seq" in e]
        same_frame(b_frames, ["message_persisted", "user_message"], ["message_start", "conversation_start"],
                   ["text_delta", "conversation_responding"], CLOSING)
        assert frame_types(b_frames)[-1][-4:] == CLOSING  # the last text rides with the closing events
        assert len(b_frames) <= len(a_frames) - 5

        # ---- b (batched) sends; a (stock) watches
        b1, a1 = await turn(b, image["imageId"], a)
        await cloud.edge.settle(include_invokes=True)
        b_frames, a_frames = b.raw[b1:], a.raw[a1:]
        n = check_text_bound(a_frames)
        assert frame_types(a_frames) == [
            "message_persisted", "user_message", "message_start", "conversation_start", "text_delta",
            "conversation_responding", *["text_delta"] * (n - 1), *CLOSING]
        b_events = flat(b_frames)
        assert [e for e in b_events if "seq" in e] == [e for e in a_frames if e["type"] != "user_message"]
        # the announcement is posted (and the lease released) before the turn is dispatched, and the
        # response after: they cannot share a frame without reordering against chat_turn's events
        assert frame_types(b_frames)[:2] == ["message_persisted", "message_send_response"]
        same_frame(b_frames, ["message_start", "conversation_start"], ["text_delta", "conversation_responding"],
                   CLOSING)
        assert len(b_frames) <= len(a_frames) - 5

        # ---- replay: a batched subscriber with afterSeq=0 gets the log in order, in batches of <= 32 KB
        async with StockClient(cloud.edge.url, ack=False, batch=True) as c:
            start = len(c.raw)
            await c.send_raw({"type": "subscribe", "sessionId": image["sessionId"], "afterSeq": 0})
            stored = await cloud.store.read_events(TENANT, image["sessionId"], 0)
            await c.wait_for(lambda e: e.get("seq") == stored[-1].seq, timeout=10)
            await cloud.edge.settle()
            replayed = flat(c.raw[start:])
            assert replayed == [orjson.loads(e.payload) for e in stored]
            assert len(c.raw[start:]) < len(replayed)
