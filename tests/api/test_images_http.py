"""`/v1/definitions` and `/v1/images` on `avm serve`: code and resource definitions, images built over
HTTP with their pins, and the same images on the WebSocket."""

from __future__ import annotations

from pathlib import Path

import httpx

from agentvm.definitions import code_definitions, register_agent
from agentvm.drivers.scripted import ScriptedDriver
from tests.support.servers import in_process
from tests.support.stock_client import StockClient


@register_agent("test-greeter")
def _greeter() -> dict[str, str]:
    return {"description": "Greets.", "systemPrompt": "Greet warmly.", "model": "claude-haiku-4-5"}


async def test_definitions_and_images_over_http(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver()) as srv, \
            httpx.AsyncClient(base_url=srv.http) as http, StockClient(srv.url) as ws:
        await http.post("/v1/resources", json={"kind": "prompt", "name": "sales-v2", "version": "1.0.0",
                                                "content": {"text": "Sell, v1."}})
        await http.post("/v1/resources", json={"kind": "agent", "name": "seller", "version": "1.2.0",
                                                "description": "Sells things",
                                                "content": {"systemPrompt": "resource://prompts/sales-v2"},
                                                "dependencies": ["resource://prompts/sales-v2"]})
        listed = (await http.get("/v1/definitions")).json()["items"]
        names = [(d["name"], d["source"]) for d in listed]
        assert ("chat_basic", "code") in names and ("coder", "code") in names and ("test-greeter", "code") in names
        assert ("seller", "resource") in names
        assert set(code_definitions()) >= {"chat_basic", "coder", "test-greeter"}
        coder = (await http.get("/v1/definitions/coder")).json()
        assert coder["content"]["tools"] == ["bash", "read_file", "write_file", "edit_file", "list_files"]
        seller = (await http.get("/v1/definitions/seller")).json()
        assert (seller["source"], seller["uri"]) == ("resource", "resource://agents/seller@1.2.0")

        built = await http.post("/v1/images", json={"containerId": "c-http", "agent": "resource://agents/seller",
                                                     "config": {"name": "Seller"}})
        assert built.status_code == 201, built.text
        image = built.json()
        assert image["systemPrompt"] == "Sell, v1."
        assert image["pins"] == {"resource://agents/seller": "1.2.0", "resource://prompts/sales-v2": "1.0.0"}
        greeter = (await http.post("/v1/images", json={"containerId": "c-http", "agent": "test-greeter"})).json()
        assert greeter["model"] == "claude-haiku-4-5"
        assert greeter["sources"]["agent"].startswith("code:test-greeter@")
        assert greeter["pins"] == {}

        # the image built over HTTP is an ordinary image on the WebSocket
        events = await ws.turn(image["imageId"], "hello")
        assert events[-1]["data"]["status"] == "completed"
        ids = [i["imageId"] for i in (await http.get("/v1/images", params={"containerId": "c-http"})).json()["items"]]
        assert ids == [greeter["imageId"], image["imageId"]]
        assert (await http.get(f"/v1/images/{image['imageId']}")).json()["pins"] == image["pins"]

        unknown = await http.post("/v1/images", json={"containerId": "c-http", "agent": "nobody"})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["message"].startswith("agent: no definition 'nobody' (code definitions: ")
        bad = await http.post("/v1/images", json={"containerId": "c-http", "config": {"maxTokens": 0}})
        assert bad.status_code == 400
        assert bad.json()["error"]["field"] == "config.maxTokens"
        assert (await http.delete(f"/v1/images/{image['imageId']}")).status_code == 204
        assert (await http.get(f"/v1/images/{image['imageId']}")).status_code == 404
        assert (await http.delete(f"/v1/images/{image['imageId']}")).status_code == 404
