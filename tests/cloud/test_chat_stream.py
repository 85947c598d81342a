"""The cloud's streaming HTTP application (`agentvm.cloud.stream_app`) against DynamoDB on moto,
served by uvicorn as the Lambda Web Adapter would: the SSE chat API runs the turn in its own
invocation under the session's lease, streams it, resumes with Last-Event-ID, and answers another
tenant's ids as not found; `/v1/images` and `/v1/sessions` are served per tenant."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from httpx_sse import aconnect_sse

from tests.support.stream_server import stream_server
from tests.support.wire import watch_chat_feed


@pytest.fixture(autouse=True)
def _session_events_match_the_models(monkeypatch: pytest.MonkeyPatch) -> None:
    watch_chat_feed(monkeypatch)


@pytest.fixture
async def stream(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[tuple[str, dict[str, str]]]:
    async with stream_server(moto_endpoint, monkeypatch, ("alice", "bob")) as served:
        yield served


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def sse(http: httpx.AsyncClient, token: str, body: dict[str, Any], **headers: str) -> list[Any]:
    async with aconnect_sse(http, "POST", "/api/v1/chat/completions", json=body,
                            headers={**auth(token), **headers}) as source:
        assert source.response.status_code == 200, await source.response.aread()
        return [e async for e in source.aiter_sse()]


async def test_the_cloud_stream_runs_streams_and_resumes_a_chat_turn(stream: tuple[str, dict[str, str]]) -> None:
    base, tokens = stream
    alice, bob = tokens["alice"], tokens["bob"]
    async with httpx.AsyncClient(base_url=base, timeout=20) as http:
        events = await sse(http, alice, {"agent_type": "chat_basic", "message": "hello cloud"})
        assert (events[0].event, events[-1].event) == ("thought", "done")
        assert "".join(orjson.loads(e.data)["content"] for e in events if e.event == "message") == \
            "You said: hello cloud"
        done = orjson.loads(events[-1].data)
        session_id = done["session_id"]
        assert (done["status"], done["tier"]) == ("completed", "function")

        again = await sse(http, alice, {"session_id": session_id, "message": "x"}, **{"Last-Event-ID": events[1].id})
        assert [e.id for e in again] == [e.id for e in events[2:]]

        history = (await http.get("/api/v1/chat/history", params={"session_id": session_id},
                                  headers=auth(alice))).json()
        assert [m["content"] for m in history["messages"]] == ["hello cloud", "You said: hello cloud"]
        assert [t["status"] for t in history["turns"]] == ["completed"]
        # the lease was released: the next turn runs too
        second = await sse(http, alice, {"session_id": session_id, "message": "again"})
        assert orjson.loads(second[-1].data)["status"] == "completed"

        images = (await http.get("/v1/images", headers=auth(alice))).json()["items"]
        assert [i["sessionId"] for i in images] == [session_id]
        # another tenant's ids answer as not found; no key is refused
        other = await http.get("/api/v1/chat/history", params={"session_id": session_id}, headers=auth(bob))
        assert (other.status_code, other.json()["error"]["message"]) == (404, f"Session not found: {session_id}")
        assert (await http.get("/v1/images", headers=auth(bob))).json()["items"] == []
        listed = (await http.get("/v1/sessions", headers=auth(alice))).json()
        assert [s["sessionId"] for s in listed["items"]] == [session_id] and listed["nextCursor"] is None
        assert (await http.get("/v1/sessions", headers=auth(bob))).json() == {"items": [], "nextCursor": None}
        refused = await http.post("/api/v1/chat/completions", json={"session_id": session_id, "message": "x"},
                                  headers=auth(bob))
        assert refused.status_code == 404
        assert (await http.get("/v1/images")).status_code == 401
        assert (await http.get("/api/v1/health")).json()["store"] == "ok"
