"""The resource center over HTTP on `avm serve` (SQLite), and its tenant isolation in the service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentvm.domain.models import Principal
from agentvm.drivers.scripted import ScriptedDriver
from agentvm.errors import InvalidRequest, NotFound
from tests.support.servers import InProcess, in_process


@pytest.fixture
async def srv(tmp_path: Path) -> AsyncIterator[InProcess]:
    async with in_process(tmp_path / "data", driver=ScriptedDriver()) as server:
        yield server


@pytest.fixture
async def http(srv: InProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=srv.http, timeout=10) as client:
        yield client


async def register(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    res = await http.post("/v1/resources", json=body)
    assert res.status_code == 201, res.text
    return dict(res.json())


async def test_register_a_prompt_then_discover_and_read_it(http: httpx.AsyncClient) -> None:
    created = await register(http, kind="prompt", name="sales-assistant", version="1.0.0",
                             content={"text": "You sell things."}, tags=["sales"], description="Sales voice")
    assert created["uri"] == "resource://prompts/sales-assistant@1.0.0"
    assert created["contentHash"].startswith("sha256:") and len(created["contentHash"]) == 71
    assert created["own"] is True and created["published"] is False
    await register(http, kind="tool", name="web-search", version="0.3.1", content={
        "type": "http", "url": "https://search.example/api", "description": "Search the web",
        "inputSchema": {"type": "object"}})
    await register(http, kind="tool", name="calculator", version="1.0.0", content={"type": "builtin", "name": "bash"})

    tools = (await http.get("/v1/resources", params={"kind": "tool"})).json()
    assert [i["name"] for i in tools["items"]] == ["calculator", "web-search"]
    assert "content" not in tools["items"][0]
    assert tools["nextCursor"] is None
    by_tag = (await http.get("/v1/resources", params={"tag": "sales"})).json()
    assert [i["name"] for i in by_tag["items"]] == ["sales-assistant"]
    by_text = (await http.get("/v1/resources", params={"q": "VOICE"})).json()
    assert [i["name"] for i in by_text["items"]] == ["sales-assistant"]
    page = (await http.get("/v1/resources", params={"limit": 2})).json()
    rest = (await http.get("/v1/resources", params={"limit": 2, "cursor": page["nextCursor"]})).json()
    assert len(page["items"]) == 2 and len(rest["items"]) == 1 and rest["nextCursor"] is None

    got = (await http.get(f"/v1/resources/{created['resourceId']}")).json()
    assert got["content"] == {"text": "You sell things."}
    assert [v["version"] for v in got["versions"]] == ["1.0.0"]


async def test_versions_are_immutable_and_resolve_picks_by_spec(http: httpx.AsyncClient) -> None:
    prompt = await register(http, kind="prompt", name="sales-v2", version="1.0.0", content={"text": "v1"})
    rid = prompt["resourceId"]
    for version, text in (("1.2.0", "v1.2"), ("1.10.0", "v1.10"), ("2.0.0-beta.1", "beta"), ("2.0.0", "v2")):
        res = await http.put(f"/v1/resources/{rid}", json={"version": version, "content": {"text": text}})
        assert res.status_code == 201, res.text
    again = await http.put(f"/v1/resources/{rid}", json={"version": "1.2.0", "content": {"text": "changed"}})
    assert again.status_code == 409
    assert again.json()["error"]["message"] == "Version 1.2.0 of prompt/sales-v2 already exists"

    async def resolved(uri: str) -> str:
        res = await http.get("/v1/resources/resolve", params={"uri": uri})
        assert res.status_code == 200, res.text
        return str(res.json()["resolved"])

    assert await resolved("resource://prompts/sales-v2") == "resource://prompts/sales-v2@2.0.0"
    assert await resolved("resource://prompts/sales-v2@^1.2") == "resource://prompts/sales-v2@1.10.0"
    assert await resolved("resource://prompts/sales-v2@~1.2.0") == "resource://prompts/sales-v2@1.2.0"
    assert await resolved("resource://prompts/sales-v2@1.0.0") == "resource://prompts/sales-v2@1.0.0"
    assert await resolved("resource://prompts/sales-v2@2.0.0-beta.1") == "resource://prompts/sales-v2@2.0.0-beta.1"
    missing = await http.get("/v1/resources/resolve", params={"uri": "resource://prompts/sales-v2@^3"})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "resource://prompts/sales-v2@^3: no version matching '^3'"
    old = (await http.get(f"/v1/resources/{rid}", params={"version": "1.0.0"})).json()
    assert old["content"] == {"text": "v1"}  # versions never change
    assert [v["version"] for v in old["versions"]] == ["2.0.0", "2.0.0-beta.1", "1.10.0", "1.2.0", "1.0.0"]


async def test_dependencies_resolve_transitively_and_bad_graphs_are_refused(http: httpx.AsyncClient) -> None:
    await register(http, kind="prompt", name="tone", version="1.0.0", content={"text": "Be kind."})
    await register(http, kind="prompt", name="sales", version="1.0.0", content={"text": "Sell."},
                   dependencies=["resource://prompts/tone@^1"])
    agent = await register(http, kind="agent", name="seller", version="1.0.0",
                           content={"systemPrompt": "resource://prompts/sales"},
                           dependencies=["resource://prompts/sales"])
    tree = (await http.get("/v1/resources/resolve", params={"uri": "resource://agents/seller"})).json()
    assert tree["resolved"] == "resource://agents/seller@1.0.0"
    assert [d["resolved"] for d in tree["dependencies"]] == ["resource://prompts/sales@1.0.0"]
    assert [d["resolved"] for d in tree["dependencies"][0]["dependencies"]] == ["resource://prompts/tone@1.0.0"]
    assert tree["pins"] == {"resource://agents/seller": "1.0.0", "resource://prompts/sales": "1.0.0",
                            "resource://prompts/tone": "1.0.0"}

    # a new version of tone that depends on the agent would close a cycle: refused
    tone_id = (await http.get("/v1/resources", params={"name": "tone"})).json()["items"][0]["resourceId"]
    cycle = await http.put(f"/v1/resources/{tone_id}", json={
        "version": "1.1.0", "content": {"text": "x"}, "dependencies": ["resource://agents/seller"]})
    assert cycle.status_code == 400
    assert cycle.json()["error"]["message"] == (
        "dependency cycle: resource://prompts/tone → resource://agents/seller → resource://prompts/sales → "
        "resource://prompts/tone")
    missing = await http.post("/v1/resources", json={
        "kind": "agent", "name": "broken", "version": "1.0.0", "content": {},
        "dependencies": ["resource://tools/nowhere"]})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == (
        "resource://tools/nowhere: no resource (required by resource://agents/broken)")
    assert (await http.get("/v1/resources", params={"name": "broken"})).json()["items"] == []
    assert agent["dependencies"] == ["resource://prompts/sales"]


async def test_bad_input_names_the_field(http: httpx.AsyncClient) -> None:
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"kind": "widget", "name": "x", "version": "1.0.0", "content": {}},
         "kind", "kind: must be one of prompt, tool, sandbox, agent, knowledge"),
        ({"kind": "prompt", "name": "Bad Name", "version": "1.0.0", "content": {}}, "name",
         "name: lowercase letters, digits, '.', '_' and '-', starting with a letter or digit, at most 100 "
         "characters"),
        ({"kind": "prompt", "name": "x", "content": {}}, "version", "version: is required"),
        ({"kind": "prompt", "name": "x", "version": "1.0.0", "content": "text"}, "content",
         "content: must be a JSON object"),
        ({"kind": "prompt", "name": "x", "version": "1.0.0", "content": {}, "dependencies": ["http://x"]},
         "dependencies", None),
    ]
    for body, field, message in cases:
        res = await http.post("/v1/resources", json=body)
        assert res.status_code == 400, (body, res.text)
        error = res.json()["error"]
        assert error["field"] == field, error
        if message is not None:
            assert error["message"] == message
        else:
            assert error["message"].startswith("dependencies[0]: ")
    assert (await http.get("/v1/resources")).json()["items"] == []
    assert (await http.get("/v1/resources/res_nope")).status_code == 404


async def test_delete_is_refused_while_an_image_pins_the_resource(srv: InProcess, http: httpx.AsyncClient) -> None:
    from agentvm.domain.models import DEFAULT_TENANT, Image, Session

    created = await register(http, kind="prompt", name="pinned", version="1.0.0", content={"text": "x"})
    store = srv.runtime.store
    await store.create_container(__import__("agentvm.domain.models", fromlist=["Container"]).Container(
        DEFAULT_TENANT, "c1", 1, 1))
    await store.create_image(Image(DEFAULT_TENANT, "img_1", "c1", "sess_1", "n", 1, 1, None, None,
                                   {"pins": {"resource://prompts/pinned": "1.0.0"}}),
                             Session(DEFAULT_TENANT, "sess_1", "img_1", "c1", 1, 1))
    refused = await http.delete(f"/v1/resources/{created['resourceId']}")
    assert refused.status_code == 409
    assert refused.json()["error"]["message"].startswith("resource://prompts/pinned is pinned by 1 image(s) (img_1)")
    assert (await http.delete(f"/v1/resources/{created['resourceId']}", params={"force": "true"})).status_code == 204
    assert (await http.get(f"/v1/resources/{created['resourceId']}")).status_code == 404


async def test_another_tenants_private_resource_is_not_found(srv: InProcess) -> None:
    service = srv.runtime.services.resources
    alice, bob = Principal("alice"), Principal("bob")
    secret = await service.register(alice, kind="prompt", name="secret", version="1.0.0", content={"text": "a"})
    shared = await service.register(alice, kind="tool", name="shared", version="1.0.0",
                                    content={"type": "builtin", "name": "read_file"}, published=True)
    with pytest.raises(NotFound, match="Resource not found"):
        await service.get(bob, secret.resource_id)
    with pytest.raises(NotFound, match="resource://prompts/secret: no resource"):
        await service.resolve(bob, "resource://prompts/secret")
    with pytest.raises(NotFound):
        await service.add_version(bob, secret.resource_id, version="2.0.0", content={})
    with pytest.raises(NotFound):
        await service.delete(bob, secret.resource_id)
    assert (await service.resolve(bob, "resource://tools/shared")).resource.resource_id == shared.resource_id
    items, _ = await service.discover(bob)
    assert [i.name for i in items] == ["shared"]
    with pytest.raises(NotFound):  # readable, but not bob's to change
        await service.add_version(bob, shared.resource_id, version="2.0.0", content={"type": "builtin", "name": "bash"})
    with pytest.raises(InvalidRequest, match="uri: "):
        await service.resolve(bob, "prompts/secret")


async def test_an_image_pins_the_versions_current_when_it_was_built(tmp_path: Path) -> None:
    from tests.support.scripts import RecordingDriver
    from tests.support.stock_client import StockClient

    recorder = RecordingDriver(ScriptedDriver())
    async with in_process(tmp_path / "data", driver=recorder) as server, \
            httpx.AsyncClient(base_url=server.http, timeout=10) as http, StockClient(server.url) as ws:
        prompt = await register(http, kind="prompt", name="sales-v2", version="1.0.0",
                                content={"text": "You are sales assistant v1."})
        await register(http, kind="agent", name="seller", version="1.0.0",
                       content={"systemPrompt": "resource://prompts/sales-v2@^1 || ^2", "tools": ["read_file"],
                                "description": "Sells"},
                       dependencies=["resource://prompts/sales-v2@^1 || ^2"])
        old = await ws.new_image("c-sales", agent="resource://agents/seller")
        assert old["systemPrompt"] == "You are sales assistant v1."
        assert old["description"] == "Sells"
        await ws.turn(old["imageId"], "hello")

        published = await http.put(f"/v1/resources/{prompt['resourceId']}",
                                   json={"version": "2.0.0", "content": {"text": "You are sales assistant v2."}})
        assert published.status_code == 201
        await ws.turn(old["imageId"], "hello again")  # the existing session does not change
        new = await ws.new_image("c-sales", agent="resource://agents/seller")
        assert new["systemPrompt"] == "You are sales assistant v2."
        await ws.turn(new["imageId"], "hello")
        direct = await ws.new_image("c-sales", systemPrompt="resource://prompts/sales-v2@1.0.0")
        assert direct["systemPrompt"] == "You are sales assistant v1."

        images = {i.image_id: i for i in await server.runtime.store.list_images("local")}
        assert images[old["imageId"]].config["pins"] == {"resource://agents/seller": "1.0.0",
                                                          "resource://prompts/sales-v2": "1.0.0"}
        assert images[new["imageId"]].config["pins"]["resource://prompts/sales-v2"] == "2.0.0"
        assert images[old["imageId"]].config["tools"] == ["read_file"]
        # a pinned resource cannot be deleted from under its images
        refused = await http.delete(f"/v1/resources/{prompt['resourceId']}")
        assert refused.status_code == 409

        bad = await ws.request("image_create_request", {"containerId": "c-sales",
                                                        "config": {"agent": "resource://agents/nobody"}})
        assert bad["data"]["error"] == "resource://agents/nobody: no resource"
        wrong = await ws.request("image_create_request", {"containerId": "c-sales",
                                                          "config": {"agent": "resource://prompts/sales-v2"}})
        assert wrong["data"]["error"] == "agent: resource://prompts/sales-v2 is a prompt, not an agent"
    systems = [r.system for r in recorder.requests]
    assert systems == ["You are sales assistant v1.", "You are sales assistant v1.", "You are sales assistant v2."]
