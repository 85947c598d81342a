"""AgentVMClient and events sent by reference (`data.__ref`, the cloud's large frames)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from websockets.asyncio.server import ServerConnection

from agentvm_client import AgentVMClient, RequestFailed
from tests.unit.test_client import CTX, Event, FakeAgentX, ev, make_client, until

BLOB_URL = "https://bucket.s3.amazonaws.com/frames/2026/11/22/x.json?X-Amz-Signature=secret"


def reference(event: Event, url: str = BLOB_URL, *, body: bytes | None = None) -> Event:
    """What the cloud gateway posts for `event`: its envelope, `data` replaced by a reference."""
    body = json.dumps(event).encode() if body is None else body
    data: dict[str, Any] = {"__ref": {"url": url, "bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}}
    if "requestId" in event["data"]:
        data["requestId"] = event["data"]["requestId"]
    return {**{k: v for k, v in event.items() if k != "data"}, "data": data}


class Blobs:
    """An httpx MockTransport serving one body per URL, optionally slowly."""

    def __init__(self) -> None:
        self.bodies: dict[str, tuple[int, bytes]] = {}
        self.delay = 0.0
        self.fetched: list[str] = []

    def put(self, event: Event, url: str = BLOB_URL) -> bytes:
        body = json.dumps(event).encode()
        self.bodies[url] = (200, body)
        return body

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.fetched.append(str(request.url))
        await asyncio.sleep(self.delay)
        status, body = self.bodies.get(str(request.url), (403, b"<Error>AccessDenied</Error>"))
        return httpx.Response(status, content=body)


@pytest.fixture
async def fake() -> AsyncIterator[FakeAgentX]:
    async with FakeAgentX() as server:
        yield server


@pytest.fixture
async def blobs() -> AsyncIterator[tuple[Blobs, httpx.AsyncClient]]:
    store = Blobs()
    async with httpx.AsyncClient(transport=httpx.MockTransport(store.handle)) as http:
        yield store, http


def big(type_: str, seq: int, text: str = "x" * 50_000) -> Event:
    return ev(type_, {"messageId": f"msg_{seq}", "content": text}, context=CTX, seq=seq, category="message")


async def test_an_event_by_reference_is_resolved_and_keeps_its_place(
        fake: FakeAgentX, blobs: tuple[Blobs, httpx.AsyncClient]) -> None:
    store, http = blobs
    store.delay = 0.05  # the next event arrives while the reference is being fetched
    first, second = big("assistant_message", 1), ev("text_delta", {"text": "after"}, context=CTX, seq=2)
    store.put(first)

    async def emit(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        await fake.send(ws, reference(first), wrap=False)
        await fake.send(ws, second, wrap=False)
        await fake.respond(ws, request)

    fake.on_request["emit_request"] = emit
    seen: list[Event] = []
    async with make_client(fake, http_client=http) as client:
        client.on("*", seen.append)
        await client.request("emit")
        await until(lambda: len(seen) == 2)
        assert client.last_seq("sess_1") == 2
    assert seen == [first, second]
    assert store.fetched == [BLOB_URL]
    assert not http.is_closed  # a client passed in is the caller's to close


async def test_a_response_by_reference_answers_its_request(
        fake: FakeAgentX, blobs: tuple[Blobs, httpx.AsyncClient]) -> None:
    store, http = blobs

    async def messages(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        response = {"type": "image_messages_response", "timestamp": 1, "source": "command", "category": "response",
                    "intent": "result", "data": {"requestId": request["data"]["requestId"], "imageId": "img_1",
                                                 "messages": [{"id": "m1", "content": "y" * 60_000}],
                                                 "__subscriptions": ["sess_9"]}}
        store.put(response)
        await fake.send(ws, reference(response), wrap=False)

    fake.on_request["image_messages_request"] = messages
    async with make_client(fake, http_client=http) as client:
        res = await client.request_ok("image_messages", {"imageId": "img_1"})
        assert res["data"]["messages"][0]["content"] == "y" * 60_000
        assert "sess_9" in client.subscriptions
    assert any(f.get("type") == "subscribe" and f.get("sessionId") == "sess_9" for f in fake.requests())


async def test_a_reference_that_fails_its_checks_becomes_a_system_error_in_place(
        fake: FakeAgentX, blobs: tuple[Blobs, httpx.AsyncClient]) -> None:
    store, http = blobs
    tampered, missing, after = big("assistant_message", 1), big("tool_result", 2), ev("text_delta", context=CTX, seq=3)
    store.put({**tampered, "seq": 9})  # same size, other content than the reference announces
    bad = reference(tampered)

    async def emit(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        await fake.send(ws, bad, wrap=False)
        await fake.send(ws, reference(missing, "https://bucket.s3.amazonaws.com/gone.json"), wrap=False)
        await fake.send(ws, after, wrap=False)
        await fake.respond(ws, request)

    fake.on_request["emit_request"] = emit
    seen: list[Event] = []
    async with make_client(fake, http_client=http) as client:
        client.on("*", seen.append)
        await client.request("emit")
        await until(lambda: len(seen) == 3)
    assert [e["type"] for e in seen] == ["system_error", "system_error", "text_delta"]
    for error, what in zip(seen[:2], ("assistant_message event (seq 1)", "tool_result event (seq 2)"), strict=True):
        assert error["data"]["code"] == "frame_unavailable"
        assert error["context"] == CTX
        assert error["data"]["message"].startswith(f"Cannot deliver the {what}: fetching the copy")
        assert "X-Amz-Signature" not in error["data"]["message"]
    assert "sha256 does not match" in seen[0]["data"]["message"]
    assert "HTTP 403" in seen[1]["data"]["message"]


async def test_a_response_that_cannot_be_fetched_or_was_truncated_fails_the_request(
        fake: FakeAgentX, blobs: tuple[Blobs, httpx.AsyncClient]) -> None:
    _, http = blobs

    async def unreachable(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        response = {"type": "image_get_response", "timestamp": 1, "source": "command", "category": "response",
                    "intent": "result", "data": {"requestId": request["data"]["requestId"], "record": {}}}
        await fake.send(ws, reference(response), wrap=False)  # nothing is stored at the URL

    async def truncated(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        await fake.send(ws, {"type": "image_list_response", "timestamp": 1, "source": "command",
                             "category": "response", "intent": "result",
                             "data": {"__truncated": True, "bytes": 300_000,
                                      "requestId": request["data"]["requestId"]}}, wrap=False)

    fake.on_request.update({"image_get_request": unreachable, "image_list_request": truncated})
    async with make_client(fake, http_client=http) as client:
        res = await client.request("image_get", {"imageId": "img_1"})
        assert res["data"]["errorCode"] == "frame_unavailable"
        assert res["data"]["error"].startswith("Cannot deliver the image_get_response event: fetching the copy")
        with pytest.raises(RequestFailed, match=r"too large \(300000 bytes\) and the server truncated it"):
            await client.request_ok("image_list")


class _BlobHandler(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def blob_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BlobHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


async def test_the_default_http_client_fetches_from_a_real_server(fake: FakeAgentX,
                                                                  blob_server: ThreadingHTTPServer) -> None:
    event = big("user_message", 1, "data:image/png;base64," + "A" * 70_000)
    _BlobHandler.body = json.dumps(event).encode()
    url = f"http://127.0.0.1:{blob_server.server_address[1]}/frames/x.json"

    async def emit(fake: FakeAgentX, ws: ServerConnection, request: Event) -> None:
        await fake.send(ws, reference(event, url), wrap=False)
        await fake.respond(ws, request)

    fake.on_request["emit_request"] = emit
    seen: list[Event] = []
    client: AgentVMClient = make_client(fake)
    async with client:
        client.on("user_message", seen.append)
        await client.request("emit")
        await until(lambda: len(seen) == 1)
        http = client._http
        assert http is not None
    assert seen == [event]
    assert http.is_closed  # the client's own HTTP client is closed with it
