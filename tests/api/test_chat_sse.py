"""The SSE chat API (`/api/v1`) through a real SSE client (httpx-sse): thought, message chunks and
done; an LLM failure as error then done; Last-Event-ID reconnects with exactly the missing events;
the same sessions as the WebSocket, both ways; a client that goes away does not stop its turn."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from httpx_sse import ServerSentEvent, aconnect_sse

from agentvm.drivers.scripted import ScriptedDriver, parse_script
from agentvm.protocol import envelope
from agentvm.services.chat import ChatTurn
from tests.support.scripts import REFERENCE_SCRIPT, RecordingDriver
from tests.support.servers import in_process
from tests.support.stock_client import StockClient
from tests.support.wire import watch_chat_feed

URL = "/api/v1/chat/completions"


@pytest.fixture(autouse=True)
def _session_events_match_the_models(monkeypatch: pytest.MonkeyPatch) -> None:
    watch_chat_feed(monkeypatch)


async def read_all(http: httpx.AsyncClient, body: dict[str, Any], **kw: Any) -> list[ServerSentEvent]:
    async with aconnect_sse(http, "POST", URL, json=body, **kw) as source:
        assert source.response.status_code == 200
        assert source.response.headers["content-type"].startswith("text/event-stream")
        return [e async for e in source.aiter_sse()]


def shape(events: list[ServerSentEvent]) -> list[str]:
    return [e.event for e in events]


def text(events: list[ServerSentEvent]) -> str:
    return "".join(orjson.loads(e.data)["content"] for e in events if e.event == "message")


async def wait_turns(http: httpx.AsyncClient, session_id: str, n: int) -> list[dict[str, Any]]:
    for _ in range(300):
        turns = (await http.get("/api/v1/chat/history", params={"session_id": session_id})).json()["turns"]
        if len(turns) >= n and all(t["status"] not in ("queued", "running") for t in turns):
            return list(turns)
        await asyncio.sleep(0.02)
    raise AssertionError("turns did not finish")


async def test_the_design_notes_example_streams_thought_message_chunks_and_done(tmp_path: Path) -> None:
    recorder = RecordingDriver(ScriptedDriver(parse_script(REFERENCE_SCRIPT)))
    async with in_process(tmp_path / "data", driver=recorder) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        events = await read_all(http, {"agent_type": "chat_basic", "message": "Hello!",
                                       "config": {"temperature": 0.2, "max_tokens": 50}})
        assert shape(events) == ["thought", "message", "message", "done"]
        assert orjson.loads(events[0].data) == {"kind": "thinking"}
        assert text(events) == "Hello there"
        done = orjson.loads(events[-1].data)
        session_id = done["session_id"]
        assert done["status"] == "completed" and done["usage"]["inputTokens"] == 12
        assert done["usage"]["outputTokens"] == 3 and "billed" in done["cost"]
        ids = [int(e.id) for e in events]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)  # session seqs
        # per-message config reaches the model call
        assert (recorder.requests[-1].temperature, recorder.requests[-1].max_tokens) == (0.2, 50)

        # an LLM failure: error, then done; the history says what happened
        failed = await read_all(http, {"session_id": session_id, "message": "error turn"})
        assert shape(failed) == ["error", "done"]  # it failed before any message started
        assert orjson.loads(failed[0].data) == {"code": "rate_limit_error", "message": "Rate limit exceeded"}
        assert orjson.loads(failed[-1].data)["status"] == "failed"
        history = (await http.get("/api/v1/chat/history", params={"session_id": session_id})).json()
        assert [(m["role"], m["content"]) for m in history["messages"]] == [
            ("user", "Hello!"), ("assistant", "Hello there"), ("user", "error turn"),
            ("error", "Rate limit exceeded")]
        assert [(t["status"], (t["error"] or {}).get("code")) for t in history["turns"]] == [
            ("completed", None), ("failed", "rate_limit_error")]
        first = history["turns"][0]
        assert (first["task"], first["options"]) == ("Hello!", {"temperature": 0.2, "maxTokens": 50})
        assert first["agent"].startswith("code:chat_basic@") and first["durationMs"] is not None


async def test_last_event_id_resumes_with_exactly_the_missing_events(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver(parse_script(REFERENCE_SCRIPT))) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        head: list[ServerSentEvent] = []
        async with aconnect_sse(http, "POST", URL, json={"agent_type": "chat_basic", "message": "slow"}) as source:
            async for event in source.aiter_sse():
                head.append(event)
                if len(head) == 3:
                    break  # the client drops mid-stream
        assert shape(head) == ["thought", "message", "message"]
        session_id = (await http.get("/v1/images")).json()["items"][0]["sessionId"]
        rest = await read_all(http, {"session_id": session_id, "message": "ignored on a resume"},
                              headers={"Last-Event-ID": head[-1].id})
        whole = await read_all(http, {"session_id": session_id, "message": "x"}, headers={"Last-Event-ID": "0"})
        assert [e.id for e in head + rest] == [e.id for e in whole]
        assert text(head + rest) == "one two three four five six seven eight"
        assert rest[-1].event == "done"
        # the GET form (a browser's EventSource reconnecting)
        async with aconnect_sse(http, "GET", "/api/v1/chat/stream", params={"session_id": session_id},
                                headers={"Last-Event-ID": head[-1].id}) as source:
            again = [e async for e in source.aiter_sse()]
        assert [e.id for e in again] == [e.id for e in rest]
        # the resume did not send a message: one turn only
        assert len(await wait_turns(http, session_id, 1)) == 1


async def test_a_conversation_moves_between_websocket_and_sse(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver()) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http, StockClient(srv.url) as ws:
        image = await ws.new_image("c-both", systemPrompt="be brief")
        await ws.turn(image["imageId"], "from the websocket")
        events = await read_all(http, {"session_id": image["sessionId"], "message": "from sse"})
        assert text(events) == "You said: from sse"
        # the WebSocket subscriber saw the SSE turn too
        await ws.wait_for(lambda e: e["type"] == "text_delta" and e["data"]["text"].strip() == "sse")
        await ws.turn(image["imageId"], "back on the websocket")
        history = (await ws.request("image_messages_request", {"imageId": image["imageId"]}))["data"]["messages"]
        users = [m["content"] for m in history if m["subtype"] == "user"]
        assert users == ["from the websocket", "from sse", "back on the websocket"]
        sse_history = (await http.get("/api/v1/chat/history", params={"session_id": image["sessionId"]})).json()
        assert [m["content"] for m in sse_history["messages"]][-1] == "You said: back on the websocket"


async def test_a_client_that_goes_away_does_not_stop_its_turn(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver(parse_script(REFERENCE_SCRIPT))) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        async with aconnect_sse(http, "POST", URL, json={"agent_type": "chat_basic", "message": "slow"}) as source:
            async for _event in source.aiter_sse():
                break
        session_id = (await http.get("/v1/images")).json()["items"][0]["sessionId"]
        [turn] = await wait_turns(http, session_id, 1)
        assert turn["status"] == "completed"
        assert len(srv.runtime.hub) == 0  # the feed was unregistered


async def test_agents_execute_health_and_clear_errors(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver(parse_script(REFERENCE_SCRIPT))) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        agents = (await http.get("/api/v1/agents")).json()["agents"]
        assert {"chat_basic", "coder"} <= {a["id"] for a in agents}
        assert (await http.get("/api/v1/agents/coder")).json()["definition"]["tools"][0] == "bash"
        missing = await http.get("/api/v1/agents/nobody")
        assert (missing.status_code, missing.json()["error"]["message"]) == (404, "Agent not found: nobody")

        result = (await http.post("/api/v1/agents/chat_basic/execute", json={"task": "Hello"})).json()
        assert (result["status"], result["result"]) == ("completed", "Hello there")
        assert result["log"]["turnId"] == result["turn_id"] and result["log"]["status"] == "completed"
        assert result["usage"]["outputTokens"] == 3 and result["thoughts"] == [{"kind": "thinking"}]
        failed = (await http.post("/api/v1/agents/chat_basic/execute",
                                  json={"task": "error turn", "session_id": result["session_id"]})).json()
        assert failed["status"] == "failed" and failed["error"]["code"] == "rate_limit_error"
        assert (await http.post("/api/v1/agents/nobody/execute", json={"task": "x"})).status_code == 404

        health = (await http.get("/api/v1/health")).json()
        assert health["status"] == "ok" and health["store"] == "ok"

        for body, status, field in [
            ({"message": "hi"}, 400, "agent_type"),
            ({"agent_type": "chat_basic", "message": "  "}, 400, "message"),
            ({"agent_type": "chat_basic", "message": "hi", "config": {"temperature": 3}}, 400, "config.temperature"),
            ({"session_id": "sess_nope", "message": "hi"}, 404, "sessionId"),
            ({"agent_type": "nobody", "message": "hi"}, 404, "agent_type"),
        ]:
            res = await http.post(URL, json=body)
            assert res.status_code == status, (body, res.text)
            assert res.json()["error"].get("field") == field, (body, res.text)
        bad = await http.post(URL, json={"session_id": result["session_id"], "message": "x"},
                              headers={"Last-Event-ID": "abc"})
        assert bad.json()["error"] == {"code": "invalid_request", "field": "Last-Event-ID",
                                       "message": "Last-Event-ID: 'abc' is not an event id of this API"}
        assert len(srv.runtime.hub) == 0


class _QuietFeed:
    connection_id = "conn_quiet"

    def __init__(self, frames: list[str]) -> None:
        self.frames = frames

    async def receive(self, timeout: float) -> str | None:
        if self.frames:
            return self.frames.pop(0)
        await asyncio.sleep(timeout)
        return None


async def test_heartbeats_while_nothing_happens_and_turns_ahead_are_skipped() -> None:
    def env(kind: str, data: dict[str, Any], seq: int) -> str:
        return envelope.encode(envelope.event(kind, data, {"sessionId": "s"}, seq=seq))

    frames = [env("text_delta", {"text": "earlier turn"}, 1), env("turn_response", {"turnId": "t0"}, 2),
              env("text_delta", {"text": "ours"}, 3)]
    turn = ChatTurn(session=None, turn_id="t1", feed=_QuietFeed(frames), ahead={"t0"})  # type: ignore[arg-type]
    got: list[Any] = []
    async for event in turn.events(heartbeat_s=0.01, timeout_s=0.2):
        got.append(event)
        if len(got) == 3:
            break
    assert got[0].data == {"content": "ours"} and got[0].id == 3
    assert got[1:] == [None, None]  # heartbeats
