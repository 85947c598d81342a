"""Frame offload on S3 (moto server): the gateway posts a reference, the URL serves the frame itself."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import botocore.session
import httpx
import pytest
from botocore.stub import Stubber

from agentvm.adapters.aws.apigw_gateway import ApiGatewayGateway
from agentvm.adapters.aws.frame_offload import BlobOffload, S3FrameOffload
from agentvm.adapters.aws.s3_blobs import S3BlobStore
from tests.adapters.conftest import bucket_keys

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

pytestmark = pytest.mark.usefixtures("aws_env")

ENDPOINT = "https://abc123.execute-api.us-east-1.amazonaws.com/prod"


@pytest.fixture
async def offload(bucket: str, aws_session: botocore.session.Session,
                  moto_endpoint: str) -> AsyncIterator[S3FrameOffload]:
    store = S3BlobStore(bucket, session=aws_session, endpoint_url=moto_endpoint)
    yield S3FrameOffload(store)
    await store.close()


async def test_put_frame_stores_json_and_returns_a_15_minute_url(offload: S3FrameOffload, s3: S3Client,
                                                                 bucket: str) -> None:
    port: BlobOffload = offload
    data = b'{"type":"x","data":{"t":"' + b"a" * 1000 + b'"}}'
    url = await port.put_frame("frames/2026/11/22/abc.json", data)
    assert "X-Amz-Expires=900" in url and "frames/2026/11/22/abc.json" in url
    head = await s3.head_object(Bucket=bucket, Key="frames/2026/11/22/abc.json")
    assert head["ContentType"] == "application/json"
    async with httpx.AsyncClient() as http:
        resp = await http.get(url)
    assert resp.status_code == 200 and resp.content == data
    # same key, same content: idempotent
    await port.put_frame("frames/2026/11/22/abc.json", data)
    assert await bucket_keys(s3, bucket) == ["frames/2026/11/22/abc.json"]


async def test_the_gateway_posts_a_reference_to_a_byte_identical_copy(
        offload: S3FrameOffload, s3: S3Client, bucket: str, aws_session: botocore.session.Session) -> None:
    gw = ApiGatewayGateway(ENDPOINT, session=aws_session, blobs=offload)
    raw = (await gw._client.get()).raw
    posted: list[bytes] = []
    raw.meta.events.register("before-parameter-build.apigatewaymanagementapi.PostToConnection",
                             lambda params, **_: posted.append(params["Data"]))
    stub = Stubber(raw)
    stub.activate()
    stub.add_response("post_to_connection", {})
    stub.add_response("post_to_connection", {})

    event = {"type": "tool_result", "timestamp": 1795339437576, "source": "agent", "category": "stream",
             "intent": "notification", "context": {"imageId": "img_1", "sessionId": "sess_1"}, "seq": 12,
             "data": {"toolCallId": "toolu_1", "result": "ü" * (20 * 1024)}}  # 40 KB of UTF-8
    frame = json.dumps(event, ensure_ascii=False)
    assert await gw.post("c1", frame) is True
    assert await gw.post("c2", frame) is True
    stub.assert_no_pending_responses()
    await gw.close()

    assert posted[0] == posted[1] and len(posted[0]) < 1024
    small = json.loads(posted[0])
    assert small["type"] == "tool_result" and small["seq"] == 12 and small["context"] == event["context"]
    ref = small["data"]["__ref"]
    assert set(small["data"]) == {"__ref"}
    async with httpx.AsyncClient() as http:
        resp = await http.get(ref["url"])
    assert resp.status_code == 200
    assert resp.content == frame.encode()
    assert ref["bytes"] == len(resp.content) and ref["sha256"] == hashlib.sha256(resp.content).hexdigest()
    [key] = await bucket_keys(s3, bucket)
    assert key.startswith("frames/") and key.endswith(f"/{ref['sha256']}.json")
