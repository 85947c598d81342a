"""API Gateway gateway and Lambda dispatcher: error paths with botocore's Stubber."""

from __future__ import annotations

import json

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


async def test_payload_too_large_is_refused_without_killing_the_caller() -> None:
    gw, stub = await stubbed_gateway()
    stub.add_client_error("post_to_connection", service_error_code="PayloadTooLargeException",
                          http_status_code=413)
    assert await gw.post("c1", "{}") is False
    assert await gw.post("c1", "x" * (MAX_FRAME_BYTES + 1)) is False  # refused before any call
    stub.assert_no_pending_responses()
    await gw.close()


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
