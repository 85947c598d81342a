"""AgentVMClient (and `avm chat`) against a small scripted fake AgentX server on a real socket."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import socket
import threading
import time
from argparse import Namespace
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import Any

import pytest
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from agentvm_client import (
    AgentVMClient,
    ClientClosed,
    ConnectError,
    ConnectionLost,
    ConnectionRefused,
    RequestFailed,
    RequestTimeout,
)
from agentvm_client.turns import _TurnTracker
from avm.chat import run_chat

Event = dict[str, Any]
RequestHandler = Callable[["FakeAgentX", ServerConnection, Event], Awaitable[None]]

IMAGE = "img_1"
SESSION = "sess_1"
CTX = {"containerId": "c1", "imageId": IMAGE, "agentId": "agent_1", "sessionId": SESSION}


def ev(type_: str, data: dict[str, Any] | None = None, *, context: dict[str, str] | None = None,
       seq: int | None = None, category: str = "stream") -> Event:
    out: Event = {"type": type_, "timestamp": 1, "data": data or {}, "source": "agent", "category": category,
                  "intent": "notification"}
    if context is not None:
        out["context"] = context
    if seq is not None:
        out["seq"] = seq
    return out


class FakeAgentX:
    """A scripted AgentX server: wraps what it sends, records every frame, keeps a per-session seq log."""

    def __init__(self, *, require_token: str | None = None) -> None:
        self.require_token = require_token
        self.refuse_from: int | None = None  # connections from this index on: accepted, then closed 1008
        self.frames: list[tuple[int, Event]] = []  # (connection index, frame) in arrival order
        self.conns: list[ServerConnection] = []
        self.on_request: dict[str, RequestHandler] = {}
        self.logs: dict[str, list[Event]] = {}
        self.live: dict[ServerConnection, set[str]] = {}
        self.sent_ids = 0
        self.server: Server | None = None
        self.url = ""

    async def __aenter__(self) -> FakeAgentX:
        self.server = await serve(self._handle, "127.0.0.1", 0, process_request=self._check_auth)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}/ws"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    def _check_auth(self, connection: ServerConnection, request: Request) -> Response | None:
        if self.require_token and request.headers.get("Authorization") != f"Bearer {self.require_token}":
            return connection.respond(HTTPStatus.UNAUTHORIZED, "unauthorized\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        index = len(self.conns)
        self.conns.append(ws)
        if self.refuse_from is not None and index >= self.refuse_from:  # as avm serve answers a bad key
            await ws.close(1008, "API key revoked")
            return
        self.live[ws] = set()
        try:
            async for raw in ws:
                frame = json.loads(raw)
                self.frames.append((index, frame))
                if frame.get("type") == "subscribe":
                    await self._subscribe(ws, frame)
                elif str(frame.get("type", "")).endswith("_request"):
                    handler = self.on_request.get(frame["type"])
                    if handler is not None:
                        await handler(self, ws, frame)
        except ConnectionClosed:
            pass
        finally:
            self.live.pop(ws, None)

    async def _subscribe(self, ws: ServerConnection, frame: Event) -> None:
        session = frame["sessionId"]
        after = frame.get("afterSeq")
        if after is not None:
            for event in self.logs.get(session, []):
                if event["seq"] > after:
                    await ws.send(json.dumps(event))  # replay goes out plain, like the reference
        self.live[ws].add(session)

    # sending ------------------------------------------------------------------------------------------

    async def send(self, ws: ServerConnection, event: Event, *, wrap: bool = True) -> str | None:
        if not wrap:
            await ws.send(json.dumps(event))
            return None
        self.sent_ids += 1
        msg_id = f"conn_x_{self.sent_ids}"
        await ws.send(json.dumps({"__msgId": msg_id, "__payload": json.dumps(event)}))
        return msg_id

    async def respond(self, ws: ServerConnection, request: Event, **data: Any) -> None:
        await self.send(ws, {"type": request["type"].replace("_request", "_response"), "timestamp": 1,
                             "data": {"requestId": request["data"]["requestId"], **data},
                             "source": "command", "category": "response", "intent": "result"})

    async def publish(self, type_: str, data: dict[str, Any] | None = None, *, session: str = SESSION,
                      context: dict[str, str] | None = None, category: str = "stream") -> Event:
        """Append a session event to the log (next seq) and send it to live subscribers."""
        log = self.logs.setdefault(session, [])
        event = ev(type_, data, context=context or {**CTX, "sessionId": session}, seq=len(log) + 1,
                   category=category)
        log.append(event)
        for ws, sessions in list(self.live.items()):
            if session in sessions:
                with _suppress_closed():
                    await self.send(ws, event)
        return event

    def drop(self, ws: ServerConnection) -> None:
        """Kill the TCP connection without a close handshake (a network failure)."""
        self.live.pop(ws, None)
        ws.transport.abort()

    # inspecting ---------------------------------------------------------------------------------------

    def requests(self, conn: int | None = None) -> list[Event]:
        return [f for i, f in self.frames if "__ack" not in f and (conn is None or i == conn)]

    def acks(self, conn: int | None = None) -> list[str]:
        return [f["__ack"] for i, f in self.frames if "__ack" in f and (conn is None or i == conn)]


class _suppress_closed:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> bool:
        return exc_type is not None and issubclass(exc_type, ConnectionClosed)


async def until(cond: Callable[[], bool], within: float = 2.0) -> None:
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.002)


async def echo(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
    await fake.respond(ws, request, echo={k: v for k, v in request["data"].items() if k != "requestId"})


@pytest.fixture
async def fake() -> AsyncIterator[FakeAgentX]:
    async with FakeAgentX() as server:
        yield server


def make_client(fake: FakeAgentX, **kwargs: Any) -> AgentVMClient:
    kwargs.setdefault("min_reconnect_delay", 0.01)
    kwargs.setdefault("max_reconnect_delay", 0.05)
    kwargs.setdefault("request_timeout", 2.0)
    return AgentVMClient(fake.url, **kwargs)


# ------------------------------------------------------------------------------ requests


async def test_request_frame_shape_context_merge_and_ack(fake: FakeAgentX) -> None:
    fake.on_request["container_create_request"] = echo
    async with make_client(fake, context={"userId": "alice", "containerId": "from-context"}) as client:
        res = await client.request("container_create", {"containerId": "c1"})

    [frame] = fake.requests()
    request_id = frame["data"]["requestId"]
    assert re.fullmatch(r"req_\d{13}_[0-9a-z]{6}", request_id)
    assert frame == {"type": "container_create_request", "timestamp": frame["timestamp"],
                     "data": {"userId": "alice", "containerId": "c1", "requestId": request_id},
                     "source": "command", "category": "request", "intent": "request"}
    assert list(frame["data"]) == ["userId", "containerId", "requestId"]
    await until(lambda: len(fake.acks()) == 1)
    assert isinstance(frame["timestamp"], int)
    assert res["type"] == "container_create_response"
    assert res["data"] == {"requestId": request_id, "echo": {"userId": "alice", "containerId": "c1"}}
    assert fake.acks() == ["conn_x_1"]


async def test_wrapped_events_are_acked_in_order_and_plain_ones_are_not(fake: FakeAgentX) -> None:
    async def emit(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        await fake.send(ws, ev("a"))                                    # conn_x_1
        await fake.send(ws, ev("b"), wrap=False)                        # plain: processed, no ACK
        await ws.send(json.dumps({"__msgId": "odd", "__payload": {"type": "x"}}))  # ACKed, then dropped
        await ws.send("not json")
        await ws.send(json.dumps(["not", "an", "object"]))
        await fake.send(ws, ev("c"))                                    # conn_x_2
        await fake.respond(ws, request)                                 # conn_x_3

    fake.on_request["emit_request"] = emit
    seen: list[str] = []
    async with make_client(fake) as client:
        client.on("*", lambda e: seen.append(e["type"]))
        await client.request("emit")
        await until(lambda: len(seen) == 3)
        await asyncio.sleep(0.02)
    await until(lambda: len(fake.acks()) == 4)
    assert seen == ["a", "b", "c"]  # the matched response is not dispatched
    assert fake.acks() == ["conn_x_1", "odd", "conn_x_2", "conn_x_3"]


async def test_out_of_order_responses_are_correlated_by_request_id(fake: FakeAgentX) -> None:
    held: list[tuple[ServerConnection, Event]] = []

    async def hold(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        held.append((ws, request))
        if len(held) == 3:
            for w, r in reversed(held):
                await echo(fake, w, r)
            # a response nobody waits for is an ordinary event
            await fake.send(ws, {"type": "echo_response", "data": {"requestId": "req_other"},
                                 "category": "response"})

    fake.on_request["echo_request"] = hold
    by_type: list[str] = []
    everything: list[str] = []
    async with make_client(fake) as client:
        client.on("echo_response", lambda e: by_type.append(e["data"]["requestId"]))
        client.on("*", lambda e: everything.append(e["data"]["requestId"]))
        results = await asyncio.gather(client.request("echo", {"n": 1}),
                                       client.request("echo_request", {"n": 2}),
                                       client.request("echo", {"n": 3}))
        await until(lambda: len(everything) == 1)
    assert [r["data"]["echo"]["n"] for r in results] == [1, 2, 3]
    assert [r["type"] for r in results] == ["echo_response"] * 3
    assert by_type == ["req_other"]
    assert everything == ["req_other"]


async def test_request_timeout_then_late_response_is_dispatched(fake: FakeAgentX) -> None:
    late: list[Event] = []
    async with make_client(fake) as client:
        client.on("never_response", late.append)
        with pytest.raises(RequestTimeout, match=r"^Request timeout: never_request \(0.05s\)$") as info:
            await client.request("never", timeout=0.05)
        assert isinstance(info.value, asyncio.TimeoutError)
        [frame] = fake.requests()
        await fake.respond(fake.conns[0], frame, value=1)
        await until(lambda: len(late) == 1)
    assert late[0]["data"]["value"] == 1


async def test_request_ok_raises_request_failed_but_request_does_not(fake: FakeAgentX) -> None:
    async def fail(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        await fake.respond(ws, request, error="Image not found: img_x")

    fake.on_request["image_get_request"] = fail
    async with make_client(fake) as client:
        res = await client.request("image_get", {"imageId": "img_x"})
        assert res["data"]["error"] == "Image not found: img_x"
        with pytest.raises(RequestFailed, match=r"^Image not found: img_x$") as info:
            await client.request_ok("image_get", {"imageId": "img_x"})
    assert info.value.response["type"] == "image_get_response"


# ------------------------------------------------------------------------- subscriptions


async def test_response_subscriptions_are_subscribed_once_before_request_returns(fake: FakeAgentX) -> None:
    async def image_create(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        await fake.respond(ws, request, record={"imageId": IMAGE}, __subscriptions=["s1", "s2"])

    async def image_list(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        await fake.respond(ws, request, records=[], __subscriptions=["s1", "s3", ""])

    fake.on_request.update({"image_create_request": image_create, "image_list_request": image_list,
                            "container_list_request": echo})
    async with make_client(fake) as client:
        await client.request("image_create")
        await client.request("image_list")
        await client.request("container_list")
        await client.subscribe("s4")
        await client.subscribe("s4")
        await client.subscribe("s1")
        await until(lambda: len(fake.requests()) == 7)
        subscriptions = client.subscriptions

    assert [(f["type"], f.get("sessionId")) for f in fake.requests()] == [
        ("image_create_request", None), ("subscribe", "s1"), ("subscribe", "s2"),
        ("image_list_request", None), ("subscribe", "s3"),
        ("container_list_request", None), ("subscribe", "s4"),
    ]
    assert all(set(f) == {"type", "sessionId"} for f in fake.requests() if f["type"] == "subscribe")
    assert subscriptions == ("s1", "s2", "s3", "s4")


# ------------------------------------------------------------------------------ handlers


async def test_handlers_sync_async_wildcard_unsubscribe_and_errors(
        fake: FakeAgentX, caplog: pytest.LogCaptureFixture) -> None:
    fake.on_request["echo_request"] = echo
    calls: list[str] = []

    def sync_handler(e: Event) -> None:
        calls.append(f"sync:{e['data']['n']}")

    async def async_handler(e: Event) -> None:
        await asyncio.sleep(0.001)
        calls.append(f"async:{e['data']['n']}")

    def broken(e: Event) -> None:
        raise ValueError("boom")

    async def broken_async(e: Event) -> None:
        raise RuntimeError("async boom")

    async with make_client(fake) as client:
        async def calls_back(e: Event) -> None:  # a handler may itself make requests
            res = await client.request("echo", {"from": "handler"})
            calls.append(f"request:{res['data']['echo']['from']}")

        remove_sync = client.on("tick", sync_handler)
        client.on("tick", broken)
        client.on("tick", async_handler)
        client.on("tick", broken_async)
        client.on("*", lambda e: calls.append(f"*:{e['type']}"))
        remove_calls_back = client.on("tock", calls_back)
        ws = fake.conns[0]
        with caplog.at_level(logging.ERROR, logger="agentvm_client"):
            await fake.send(ws, ev("tick", {"n": 1}))
            await fake.send(ws, ev("tock", {"n": 2}), wrap=False)
            await until(lambda: len(calls) == 5)
            remove_sync()
            remove_sync()  # idempotent
            remove_calls_back()
            await fake.send(ws, ev("tick", {"n": 3}))
            await fake.send(ws, ev("tock", {"n": 4}))
            await until(lambda: len(calls) == 8)
            await asyncio.sleep(0.02)

    assert calls == ["sync:1", "async:1", "*:tick", "request:handler", "*:tock",
                     "async:3", "*:tick", "*:tock"]
    errors = [r.getMessage() for r in caplog.records]
    assert errors.count("handler for tick raised") == 4


async def test_events_at_or_below_the_last_seq_are_dropped(fake: FakeAgentX) -> None:
    seen: list[tuple[str | None, int | None]] = []
    async with make_client(fake) as client:
        client.on("*", lambda e: seen.append((e.get("context", {}).get("sessionId"), e.get("seq"))))
        ws = fake.conns[0]
        other = {**CTX, "sessionId": "sess_2"}
        script = [(1, CTX, True), (2, CTX, True), (2, CTX, False), (1, CTX, True), (1, other, True),
                  (3, CTX, False), (3, CTX, True), (4, CTX, True), (1, other, False)]
        for seq, ctx, wrap in script:
            await fake.send(ws, ev("text_delta", {"text": "x"}, context=ctx, seq=seq), wrap=wrap)
        await fake.send(ws, ev("no_seq", context=CTX))
        await fake.send(ws, ev("global_event", seq=1))  # no session: seq is not tracked
        await until(lambda: len(seen) == 7)
        await asyncio.sleep(0.02)
        assert client.last_seq(SESSION) == 4
        assert client.last_seq("sess_2") == 1
        assert client.last_seq("sess_3") is None
    assert seen == [(SESSION, 1), (SESSION, 2), ("sess_2", 1), (SESSION, 3), (SESSION, 4), (SESSION, None),
                    (None, 1)]
    await until(lambda: len(fake.acks()) == 8)  # every wrapper is ACKed, duplicates included
    await asyncio.sleep(0.02)
    assert len(fake.acks()) == 8


# ----------------------------------------------------------------------------- reconnect


async def test_reconnect_resubscribes_with_after_seq_and_loses_nothing(fake: FakeAgentX) -> None:
    async def image_get(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        await fake.respond(ws, request, record={"imageId": IMAGE}, __subscriptions=[SESSION])

    fake.on_request["image_get_request"] = image_get
    seqs: list[int] = []
    hooks: list[str] = []

    async def reconnected() -> None:
        hooks.append(f"reconnected:{len(seqs)}")

    async with make_client(fake) as client:
        client.on("text_delta", lambda e: seqs.append(e["seq"]))
        client.on_disconnected(lambda: hooks.append(f"disconnected:{len(seqs)}"))
        client.on_reconnected(reconnected)
        await client.request("image_get", {"imageId": IMAGE})
        await until(lambda: SESSION in fake.live.get(fake.conns[0], set()))
        for i in range(1, 5):
            await fake.publish("text_delta", {"text": str(i)})
        await until(lambda: client.last_seq(SESSION) == 4)
        fake.drop(fake.conns[0])
        for i in range(5, 8):  # published while the client is away
            await fake.publish("text_delta", {"text": str(i)})
        await until(lambda: SESSION in fake.live.get(fake.conns[-1], set()) and len(fake.conns) == 2)
        await fake.publish("text_delta", {"text": "8"})  # live again
        await until(lambda: len(seqs) == 8)
        res = await client.request("image_get", {"imageId": IMAGE})  # requests work on the new socket
        assert res["data"]["record"] == {"imageId": IMAGE}
        assert client.connected

    assert seqs == list(range(1, 9))
    assert hooks == ["disconnected:4", "reconnected:4"]
    assert fake.requests(1)[0] == {"type": "subscribe", "sessionId": SESSION, "afterSeq": 4}
    assert [f["type"] for f in fake.requests(1)] == ["subscribe", "image_get_request"]
    await until(lambda: len(fake.acks(1)) == 2)  # the live event and the response; the replay is plain
    await asyncio.sleep(0.02)
    assert len(fake.acks(1)) == 2


async def test_drop_mid_stream_every_event_once_in_order(fake: FakeAgentX) -> None:
    seqs: list[int] = []
    async with make_client(fake) as client:
        client.on("text_delta", lambda e: seqs.append(e["seq"]))
        await client.subscribe(SESSION)
        await until(lambda: SESSION in fake.live.get(fake.conns[0], set()))
        for i in range(1, 31):
            await fake.publish("text_delta", {"text": str(i)})
        fake.drop(fake.conns[0])  # frames still in the server's buffers are lost
        for i in range(31, 41):
            await fake.publish("text_delta", {"text": str(i)})
        await until(lambda: len(fake.conns) == 2 and SESSION in fake.live.get(fake.conns[1], set()))
        for i in range(41, 51):
            await fake.publish("text_delta", {"text": str(i)})
        await until(lambda: len(seqs) == 50)
        await asyncio.sleep(0.02)
        after = fake.requests(1)[0]["afterSeq"]
    assert seqs == list(range(1, 51))
    assert 0 <= after <= 30


async def test_pending_request_fails_with_connection_lost_and_is_not_resent(fake: FakeAgentX) -> None:
    async def drop(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        fake.drop(ws)

    fake.on_request["slow_request"] = drop
    fake.on_request["echo_request"] = echo
    async with make_client(fake, request_timeout=5.0) as client:
        started = time.monotonic()
        with pytest.raises(ConnectionLost):
            await client.request("slow")
        assert time.monotonic() - started < 1.0
        res = await client.request("echo", {"n": 1})  # waits for the reconnect, then goes out
        assert res["data"]["echo"] == {"n": 1}
    assert [f["type"] for f in fake.requests()] == ["slow_request", "echo_request"]
    assert [i for i, _ in fake.frames if "__ack" not in _] == [0, 1]


async def test_a_reconnect_closed_at_once_with_1008_gives_up_with_the_reason(fake: FakeAgentX) -> None:
    async with make_client(fake) as client:
        await client.subscribe(SESSION)  # the reconnect sends a subscribe: it may meet the close
        await until(lambda: SESSION in fake.live.get(fake.conns[0], set()))
        fake.refuse_from = 1
        fake.drop(fake.conns[0])
        await until(lambda: client.failed is not None)
        assert isinstance(client.failed, ConnectionRefused)
        assert (client.failed.code, client.failed.reason) == (1008, "API key revoked")
        with pytest.raises(ConnectionRefused, match=r"^the server refused the connection: API key revoked"):
            await client.request("echo")
        await asyncio.sleep(0.2)  # no more attempts: they would be refused again
        assert len(fake.conns) == 2
        assert not client.connected


async def test_a_request_on_a_connection_closed_at_once_with_1008_raises_the_reason(fake: FakeAgentX) -> None:
    fake.refuse_from = 0
    async with make_client(fake) as client:
        with pytest.raises(ConnectionRefused) as refused:
            await client.request("echo")
        assert (refused.value.code, refused.value.reason) == (1008, "API key revoked")
    assert len(fake.conns) == 1  # not reconnected


async def test_without_reconnect_a_drop_is_final(fake: FakeAgentX) -> None:
    async with make_client(fake, reconnect=False) as client:
        fake.drop(fake.conns[0])
        await until(lambda: client.failed is not None)
        with pytest.raises(ConnectionLost):
            await client.request("echo")
    assert len(fake.conns) == 1


# ------------------------------------------------------------------------- connect/close


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_connect_failure_raises_connect_error() -> None:
    client = AgentVMClient(f"ws://127.0.0.1:{_free_port()}/ws", connect_timeout=1.0)
    with pytest.raises(ConnectError, match=r"^cannot connect to ws://127\.0\.0\.1:\d+/ws: "):
        await client.connect()
    await client.close()


async def test_token_is_sent_as_bearer_header_and_rejection_is_reported() -> None:
    async with FakeAgentX(require_token="sekrit") as fake:
        fake.on_request["echo_request"] = echo
        async with AgentVMClient(fake.url, token="sekrit") as client:
            await client.request("echo")
        assert fake.conns[0].request is not None
        assert fake.conns[0].request.headers["Authorization"] == "Bearer sekrit"
        with pytest.raises(ConnectError, match=r"refused the connection \(HTTP 401\)") as info:
            await AgentVMClient(fake.url, token="wrong").connect()
        assert info.value.status == 401


async def test_close_fails_pending_requests_and_leaves_no_tasks(fake: FakeAgentX) -> None:
    client = make_client(fake)
    await client.connect()
    pending = asyncio.ensure_future(client.request("never"))
    await until(lambda: len(fake.requests()) == 1)
    await client.close()
    await client.close()
    with pytest.raises(ClientClosed):
        await pending
    with pytest.raises(ClientClosed):
        await client.request("echo")
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("agentvm-client")]


# -------------------------------------------------------------------------- send_message


def turn_script(text_parts: list[str], *, message_id: str, llm_id: str = "msg_01") -> list[tuple[str, Event]]:
    script: list[tuple[str, Event]] = [("message_start", {"messageId": llm_id, "model": "m"}),
                                      ("conversation_start", {"messageId": llm_id})]
    script += [("text_delta", {"text": t}) for t in text_parts]
    script += [("message_stop", {"stopReason": "end_turn"}),
               ("assistant_message", {"id": llm_id,
                                      "content": [{"type": "text", "text": "".join(text_parts)}]}),
               ("conversation_end", {"reason": "completed"}),
               ("turn_response", {"turnId": f"turn_{message_id}", "messageId": llm_id,
                                  "usage": {"inputTokens": 3, "outputTokens": 5},
                                  "cost": {"billed": "0.01"}})]
    return script


async def play(fake: FakeAgentX, script: list[tuple[str, Event]]) -> None:
    for type_, data in script:
        await fake.publish(type_, data)


async def test_send_message_collects_the_turn(fake: FakeAgentX) -> None:
    async def message_send(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        fake.live[ws].add(SESSION)  # AgentVM subscribes the sender
        await fake.publish("message_persisted", {"messageId": "m1"}, category="persist")
        await fake.respond(ws, request, imageId=IMAGE, agentId="agent_1")
        await play(fake, turn_script(["Hel", "lo"], message_id="m1"))

    fake.on_request["message_send_request"] = message_send
    seen: list[str] = []
    async with make_client(fake) as client:
        result = await client.send_message(IMAGE, "Hi", on_event=lambda e: seen.append(e["type"]))
    [request] = fake.requests()
    assert request["data"]["content"] == "Hi" and request["data"]["imageId"] == IMAGE
    assert "sessionId" not in request["data"]
    assert result.text == "Hello" and result.reason == "completed" and result.ok and not result.queued
    assert result.agent_id == "agent_1"
    assert result.session_id == SESSION  # the response named none: the one seen on the turn's events
    assert result.turn is not None and result.turn["usage"] == {"inputTokens": 3, "outputTokens": 5}
    assert seen == ["message_start", "conversation_start", "text_delta", "text_delta", "message_stop",
                    "assistant_message", "conversation_end", "turn_response"]


async def test_send_message_while_queued_skips_the_turns_ahead(fake: FakeAgentX) -> None:
    async def message_send(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        # a turn (for m0) is streaming and another client's message (m1) is already queued
        fake.live[ws].add(SESSION)
        await fake.publish("text_delta", {"text": "old "})
        await fake.publish("message_persisted", {"messageId": "m2"}, category="persist")
        await fake.publish("conversation_queued", {"messageId": "m2"}, category="state")
        await fake.respond(ws, request, imageId=IMAGE, agentId="agent_1")
        await fake.publish("text_delta", {"text": "tail"})
        await play(fake, turn_script([], message_id="m0")[2:])
        await play(fake, turn_script(["other"], message_id="m1"))
        await play(fake, turn_script(["new", " reply"], message_id="m2", llm_id="msg_02"))

    fake.on_request["message_send_request"] = message_send
    async with make_client(fake) as client:
        await client.subscribe(SESSION)
        await until(lambda: SESSION in fake.live.get(fake.conns[0], set()))
        await play(fake, turn_script(["zero"], message_id="m0")[:3])
        await fake.publish("conversation_queued", {"messageId": "m1"}, category="state")
        seen: list[str] = []
        result = await client.send_message(IMAGE, "Hi", on_event=lambda e: seen.append(e["type"]))
    assert result.text == "new reply"
    assert result.queued and result.message_id == "m2" and result.reason == "completed"
    assert result.turn is not None and result.turn["turnId"] == "turn_m2"
    assert seen[0] == "conversation_queued" and seen.count("text_delta") == 2 and seen[-1] == "turn_response"


async def test_send_message_reports_error_occurred(fake: FakeAgentX) -> None:
    async def message_send(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        fake.live[ws].add(SESSION)
        await fake.respond(ws, request, imageId=IMAGE, agentId="agent_1")
        await play(fake, turn_script(["partial"], message_id="m1")[:3])
        await fake.publish("error_occurred",
                           {"code": "rate_limit", "message": "slow down", "recoverable": True},
                           category="state")

    fake.on_request["message_send_request"] = message_send
    async with make_client(fake) as client:
        client.turn_response_grace = 0.01  # this server never sends turn_response after an error
        result = await client.send_message(IMAGE, "Hi")
    assert (result.text, result.reason, result.error, result.error_code) == (
        "partial", "error", "slow down", "rate_limit")
    assert not result.ok and result.turn is None


async def test_send_message_rejected_raises_and_no_wait_returns_at_once(fake: FakeAgentX) -> None:
    async def message_send(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        if request["data"]["imageId"] != IMAGE:
            await fake.respond(ws, request, agentId="", error="Image not found: nope")
        else:
            await fake.respond(ws, request, imageId=IMAGE, agentId="agent_1")

    fake.on_request["message_send_request"] = message_send
    async with make_client(fake) as client:
        with pytest.raises(RequestFailed, match=r"^Image not found: nope$"):
            await client.send_message("nope", "Hi")
        result = await client.send_message(IMAGE, "Hi", wait=False)
        assert (result.agent_id, result.reason, result.text) == ("agent_1", None, "")
        with pytest.raises(RequestTimeout):
            await client.send_message(IMAGE, "Hi", timeout=0.05)
        assert not client._collectors


async def test_send_message_survives_a_drop_mid_turn(fake: FakeAgentX) -> None:
    client = make_client(fake)
    script = turn_script(["a", "b", "c"], message_id="m1")

    async def drop_then_log_the_rest() -> None:
        await until(lambda: client.last_seq(SESSION) == 3)
        fake.drop(fake.conns[0])
        for type_, data in script[3:]:  # logged while the client is away; replayed when it resubscribes
            await fake.publish(type_, data)

    async def message_send(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        fake.live[ws].add(SESSION)
        await fake.respond(ws, request, imageId=IMAGE, agentId="agent_1")
        await play(fake, script[:3])  # message_start, conversation_start, "a"
        background.append(asyncio.ensure_future(drop_then_log_the_rest()))

    background: list[asyncio.Future[None]] = []
    fake.on_request["message_send_request"] = message_send
    async with client:
        result = await asyncio.wait_for(client.send_message(IMAGE, "Hi"), 3)
    await asyncio.gather(*background)
    assert result.text == "abc" and result.reason == "completed"
    assert result.turn is not None and result.turn["turnId"] == "turn_m1"
    assert fake.requests(1)[0] == {"type": "subscribe", "sessionId": SESSION, "afterSeq": 3}


SESSION_A, SESSION_B = "sess_a", "sess_b"


async def play_on(fake: FakeAgentX, session: str, script: list[tuple[str, Event]]) -> None:
    for type_, data in script:
        await fake.publish(type_, data, session=session)


async def play_interleaved(fake: FakeAgentX, *scripts: tuple[str, list[tuple[str, Event]]]) -> None:
    """Publish the events of several sessions' scripts alternately, one of each in turn."""
    for i in range(max(len(script) for _, script in scripts)):
        for session, script in scripts:
            if i < len(script):
                await fake.publish(*script[i], session=session)


async def test_send_message_follows_two_sessions_of_one_image_at_once(fake: FakeAgentX) -> None:
    held: dict[str, Event] = {}

    async def message_send(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        held[request["data"]["sessionId"]] = request
        if len(held) < 2:
            return
        # both sessions are busy: each message is queued, both announced before either response
        await fake.publish("conversation_queued", {"messageId": "mA"}, session=SESSION_A, category="state")
        await fake.publish("conversation_queued", {"messageId": "mB"}, session=SESSION_B, category="state")
        for session in (SESSION_A, SESSION_B):
            await fake.respond(ws, held[session], imageId=IMAGE, agentId="agent_1", sessionId=session)
        await play_interleaved(fake, (SESSION_A, turn_script([], message_id="m0a")[3:]),
                               (SESSION_B, turn_script(["old b"], message_id="m0b")[2:]))
        await play_interleaved(fake, (SESSION_A, turn_script(["alpha", " reply"], message_id="mA", llm_id="la")),
                               (SESSION_B, turn_script(["beta"], message_id="mB", llm_id="lb")))

    fake.on_request["message_send_request"] = message_send
    seen: dict[str, list[tuple[str, str]]] = {SESSION_A: [], SESSION_B: []}

    def recorder(session: str) -> Callable[[Event], None]:
        return lambda e: seen[session].append((e["context"]["sessionId"], e["type"]))

    async with make_client(fake) as client:
        for session in (SESSION_A, SESSION_B):
            await client.subscribe(session)
        await until(lambda: {SESSION_A, SESSION_B} <= fake.live.get(fake.conns[0], set()))
        await play_interleaved(fake, (SESSION_A, turn_script(["old a"], message_id="m0a")[:3]),
                               (SESSION_B, turn_script([], message_id="m0b")[:2]))
        a, b = await asyncio.wait_for(asyncio.gather(
            client.send_message(IMAGE, "to a", session_id=SESSION_A, on_event=recorder(SESSION_A)),
            client.send_message(IMAGE, "to b", session_id=SESSION_B, on_event=recorder(SESSION_B))), 3)
        assert not client._collectors

    assert [(f["data"]["content"], f["data"]["sessionId"]) for f in fake.requests()
            if f["type"] == "message_send_request"] == [("to a", SESSION_A), ("to b", SESSION_B)]
    assert (a.text, a.session_id, a.message_id, a.queued, a.reason) == ("alpha reply", SESSION_A, "mA", True,
                                                                        "completed")
    assert (b.text, b.session_id, b.message_id, b.queued, b.reason) == ("beta", SESSION_B, "mB", True,
                                                                        "completed")
    assert a.turn is not None and a.turn["turnId"] == "turn_mA"
    assert b.turn is not None and b.turn["turnId"] == "turn_mB"
    for session, events in seen.items():
        assert {s for s, _ in events} == {session}
        assert events[0][1] == "conversation_queued" and events[-1][1] == "turn_response"
        assert [t for _, t in events].count("message_start") == 1


async def test_send_message_locks_to_the_session_named_in_the_response(fake: FakeAgentX) -> None:
    async def message_send(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        # another device queues a message on the image's other, busy session just before our response
        await fake.publish("conversation_queued", {"messageId": "other"}, session=SESSION_B, category="state")
        await fake.respond(ws, request, imageId=IMAGE, agentId="agent_1", sessionId=SESSION_A)
        await play_interleaved(fake, (SESSION_B, turn_script(["noise"], message_id="m0b", llm_id="lb")),
                               (SESSION_A, turn_script(["mine"], message_id="m1", llm_id="la")))

    fake.on_request["message_send_request"] = message_send
    seen: list[str] = []
    async with make_client(fake) as client:
        for session in (SESSION_A, SESSION_B):
            await client.subscribe(session)
        await until(lambda: {SESSION_A, SESSION_B} <= fake.live.get(fake.conns[0], set()))
        await play_on(fake, SESSION_B, turn_script(["busy"], message_id="m_busy", llm_id="l0")[:3])
        result = await asyncio.wait_for(
            client.send_message(IMAGE, "Hi", on_event=lambda e: seen.append(e["context"]["sessionId"])), 3)
    [request] = fake.requests(0)[2:]
    assert "sessionId" not in request["data"]
    assert (result.text, result.session_id, result.queued, result.reason) == ("mine", SESSION_A, False, "completed")
    assert result.turn is not None and result.turn["turnId"] == "turn_m1"
    assert set(seen) == {SESSION_A}


async def test_send_message_without_session_in_response_follows_the_session_of_the_turn(
        fake: FakeAgentX) -> None:
    async def message_send(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        await fake.respond(ws, request, imageId=IMAGE, agentId="agent_1")  # a server that names no session
        await fake.publish(*turn_script([], message_id="m1")[0], session=SESSION_A)
        await play_interleaved(fake, (SESSION_B, turn_script(["noise"], message_id="m2", llm_id="lb")),
                               (SESSION_A, turn_script(["mine"], message_id="m1")[1:]))

    fake.on_request["message_send_request"] = message_send
    async with make_client(fake) as client:
        for session in (SESSION_A, SESSION_B):
            await client.subscribe(session)
        await until(lambda: {SESSION_A, SESSION_B} <= fake.live.get(fake.conns[0], set()))
        result = await asyncio.wait_for(client.send_message(IMAGE, "Hi"), 3)
    assert (result.text, result.session_id, result.reason) == ("mine", SESSION_A, "completed")
    assert result.turn is not None and result.turn["turnId"] == "turn_m1"


async def test_messages_requests_the_history_of_a_session(fake: FakeAgentX) -> None:
    history = {None: [{"id": "m1", "role": "user", "content": "primary"}],
               SESSION_B: [{"id": "m9", "role": "user", "content": "second"}]}

    async def image_messages(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        if request["data"]["imageId"] != IMAGE:
            await fake.respond(ws, request, error="Image not found: nope")
        else:
            await fake.respond(ws, request, imageId=IMAGE, messages=history[request["data"].get("sessionId")])

    fake.on_request["image_messages_request"] = image_messages
    async with make_client(fake) as client:
        primary = await client.messages(IMAGE)
        second = await client.messages(IMAGE, session_id=SESSION_B)
        with pytest.raises(RequestFailed, match=r"^Image not found: nope$"):
            await client.messages("nope")
    assert primary == history[None] and second == history[SESSION_B]
    frames = fake.requests()
    assert [f["type"] for f in frames] == ["image_messages_request"] * 3
    assert [{k: v for k, v in f["data"].items() if k != "requestId"} for f in frames] == [
        {"imageId": IMAGE}, {"imageId": IMAGE, "sessionId": SESSION_B}, {"imageId": "nope"}]


def test_turn_tracker_counts_one_end_per_turn() -> None:
    tracker = _TurnTracker()

    def ends(*events: tuple[str, dict[str, Any]]) -> list[tuple[bool, str | None]]:
        infos = [tracker.observe(ev(t, d)) for t, d in events]
        return [(i.ended, i.next_message_id) for i in infos]

    assert ends(("conversation_queued", {"messageId": "q1"}), ("conversation_queued", {"messageId": "q2"}),
                ("text_delta", {}), ("error_occurred", {}), ("conversation_end", {"reason": "error"}),
                ("error_occurred", {}), ("message_start", {}), ("conversation_end", {"reason": "completed"}),
                ("conversation_end", {"reason": "completed"})) == [
        (False, None), (False, None), (False, None), (True, "q1"), (False, None), (True, "q2"),
        (False, None), (True, None), (True, None)]


# ----------------------------------------------------------------------------------- avm chat


def chat_args(url: str, **kw: Any) -> Namespace:
    base = {"url": url, "token": None, "container": "user-test", "image": None, "name": "T",
            "system": "be brief", "tools": None}
    return Namespace(**{**base, **kw})


async def test_chat_session_end_to_end(fake: FakeAgentX) -> None:
    async def image_create(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        assert request["data"] == {"containerId": "user-test",
                                   "config": {"name": "T", "systemPrompt": "be brief",
                                              "tools": ["bash", "read_file"]},
                                   "requestId": request["data"]["requestId"]}
        await fake.respond(ws, request, record={"imageId": IMAGE, "sessionId": SESSION},
                           __subscriptions=[SESSION])

    async def message_send(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        await fake.respond(ws, request, imageId=IMAGE, agentId="agent_1")
        if request["data"]["content"] == "fail":
            await play(fake, turn_script(["par"], message_id="m2")[:3])
            await fake.publish("error_occurred", {"code": "rate_limit", "message": "slow down"},
                               category="state")
            await fake.publish("turn_response", {"turnId": "t2", "status": "failed"}, category="turn")
        else:
            await play(fake, turn_script(["Hello", " there"], message_id="m1"))

    async def image_messages(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        await fake.respond(ws, request, imageId=IMAGE, messages=[
            {"id": "m1", "role": "user", "subtype": "user", "content": "hi", "timestamp": 1},
            {"id": "msg_01", "role": "assistant", "subtype": "assistant",
             "content": [{"type": "text", "text": "Hello there"}], "timestamp": 2}])

    fake.on_request.update({"container_create_request": echo, "image_create_request": image_create,
                            "message_send_request": message_send, "image_messages_request": image_messages})
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"hi\nfail\n/history\n/quit\n")
    os.close(write_fd)
    out, err = io.StringIO(), io.StringIO()
    try:
        chat = run_chat(chat_args(fake.url, tools="bash, read_file"), stdin_fd=read_fd, stdout=out, stderr=err)
        code = await asyncio.wait_for(chat, 3)
        await until(lambda: not any(t.name == "avm-chat-stdin" for t in threading.enumerate()))
    finally:
        os.close(read_fd)
    assert code == 0, err.getvalue()
    assert out.getvalue() == "image: img_1\nHello there\npar\nyou: hi\nassistant: Hello there\n"
    assert err.getvalue() == "error: slow down [rate_limit]\n"
    assert [f["type"] for f in fake.requests()] == [
        "container_create_request", "image_create_request", "subscribe", "message_send_request",
        "message_send_request", "image_messages_request"]


async def test_chat_unreachable_server_exits_1_with_one_line() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = await run_chat(chat_args(f"ws://127.0.0.1:{_free_port()}/ws"), stdin_fd=0, stdout=out, stderr=err)
    assert code == 1
    assert out.getvalue() == ""
    assert re.fullmatch(r"avm chat: cannot connect to ws://127\.0\.0\.1:\d+/ws: .+\n", err.getvalue())
