"""`agentvm_client.ManagementClient` against `avm serve`: the design note's Python API for
definitions and images, plus resources and config, with the server's errors raised as such."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from agentvm.drivers.scripted import ScriptedDriver
from agentvm_client.management import ManagementClient, ManagementError, http_base
from tests.support.servers import in_process


def test_http_base_from_a_websocket_url() -> None:
    assert http_base("ws://127.0.0.1:8080/ws") == "http://127.0.0.1:8080"
    assert http_base("wss://abc.execute-api.eu-west-1.amazonaws.com/prod?token=x") == (
        "https://abc.execute-api.eu-west-1.amazonaws.com")
    assert http_base("http://localhost:9000/") == "http://localhost:9000"


async def test_definitions_images_resources_config(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver()) as srv, ManagementClient(srv.url) as avm:
        prompt = await avm.resources.register(kind="prompt", name="tone", version="1.0.0", content={"text": "Kind."})
        await avm.resources.add_version(prompt["resourceId"], version="1.1.0", content={"text": "Kinder."})
        assert (await avm.resources.resolve("resource://prompts/tone@~1.0"))["resolved"] == (
            "resource://prompts/tone@1.0.0")
        assert [i["name"] for i in (await avm.resources.discover(kind="prompt"))["items"]] == ["tone"]
        assert (await avm.resources.get(prompt["resourceId"], "1.0.0"))["content"] == {"text": "Kind."}

        assert "coder" in [d["name"] for d in await avm.definitions.list()]
        assert (await avm.definitions.get("chat_basic"))["source"] == "code"
        image = await avm.images.build("c-py", agent="chat_basic", config={"systemPrompt": "resource://prompts/tone"})
        assert image["systemPrompt"] == "Kinder."
        assert (await avm.images.get(image["imageId"]))["pins"] == {"resource://prompts/tone": "1.1.0"}
        assert [i["imageId"] for i in await avm.images.list("c-py")] == [image["imageId"]]
        with pytest.raises(ManagementError) as refused:
            await avm.resources.delete(prompt["resourceId"])
        assert (refused.value.status, refused.value.code) == (409, "conflict")
        await avm.images.delete(image["imageId"])
        await avm.resources.delete(prompt["resourceId"])

        assert (await avm.config.set("llm.maxTokens", 1024))["source"] == "runtime"
        assert (await avm.config.get("llm.maxTokens"))["value"] == 1024
        assert (await avm.config.unset("llm.maxTokens"))["source"] == "default"
        with pytest.raises(ManagementError) as bad:
            await avm.images.build("c-py", config={"maxTokens": 0})
        assert (bad.value.status, bad.value.field) == (400, "config.maxTokens")


async def test_publish_registers_adds_versions_and_runs_again(tmp_path: Path) -> None:
    """`resources.publish` (README's snippet runs twice): the first call registers, a new version is
    added to the same resource, an identical version is returned as stored, other content is refused."""
    async with in_process(tmp_path / "data", driver=ScriptedDriver()) as srv, ManagementClient(srv.url) as avm:
        await avm.resources.register(kind="prompt", name="sales-old", version="1.0.0", content={"text": "Old."})
        first = await avm.resources.publish(kind="prompt", name="sales", version="1.0.0", content={"text": "Sell."})
        again = await avm.resources.publish(kind="prompt", name="sales", version="1.0.0", content={"text": "Sell."})
        assert again["resourceId"] == first["resourceId"] and again["createdAt"] == first["createdAt"]
        newer = await avm.resources.publish(kind="prompt", name="sales", version="1.1.0", content={"text": "More."},
                                            description="v2")
        assert newer["resourceId"] == first["resourceId"] and newer["description"] == "v2"
        assert (await avm.resources.publish(kind="prompt", name="sales", version="1.1.0", content={"text": "More."},
                                            description="v2"))["createdAt"] == newer["createdAt"]
        with pytest.raises(ManagementError) as changed:
            await avm.resources.publish(kind="prompt", name="sales", version="1.0.0", content={"text": "Other."})
        assert (changed.value.status, changed.value.code) == (409, "conflict")
        assert "Version 1.0.0 of prompt/sales already exists" in changed.value.message
        with pytest.raises(ManagementError) as bad:
            await avm.resources.publish(kind="prompt", name="sales", version="x", content={"text": "Sell."})
        assert (bad.value.status, bad.value.field) == (400, "version")
        got = await avm.resources.get(first["resourceId"])
        assert [v["version"] for v in got["versions"]] == ["1.1.0", "1.0.0"]
        names = sorted(i["name"] for i in (await avm.resources.discover(kind="prompt"))["items"])
        assert names == ["sales", "sales-old"]


async def test_another_kind_of_server_is_one_error_not_a_parse_failure() -> None:
    def other(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/config":
            return httpx.Response(200, text="<html>welcome</html>")
        return httpx.Response(404, text="<html>nothing here</html>")

    http = httpx.AsyncClient(base_url="http://elsewhere", transport=httpx.MockTransport(other))
    async with http, ManagementClient("http://elsewhere", http_client=http) as avm:
        with pytest.raises(ManagementError) as ok_but_html:
            await avm.config.get()
        assert (ok_but_html.value.status, ok_but_html.value.code, ok_but_html.value.message) == (
            200, "bad_response", "http://elsewhere/v1/config answered HTTP 200 without JSON: is it an AgentVM server?")
        with pytest.raises(ManagementError) as missing:
            await avm.sessions.page()
        assert (missing.value.status, missing.value.message) == (
            404, "http://elsewhere/v1/sessions?limit=50 answered HTTP 404 Not Found")
