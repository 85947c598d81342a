"""`GET /v1/sessions/search`: a word from an earlier turn is found in the caller's sessions (and only
the caller's), with highlights and pages; the query and the cursor are checked."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from starlette.requests import Request

from agentvm.api.http_app import HttpApi, create_app
from agentvm.domain.models import Principal
from agentvm.drivers.scripted import ScriptedDriver
from tests.support.servers import InProcess, in_process
from tests.support.stock_client import StockClient


async def finished(http: httpx.AsyncClient, session_id: str, n: int) -> None:
    for _ in range(300):
        turns = (await http.get(f"/v1/sessions/{session_id}/turns")).json()["items"]
        if len(turns) >= n and all(t["status"] not in ("queued", "running") for t in turns):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the turns of {session_id} did not finish")


def tenant_app(srv: InProcess) -> httpx.AsyncClient:
    """The management API over the running server's services, the caller's tenant taken from a
    header: the tenants `avm serve` does not have (it serves one open tenant, `local`)."""
    async def principal_for(request: Request) -> Principal:
        return Principal(request.headers.get("x-tenant", "local"))

    services = srv.runtime.services
    app = create_app(api=HttpApi(resources=lambda: services.resources, principal_for=principal_for,
                                 services=lambda: services))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tenants", timeout=10)


async def test_a_word_from_an_earlier_turn_is_found_with_highlights_and_pages(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver()) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http, StockClient(srv.url) as ws:
        record = await ws.new_image("c-search", name="Fruit")
        iid, sid = record["imageId"], record["sessionId"]
        await ws.turn(iid, "My favourite fruit is the rambutan, <b>really</b>.")
        for text in ("What's the weather?", "Tell me a joke", "Another question"):
            await ws.turn(iid, text)
        second = (await http.post(f"/v1/images/{iid}/sessions", json={"title": "later"})).json()["sessionId"]
        await http.post(f"/v1/sessions/{second}/messages", json={"content": "rambutans again, and a durian"})
        await finished(http, second, 1)

        found = await http.get("/v1/sessions/search", params={"q": "Rambutan"})
        assert found.status_code == 200, found.text
        body = found.json()
        assert body["nextCursor"] is None
        items: list[dict[str, Any]] = body["items"]
        assert {(i["sessionId"], i["role"]) for i in items} == {
            (sid, "user"), (sid, "assistant"), (second, "user"), (second, "assistant")}
        assert all(i["imageId"] == iid and i["messageId"] and i["timestamp"] > 0 for i in items)
        user_hit = next(i for i in items if i["sessionId"] == sid and i["role"] == "user")
        assert user_hit["snippet"] == ("My favourite fruit is the <mark>rambutan</mark>, &lt;b&gt;really&lt;/b&gt;.")
        assert user_hit["subtype"] == "user"
        history = (await http.get(f"/v1/sessions/{sid}/messages")).json()["items"]
        assert user_hit["messageId"] == history[0]["id"]  # the first turn's message, three turns back

        # pages of one
        seen: list[str] = []
        cursor: str | None = None
        while True:
            params = {"q": "rambutan", "limit": "1", **({"cursor": cursor} if cursor else {})}
            page = (await http.get("/v1/sessions/search", params=params)).json()
            seen += [i["messageId"] for i in page["items"]]
            cursor = page["nextCursor"]
            if cursor is None:
                break
        assert sorted(seen) == sorted(i["messageId"] for i in items)

        # every word is needed; no word, nothing; search syntax is just words
        assert [i["sessionId"] for i in (await http.get("/v1/sessions/search",
                                                        params={"q": "durian rambutans"})).json()["items"]] == [
            second, second]
        assert (await http.get("/v1/sessions/search", params={"q": "?!"})).json() == {"items": [], "nextCursor": None}
        syntax = await http.get("/v1/sessions/search", params={"q": 'rambutan" OR NOT (*'})
        assert syntax.status_code == 200 and syntax.json()["items"] == []

        # bad requests name their field
        for params, field in [({}, "q"), ({"q": ""}, "q"), ({"q": "   "}, "q"), ({"q": "x" * 201}, "q"),
                              ({"q": "rambutan", "limit": "0"}, "limit"), ({"q": "rambutan", "limit": "51"}, "limit"),
                              ({"q": "rambutan", "cursor": "nope"}, "cursor")]:
            bad = await http.get("/v1/sessions/search", params=params)
            assert (bad.status_code, bad.json()["error"]["code"], bad.json()["error"].get("field")) == (
                400, "invalid_request", field), (params, bad.text)
        assert (await http.get("/v1/sessions/search", params={"q": "x" * 200})).status_code == 200
        other = (await http.get("/v1/sessions/search", params={"q": "rambutan", "limit": "1"})).json()["nextCursor"]
        refused = await http.get("/v1/sessions/search", params={"q": "durian", "cursor": other})
        assert refused.json()["error"] == {"code": "invalid_request", "message": "cursor: not a cursor of this list",
                                           "field": "cursor"}

        # deleted sessions and images leave the results
        assert (await http.delete(f"/v1/sessions/{second}")).status_code == 204
        left = (await http.get("/v1/sessions/search", params={"q": "rambutan"})).json()["items"]
        assert {i["sessionId"] for i in left} == {sid}
        assert (await http.delete(f"/v1/images/{iid}")).status_code == 204
        assert (await http.get("/v1/sessions/search", params={"q": "rambutan"})).json()["items"] == []


async def test_another_tenant_never_finds_the_word(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver()) as srv, StockClient(srv.url) as ws, \
            tenant_app(srv) as api:
        record = await ws.new_image("c-a")
        await ws.turn(record["imageId"], "the password hint is salak")  # tenant `local`

        acme = {"x-tenant": "acme"}
        image = await api.post("/v1/images", json={"containerId": "c-a"}, headers=acme)  # the same container id
        assert image.status_code == 201, image.text
        acme_sid = image.json()["sessionId"]
        sent = await api.post(f"/v1/sessions/{acme_sid}/messages", json={"content": "acme talks about mangosteen"},
                              headers=acme)
        assert sent.status_code == 202, sent.text
        for _ in range(300):
            turns = (await api.get(f"/v1/sessions/{acme_sid}/turns", headers=acme)).json()["items"]
            if turns and turns[0]["status"] == "completed":
                break
            await asyncio.sleep(0.02)

        def ids(response: httpx.Response) -> list[tuple[str, str]]:
            assert response.status_code == 200, response.text
            return sorted((i["sessionId"], i["role"]) for i in response.json()["items"])

        assert ids(await api.get("/v1/sessions/search", params={"q": "salak"})) == [
            (record["sessionId"], "assistant"), (record["sessionId"], "user")]
        assert ids(await api.get("/v1/sessions/search", params={"q": "salak"}, headers=acme)) == []
        assert ids(await api.get("/v1/sessions/search", params={"q": "mangosteen"}, headers=acme)) == [
            (acme_sid, "assistant"), (acme_sid, "user")]
        assert ids(await api.get("/v1/sessions/search", params={"q": "mangosteen"})) == []
        assert ids(await api.get("/v1/sessions/search", params={"q": "salak"}, headers={"x-tenant": "t3"})) == []
