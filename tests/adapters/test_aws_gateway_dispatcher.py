"""API Gateway gateway and Lambda dispatcher: error paths with botocore's Stubber."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from typing import Any

import pytest
from botocore.stub import Stubber

from agentvm.adapters.aws.apigw_gateway import MAX_FRAME_BYTES, ApiGatewayGateway
from agentvm.adapters.aws.botocore_async import dummy_session
from agentvm.adapters.aws.lambda_dispatcher import LambdaDispatcher

SESSION = dummy_session()
ENDPOINT = "https://abc123.execute-api.us-east-1.amazonaws.com/prod"


async def stubbed_gateway() -> tuple[ApiGatewayGateway, Stubber]:
    gw = ApiGatewayGateway(ENDPOINT, session=SESSION, max_retries=2)
    stub = Stubber((await gw._client.get()).raw)
    stub.activate()
    return gw, stub


async def test_post_sends_the_frame_bytes() -> None:
    gw, stub = await stubbed_gateway()
    stub.add_response("post_to_connection", {}, {"ConnectionId": "c1", "Data": b'{"type":"x"}'})
    assert await gw.post("c1", '{"type":"x"}') is True
    stub.assert_no_pending_responses()
    await gw.close()


async def test_gone_connection_answers_false() -> None:
    gw, stub = await stubbed_gateway()
    stub.add_client_error("post_to_connection", service_error_code="GoneException", http_status_code=410)
    assert await gw.post("c1", "{}") is False
    await gw.close()


async def test_throttling_is_retried_then_succeeds() -> None:
    gw, stub = await stubbed_gateway()
    stub.add_client_error("post_to_connection", service_error_code="LimitExceededException", http_status_code=429)
    stub.add_client_error("post_to_connection", service_error_code="LimitExceededException", http_status_code=429)
    stub.add_response("post_to_connection", {})
    assert await gw.post("c1", "{}") is True
    stub.assert_no_pending_responses()
    await gw.close()


async def test_throttling_beyond_the_retries_raises() -> None:
    gw, stub = await stubbed_gateway()
    for _ in range(3):
        stub.add_client_error("post_to_connection", service_error_code="LimitExceededException",
                              http_status_code=429)
    with pytest.raises(Exception, match="LimitExceededException"):
        await gw.post("c1", "{}")
    await gw.close()


async def test_forbidden_connection_answers_false() -> None:
    gw, stub = await stubbed_gateway()
    stub.add_client_error("post_to_connection", service_error_code="ForbiddenException", http_status_code=403)
    assert await gw.post("c1", "{}") is False
    await gw.close()


# ---- frames above the inline limit (32 KB): offloaded, else inline up to 128 KB, else truncated ----


class MemoryOffload:
    """`BlobOffload` in memory: records what was stored."""

    def __init__(self, *, fail: bool = False, delay: float = 0.0) -> None:
        self.objects: dict[str, bytes] = {}
        self.puts = 0
        self.fail = fail
        self.delay = delay

    async def put_frame(self, key: str, data: bytes) -> str:
        self.puts += 1
        await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError("S3 is down")
        self.objects[key] = data
        return f"https://bucket.s3.amazonaws.com/{key}?X-Amz-Signature=abc"


async def capturing_gateway(**kwargs: Any) -> tuple[ApiGatewayGateway, Stubber, list[bytes]]:
    """A stubbed gateway that also records the `Data` of every post_to_connection call."""
    gw = ApiGatewayGateway(ENDPOINT, session=SESSION, max_retries=2, **kwargs)
    raw = (await gw._client.get()).raw
    posted: list[bytes] = []
    raw.meta.events.register("before-parameter-build.apigatewaymanagementapi.PostToConnection",
                             lambda params, **_: posted.append(params["Data"]))
    stub = Stubber(raw)
    stub.activate()
    return gw, stub, posted


def big_event(size: int, *, type_: str = "image_messages_response", category: str = "response") -> str:
    """An event whose JSON is about `size` bytes (a long history), with a recognisable body."""
    event = {"type": type_, "timestamp": 1795339437576, "source": "command", "category": category,
             "intent": "result", "context": {"imageId": "img_1", "sessionId": "sess_1"}, "seq": 7,
             "data": {"requestId": "req_1", "imageId": "img_1",
                      "messages": [{"role": "user", "content": "SECRET-BODY " + "é" * (size // 2)}]}}
    return json.dumps(event, ensure_ascii=False)


async def test_a_40_kb_frame_is_offloaded_and_a_small_reference_is_posted(caplog: pytest.LogCaptureFixture) -> None:
    offload = MemoryOffload()
    gw, stub, posted = await capturing_gateway(blobs=offload)
    stub.add_response("post_to_connection", {})
    frame = big_event(40 * 1024)
    assert len(frame.encode()) > 40 * 1024
    assert await gw.post("c1", frame) is True

    [sent] = posted
    assert len(sent) < 1024
    small = json.loads(sent)
    [(key, stored)] = offload.objects.items()
    assert stored == frame.encode()
    digest = hashlib.sha256(stored).hexdigest()
    assert re.fullmatch(rf"frames/\d{{4}}/\d{{2}}/\d{{2}}/{digest}\.json", key)
    original = json.loads(frame)
    assert small == {**{k: original[k] for k in ("type", "timestamp", "source", "category", "intent",
                                                  "context", "seq")},
                     "data": {"__ref": {"url": f"https://bucket.s3.amazonaws.com/{key}?X-Amz-Signature=abc",
                                        "bytes": len(stored), "sha256": digest},
                              "requestId": "req_1"}}
    stub.assert_no_pending_responses()
    await gw.close()


async def test_a_10_kb_frame_is_posted_inline() -> None:
    offload = MemoryOffload()
    gw, stub, posted = await capturing_gateway(blobs=offload)
    stub.add_response("post_to_connection", {})
    frame = big_event(10 * 1024)
    assert await gw.post("c1", frame) is True
    assert posted == [frame.encode()]
    assert offload.puts == 0
    await gw.close()


async def test_one_upload_serves_every_connection_that_gets_the_same_frame() -> None:
    offload = MemoryOffload(delay=0.01)
    gw, stub, posted = await capturing_gateway(blobs=offload)
    for _ in range(4):
        stub.add_response("post_to_connection", {})
    frame = big_event(40 * 1024, type_="tool_result", category="stream")
    assert await asyncio.gather(*(gw.post(f"c{i}", frame) for i in range(3))) == [True] * 3
    assert await gw.post("c4", frame) is True  # later, within the URL's reuse window
    assert offload.puts == 1
    assert len(posted) == 4 and len(set(posted)) == 1
    await gw.close()


async def test_without_offload_a_frame_within_128_kb_goes_inline_and_a_bigger_one_truncated(
        caplog: pytest.LogCaptureFixture) -> None:
    gw, stub, posted = await capturing_gateway()
    stub.add_response("post_to_connection", {})
    stub.add_response("post_to_connection", {})
    medium, huge = big_event(40 * 1024), big_event(200 * 1024)
    assert await gw.post("c1", medium) is True
    assert await gw.post("c1", huge) is True  # the connection is not gone
    assert posted[0] == medium.encode()
    small = json.loads(posted[1])
    assert small["type"] == "image_messages_response" and small["seq"] == 7
    assert small["data"] == {"__truncated": True, "bytes": len(huge.encode()), "requestId": "req_1"}
    assert "no offload configured" in caplog.text
    assert "SECRET-BODY" not in caplog.text
    assert all("SECRET-BODY" not in repr(r.__dict__) for r in caplog.records)
    await gw.close()


async def test_a_failed_offload_falls_back_without_dropping_the_connection(caplog: pytest.LogCaptureFixture) -> None:
    offload = MemoryOffload(fail=True)
    gw, stub, posted = await capturing_gateway(blobs=offload)
    stub.add_response("post_to_connection", {})
    stub.add_response("post_to_connection", {})
    medium, huge = big_event(40 * 1024), big_event(200 * 1024)
    assert await gw.post("c1", medium) is True
    assert await gw.post("c1", huge) is True
    assert offload.puts == 2
    assert posted[0] == medium.encode()
    assert json.loads(posted[1])["data"]["__truncated"] is True
    assert "frame offload failed" in caplog.text and "SECRET-BODY" not in caplog.text
    await gw.close()


async def test_payload_too_large_sends_the_truncated_frame_and_keeps_the_connection() -> None:
    gw, stub, posted = await capturing_gateway(blobs=MemoryOffload())
    stub.add_client_error("post_to_connection", service_error_code="PayloadTooLargeException",
                          http_status_code=413)
    stub.add_response("post_to_connection", {})
    frame = big_event(20 * 1024, type_="assistant_message", category="message")
    assert await gw.post("c1", frame) is True
    assert posted[0] == frame.encode()
    small = json.loads(posted[1])
    assert small["type"] == "assistant_message" and small["category"] == "message"
    assert small["data"] == {"__truncated": True, "bytes": len(frame.encode()), "requestId": "req_1"}
    stub.assert_no_pending_responses()
    await gw.close()


async def test_gone_after_offload_answers_false() -> None:
    gw, stub, _ = await capturing_gateway(blobs=MemoryOffload())
    stub.add_client_error("post_to_connection", service_error_code="GoneException", http_status_code=410)
    assert await gw.post("c1", big_event(40 * 1024)) is False
    await gw.close()


async def test_frames_that_are_not_json_objects() -> None:
    offload = MemoryOffload()
    gw, stub, posted = await capturing_gateway(blobs=offload)
    for _ in range(3):
        stub.add_response("post_to_connection", {})
    assert await gw.post("c1", "not json") is True
    assert await gw.post("c1", "x" * (40 * 1024)) is True  # not offloadable: fits 128 KB, sent whole
    assert await gw.post("c1", json.dumps(["y"] * (100 * 1024))) is True
    assert posted[0] == b"not json" and len(posted[1]) == 40 * 1024
    assert json.loads(posted[2]) == {"data": {"__truncated": True, "bytes": len(json.dumps(["y"] * (100 * 1024)))}}
    assert offload.puts == 0
    await gw.close()


def test_the_inline_limit_must_fit_api_gateway() -> None:
    with pytest.raises(ValueError, match="inline_limit"):
        ApiGatewayGateway(ENDPOINT, session=SESSION, inline_limit=MAX_FRAME_BYTES + 1)


async def test_dispatcher_invokes_chat_turn_asynchronously() -> None:
    d = LambdaDispatcher("arn:aws:lambda:us-east-1:123456789012:function:chat_turn:live", session=SESSION)
    stub = Stubber((await d._client.get()).raw)
    stub.activate()
    stub.add_response("invoke", {"StatusCode": 202}, {
        "FunctionName": "arn:aws:lambda:us-east-1:123456789012:function:chat_turn:live",
        "InvocationType": "Event",
        "Payload": json.dumps({"tenantId": "t1", "sessionId": "sess_1"}, separators=(",", ":")).encode()})
    await d.start_turns("t1", "sess_1")
    stub.assert_no_pending_responses()
    await d.close()
