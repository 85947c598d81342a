"""`avm doctor`'s SSE turn reads the chat stream with httpx-sse: events as the WHATWG format has them
(a `data:` field over several lines is one event), and a 200 that is no event stream is one FAIL
line naming the flag to fix, not a parse error."""

from __future__ import annotations

import io

import httpx
import pytest

from avm.doctor import Doctor, StepFailed, Targets

STREAM = (
    ": a heartbeat comment\n\n"
    'event: message\ndata: {"content": "O"}\n\n'
    'data: {"content":\ndata:  "K"}\n\n'  # one event over two data lines, no event name: "message"
    "event: done\r\n"
    'data: {"turn_id": "turn_1", "status": "completed", "model": "scripted", "duration_ms": 12,\r\n'
    'data: "cost": {"billed": "0.00000100"}}\r\n\r\n'
)


def doctor(reply: httpx.Response) -> Doctor:
    d = Doctor(Targets("http://avm.test", "ws://avm.test/ws", "http://avm.test"), None, None, 5.0, io.StringIO())
    d.state.session_id = "sess_1"

    def handler(request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("POST", "/api/v1/chat/completions")
        return reply

    d._http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return d


async def test_the_sse_turn_reads_events_of_several_data_lines() -> None:
    d = doctor(httpx.Response(200, headers={"content-type": "text/event-stream"}, content=STREAM.encode()))
    try:
        line = await d._sse_turn()
    finally:
        await d._http.aclose()
    assert line == "turn turn_1 completed: 2 characters from scripted, 12 ms, 0.00000100 USD billed"


async def test_a_200_that_is_no_event_stream_names_the_flag() -> None:
    d = doctor(httpx.Response(200, headers={"content-type": "text/html"}, content=b"<html>it works</html>"))
    try:
        with pytest.raises(StepFailed) as info:
            await d._sse_turn()
    finally:
        await d._http.aclose()
    assert (info.value.reason, info.value.fix) == (
        "POST /api/v1/chat/completions answered 'text/html', not text/event-stream",
        "is --stream-url right (a stack: ChatStreamUrl)?")
