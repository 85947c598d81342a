"""Several sessions per image: created and read over HTTP, each its own conversation (history,
turns, seqs) with the image as it was built, continued over HTTP, the WebSocket and the Python
client's `session.resume()`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from agentvm.drivers.scripted import ScriptedDriver
from agentvm_client.management import ManagementClient
from tests.support.scripts import RecordingDriver
from tests.support.servers import in_process
from tests.support.stock_client import StockClient


async def finished_turns(http: httpx.AsyncClient, session_id: str, n: int) -> list[dict[str, Any]]:
    for _ in range(200):
        turns = (await http.get(f"/v1/sessions/{session_id}/turns")).json()["items"]
        if len(turns) >= n and all(t["status"] not in ("queued", "running") for t in turns):
            return list(turns)
        await asyncio.sleep(0.02)
    raise AssertionError(f"the turns of {session_id} did not finish")


def texts(messages: list[dict[str, Any]]) -> list[str]:
    out = []
    for m in messages:
        content = m.get("content")
        out.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content or []))
    return out


async def test_an_image_has_several_sessions_each_running_the_image_as_built(tmp_path: Path) -> None:
    recorder = RecordingDriver(ScriptedDriver())
    async with in_process(tmp_path / "data", driver=recorder) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http, StockClient(srv.url) as ws:
        prompt = (await http.post("/v1/resources", json={"kind": "prompt", "name": "sales-v2", "version": "1.0.0",
                                                         "content": {"text": "Sell, v1."}})).json()
        image = (await http.post("/v1/images", json={"containerId": "c-s",
                                                     "config": {"systemPrompt": "resource://prompts/sales-v2"}})).json()
        iid, primary = image["imageId"], image["sessionId"]

        created = await http.post(f"/v1/images/{iid}/sessions", json={"title": "Second try"})
        assert created.status_code == 201, created.text
        second = created.json()
        assert second["imageId"] == iid and second["title"] == "Second try" and second["primary"] is False
        sid = second["sessionId"]
        untitled = (await http.post(f"/v1/images/{iid}/sessions")).json()
        listed = (await http.get(f"/v1/images/{iid}/sessions")).json()["items"]
        assert [(s["sessionId"], s["primary"]) for s in listed] == [(primary, True), (sid, False),
                                                                    (untitled["sessionId"], False)]
        got = (await http.get(f"/v1/sessions/{sid}")).json()
        assert got["image"]["pins"] == {"resource://prompts/sales-v2": "1.0.0"} and got["containerId"] == "c-s"

        # a newer version is published: the image's sessions, old and new, keep the pinned one
        await http.put(f"/v1/resources/{prompt['resourceId']}", json={"version": "2.0.0",
                                                                        "content": {"text": "Sell, v2."}})
        queued = await http.post(f"/v1/sessions/{sid}/messages", json={"content": "over http"})
        assert queued.status_code == 202, queued.text
        assert queued.json()["sessionId"] == sid
        [turn] = await finished_turns(http, sid, 1)
        assert (turn["turnId"], turn["status"], turn["tier"]) == (queued.json()["turnId"], "completed", "function")
        assert turn["usage"]["outputTokens"] > 0

        # the WebSocket names the session with the `sessionId` extension
        start = len(ws.events)
        res = await ws.request("message_send_request", {"imageId": iid, "sessionId": sid, "content": "over ws"})
        assert res["data"]["sessionId"] == sid
        end = await ws.wait_for(lambda e: e["type"] == "turn_response", start=start)
        assert end["context"]["sessionId"] == sid
        await ws.turn(iid, "on the primary")  # without it: the primary session, as in AgentX

        assert texts((await http.get(f"/v1/sessions/{sid}/messages")).json()["items"]) == [
            "over http", "You said: over http", "over ws", "You said: over ws"]
        primary_history = await ws.request("image_messages_request", {"imageId": iid})
        assert texts(primary_history["data"]["messages"]) == ["on the primary", "You said: on the primary"]
        second_history = await ws.request("image_messages_request", {"imageId": iid, "sessionId": sid})
        assert second_history["data"]["sessionId"] == sid and len(second_history["data"]["messages"]) == 4
        # each session has its own gap-free seq order
        events = await srv.runtime.store.read_events("local", sid, 0)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert all(r.system == "Sell, v1." for r in recorder.requests) and len(recorder.requests) == 3
        newer = (await http.post("/v1/images", json={"containerId": "c-s",
                                                     "config": {"systemPrompt": "resource://prompts/sales-v2"}})).json()
        assert newer["systemPrompt"] == "Sell, v2."

        # errors: unknown, of another image, the primary one, a bad title or message
        other = (await http.post("/v1/images", json={"containerId": "c-s"})).json()
        wrong = await ws.request("message_send_request", {"imageId": other["imageId"], "sessionId": sid,
                                                          "content": "x"})
        assert wrong["data"]["error"] == f"Session not found: {sid}"
        missing = await http.get("/v1/sessions/sess_nope")
        assert (missing.status_code, missing.json()["error"]) == (404, {
            "code": "not_found", "message": "Session not found: sess_nope", "field": "sessionId"})
        assert (await http.post("/v1/images/img_nope/sessions")).status_code == 404
        refused = await http.delete(f"/v1/sessions/{primary}")
        assert refused.status_code == 409
        assert refused.json()["error"]["message"] == (
            f"Session {primary} is the primary session of image {iid}: delete the image to delete it")
        blank = await http.post(f"/v1/images/{iid}/sessions", json={"title": "  "})
        assert (blank.status_code, blank.json()["error"]["field"]) == (400, "title")
        assert (await http.post(f"/v1/images/{iid}/sessions", json={"title": "x" * 201})).status_code == 400
        empty = await http.post(f"/v1/sessions/{sid}/messages", json={"content": ""})
        assert (empty.status_code, empty.json()["error"]["field"]) == (400, "content")

        assert (await http.delete(f"/v1/sessions/{sid}")).status_code == 204
        assert (await http.get(f"/v1/sessions/{sid}")).status_code == 404
        assert await srv.runtime.store.list_messages("local", sid) == []
        assert [s["sessionId"] for s in (await http.get(f"/v1/images/{iid}/sessions")).json()["items"]] == [
            primary, untitled["sessionId"]]
        # deleting the image deletes every session of it
        assert (await http.delete(f"/v1/images/{iid}")).status_code == 204
        assert (await http.get(f"/v1/sessions/{untitled['sessionId']}")).status_code == 404


async def test_the_python_client_creates_and_resumes_sessions(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver()) as srv, \
            ManagementClient(srv.http) as avm:
        await avm.resources.register(kind="prompt", name="greeting", version="1.0.0", content={"text": "Greet."})
        image = await avm.images.build("c-py", config={"systemPrompt": "resource://prompts/greeting@^1"})
        session = await avm.sessions.create(image["imageId"], title="From Python")
        assert (session.image_id, session.title) == (image["imageId"], "From Python")
        assert [s.session_id for s in await avm.sessions.list(image["imageId"])] == [
            image["sessionId"], session.session_id]

        async with await session.resume() as chat:
            assert chat.image["pins"] == {"resource://prompts/greeting": "1.0.0"}
            first = await chat.send("first", timeout=10)
            second = await chat.send("second", timeout=10)
            assert (first.text, first.session_id, first.reason) == ("You said: first", session.session_id,
                                                                    "completed")
            assert second.text == "You said: second"
            assert texts(await chat.messages()) == ["first", "You said: first", "second", "You said: second"]

        # resumed later, by id, from another client: the same conversation goes on
        again = await avm.sessions.get(session.session_id)
        async with await again.resume() as chat:
            third = await chat.send("third", timeout=10)
            assert third.text == "You said: third"
        assert len(await again.messages()) == 6
        assert [t["status"] for t in await again.turns()] == ["completed"] * 3
        # the tenant's turn log: every finished turn, newest first, in pages
        page = (await avm._http.get("/v1/turns", params={"limit": 2})).json()
        assert [t["task"] for t in page["items"]] == ["third", "second"] and page["nextCursor"]
        rest = (await avm._http.get("/v1/turns", params={"cursor": page["nextCursor"]})).json()
        assert [t["task"] for t in rest["items"]] == ["first"] and rest["nextCursor"] is None
        assert all(t["sessionId"] == session.session_id and t["durationMs"] is not None for t in rest["items"])
        found = await avm.sessions.search("second")
        assert [i["messageId"] for i in found["items"]][:1] and "<mark>second</mark>" in found["items"][0]["snippet"]
        assert all(i["sessionId"] == session.session_id for i in found["items"])
        bad = await avm._http.get("/v1/turns", params={"cursor": "nope!"})
        assert (bad.status_code, bad.json()["error"]["field"]) == (400, "cursor")
        assert await avm.images.get(image["imageId"]) and texts(await avm.sessions.messages(image["sessionId"])) == []


async def test_stopping_the_agent_ends_the_turns_of_every_session_of_the_image(tmp_path: Path) -> None:
    from agentvm.drivers.scripted import Script

    slow = ScriptedDriver(Script(echo_delay_ms=200))  # each word 200 ms: the turns are still running
    async with in_process(tmp_path / "data", driver=slow) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http, StockClient(srv.url) as ws:
        image = await ws.new_image("c-stop")
        iid = image["imageId"]
        sid = (await http.post(f"/v1/images/{iid}/sessions")).json()["sessionId"]
        await ws.request("message_send_request", {"imageId": iid, "content": "one two three four five"})
        await ws.request("message_send_request", {"imageId": iid, "sessionId": sid,
                                                  "content": "one two three four five"})
        await ws.request("message_send_request", {"imageId": iid, "sessionId": sid, "content": "queued"})
        await ws.wait_for(lambda e: e["type"] == "text_delta" and e["context"]["sessionId"] == sid)
        stopped = await ws.request("image_stop_request", {"imageId": iid})
        assert "error" not in stopped["data"]
        for session in (image["sessionId"], sid):
            types = [e.type for e in await srv.runtime.store.read_events("local", session, 0)]
            assert types[-1] == "session_destroyed", (session, types)
        turns = (await http.get(f"/v1/sessions/{sid}/turns")).json()["items"]
        assert [(t["status"], (t["error"] or {}).get("code")) for t in turns] == [
            ("interrupted", None), ("interrupted", "agent_stopped")]


async def test_get_sessions_lists_the_callers_sessions_newest_first_in_pages(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data") as srv, httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        one = (await http.post("/v1/images", json={"containerId": "c-l"})).json()
        await asyncio.sleep(0.003)  # distinct creation times: equal ones are ordered by the (random) id
        two = (await http.post("/v1/images", json={"containerId": "c-l"})).json()
        await asyncio.sleep(0.003)
        extra = (await http.post(f"/v1/images/{one['imageId']}/sessions", json={"title": "later"})).json()
        first = await http.get("/v1/sessions", params={"limit": 2})
        assert first.status_code == 200, first.text
        body = first.json()
        assert [s["sessionId"] for s in body["items"]] == [extra["sessionId"], two["sessionId"]]
        assert body["items"][0] == {"sessionId": extra["sessionId"], "imageId": one["imageId"], "containerId": "c-l",
                                    "title": "later", "createdAt": extra["createdAt"],
                                    "updatedAt": extra["updatedAt"]}
        rest = (await http.get("/v1/sessions", params={"limit": 2, "cursor": body["nextCursor"]})).json()
        assert [s["sessionId"] for s in rest["items"]] == [one["sessionId"]] and rest["nextCursor"] is None
        of_one = (await http.get("/v1/sessions", params={"imageId": one["imageId"]})).json()
        assert [s["sessionId"] for s in of_one["items"]] == [extra["sessionId"], one["sessionId"]]

        missing = await http.get("/v1/sessions", params={"imageId": "img_nope"})
        assert missing.status_code == 404
        assert missing.json()["error"]["field"] == "imageId" and "img_nope" in missing.json()["error"]["message"]
        bad = await http.get("/v1/sessions", params={"cursor": "bogus!"})
        assert bad.status_code == 400 and bad.json()["error"] == {
            "code": "invalid_request", "message": "cursor: not a cursor of this list", "field": "cursor"}
        too_many = await http.get("/v1/sessions", params={"limit": 500})
        assert too_many.status_code in (400, 422) and too_many.json()["error"]["field"] == "limit"
