"""One error shape on every route of the cloud's HTTP API (`functions/http_api` through Mangum, on
moto; issue 19, item 6): tests/support/error_shape.py over its OpenAPI document, with an operator and
admin key so that every route gets past the gate to its own answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
from agentvm.auth.api_keys import new_key
from agentvm.cloud import runtime as cloud_runtime
from agentvm.errors import UnknownModel
from agentvm.services.images import ImageService
from tests.cloud.test_handlers import http_event
from tests.support.cloud_edge import load_handler
from tests.support.error_shape import Answer, assert_shape, check_every_route, without_loop


def test_every_route_of_the_cloud_http_api_answers_errors_in_one_shape(cloud: cloud_runtime.CloudRuntime) -> None:
    record, admin = new_key("ops", ("operator", "admin"))
    cloud_runtime.run(DynamoDBKeys(cloud.store).put_key(record))
    api = load_handler("http_api")
    doc = api._asgi.app.openapi()

    def call_sync(method: str, target: str, body: Any) -> Answer:
        path, _, query = target.partition("?")
        event = http_event(method.upper(), path, token=admin, query=query)
        if body is not None:
            event["body"] = json.dumps(body)
        response = api.handler(event, None)
        headers = {k.lower(): v for k, v in (response.get("headers") or {}).items()}
        return Answer(response["statusCode"], headers, json.loads(response["body"]) if response.get("body") else None)

    async def call(method: str, target: str, body: Any) -> Answer:
        return call_sync(method, target, body)

    checked = without_loop(check_every_route(doc, call))
    assert len(checked.wrong_methods) == len(doc["paths"]) >= 10
    assert len(checked.bad_bodies) >= 4 and checked.missing_fields
    # no key at all: the same shape (401), on a route and on an unknown path
    for path in ("/v1/resources", "/v1/no-such-route"):
        response = api.handler(http_event("GET", path), None)
        assert_shape(Answer(response["statusCode"], {}, json.loads(response["body"])), 401, "unauthorized", path)


def test_the_clouds_websocket_function_knows_the_offline_drivers_models_only_without_an_llm_key(
        cloud: cloud_runtime.CloudRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """ws_default builds images with no driver loaded: whether the offline scripted driver runs the
    turns comes from the settings (no LLM key, no secret ARN)."""
    deps = cloud.invocation("acme", role="ws").deps
    assert deps.driver is None and deps.offline_llm is True
    images = ImageService(deps, None, None, None, None)  # type: ignore[arg-type]  (only the model check runs)
    cloud_runtime.run(images._require_known_model("scripted", "config.model"))
    monkeypatch.setattr(cloud.settings, "llm_secret_arn", "arn:aws:secretsmanager:us-east-1:1:secret:llm")
    deps = cloud.invocation("acme", role="ws").deps
    assert deps.offline_llm is False
    with pytest.raises(UnknownModel) as refused:
        cloud_runtime.run(ImageService(deps, None, None, None, None)  # type: ignore[arg-type]
                          ._require_known_model("scripted", "config.model"))
    assert refused.value.field == "config.model"
    assert refused.value.message.startswith("config.model: unknown model 'scripted'; known models: "
                                            "claude-3-5-haiku, claude-3-haiku, claude-haiku-4, claude-opus-4, ")
