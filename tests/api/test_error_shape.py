"""One error shape on every route of `avm serve` (issue 19, item 6): tests/support/error_shape.py
run over the OpenAPI document of the local application, and plain-words validation messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from agentvm.drivers.scripted import ScriptedDriver
from tests.support.error_shape import Answer, assert_shape, check_every_route, http_call
from tests.support.servers import in_process


async def test_every_route_of_avm_serve_answers_errors_in_one_shape(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver()) as srv, \
            httpx.AsyncClient(base_url=srv.http) as http:
        doc = (await http.get("/openapi.json")).json()

        checked = await check_every_route(doc, http_call(http))
        routes = [p for p in doc["paths"]]
        assert len(routes) >= 30
        # every path but the one serving all five methods got a wrong method; every JSON body a bad one
        assert len(checked.wrong_methods) == len(routes)
        bodies = [f"{m.upper()} {p}" for p, ops in doc["paths"].items() for m, op in ops.items()
                  if "application/json" in op.get("requestBody", {}).get("content", {})]
        assert sorted(checked.bad_bodies) == sorted(bodies) and len(bodies) >= 10
        assert checked.missing_fields


async def test_validation_messages_name_the_json_path_in_plain_words(tmp_path: Path) -> None:
    cases: list[tuple[str, str, Any, str, str]] = [
        ("/api/v1/chat/completions", "post", {"message": ""}, "message", "message: must not be empty"),
        ("/api/v1/chat/completions", "post", {"message": [{"type": "text"}]}, "message[0].text",
         "message[0].text: is required"),
        ("/api/v1/chat/completions", "post", {"message": [{"type": "text", "text": "a"}, {"type": "video"}]},
         "message[1]", "message[1]: type 'video' is not one of 'text', 'image', 'file'"),
        ("/api/v1/chat/completions", "post", {"message": "hi", "sessionId": "s"}, "sessionId",
         "sessionId: is not a known field"),
        ("/v1/images", "post", {"containerId": 5, "agent": "chat_basic"}, "containerId",
         "containerId: must be a string"),
        ("/v1/images", "post", {"containerId": "c", "agent": "chat_basic", "config": {"model": ""}},
         "config.model", "config.model: must not be empty"),
        ("/v1/images", "post", {"containerId": "c", "agent": "chat_basic", "config": {"maxTokens": "x"}},
         "config.maxTokens", "config.maxTokens: must be a whole number"),
        ("/v1/resources", "post", {"kind": "nope", "name": "a", "version": "1.0.0", "content": {}}, "kind",
         "kind: must be one of prompt, tool, sandbox, agent, knowledge"),
        ("/v1/sessions/search?q=a&limit=-5", "get", None, "limit", "limit: must be at least 1"),
        ("/v1/sessions/search", "get", None, "q", "q: is required"),
    ]
    async with in_process(tmp_path / "data", driver=ScriptedDriver()) as srv, \
            httpx.AsyncClient(base_url=srv.http) as http:
        for path, method, body, field, message in cases:
            res = await http.request(method, path, json=body)
            error = assert_shape(Answer(res.status_code, res.headers, res.json()), 400, "invalid_request", path)
            assert (error["field"], error["message"]) == (field, message), (path, body)
        garbled = await http.post("/v1/images", content=b'{"containerId": ',
                                  headers={"content-type": "application/json"})
        assert garbled.status_code == 400
        assert garbled.json() == {"error": {"code": "invalid_request", "field": "body",
                                            "message": "body: is not valid JSON"}}
