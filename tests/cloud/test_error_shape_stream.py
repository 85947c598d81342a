"""One error shape on every route of the cloud's streaming app (`chat_stream`: the chat API, images,
sessions, … behind the Lambda Web Adapter), served by uvicorn on moto (issue 19, item 6)."""

from __future__ import annotations

import httpx

from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
from agentvm.auth.api_keys import new_key
from agentvm.cloud import runtime as cloud_runtime
from tests.cloud.test_chat_stream import auth, stream  # noqa: F401  (the fixture)
from tests.support.error_shape import check_every_route, http_call


async def test_every_route_of_the_streaming_app_answers_errors_in_one_shape(
        stream: tuple[str, dict[str, str]]) -> None:  # noqa: F811
    url, _tokens = stream
    record, token = new_key("ops", ("operator", "admin"))  # every route gets past the gate to its own answer
    await DynamoDBKeys(cloud_runtime.runtime().store).put_key(record)
    async with httpx.AsyncClient(base_url=url, headers=auth(token), timeout=30) as http:
        doc = (await http.get("/openapi.json")).json()

        checked = await check_every_route(doc, http_call(http))
    assert len(checked.wrong_methods) == len(doc["paths"]) >= 20
    assert len(checked.bad_bodies) >= 5 and checked.missing_fields
