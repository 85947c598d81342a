"""Upstream faults, end to end: a real `avm serve` runtime (in-process) with the real Anthropic
drivers, built as the composition roots build them for an API key, against the fake Anthropic API
(`tests/fakes/fake_anthropic.py`), driven by a stock AgentX WebSocket client (and once by the SSE
chat API).

Each fault is checked for exact behaviour: retried with backoff (or the server's `retry-after`)
only before anything was streamed to the user; afterwards, or once retries are exhausted, the turn
ends with the error triple and keeps what was produced; usage reported before the failure is billed
exactly once, with the output already streamed (one token per byte, marked estimated); no stack
trace reaches the client; another connection's concurrent turn on the same server is unaffected
and the next message on the faulted session completes.

One server per driver serves the whole module (the tests that need other LLM settings start their
own): every test faults it again on new connections, and checks it stayed well. Each test's victim
conversation carries a fresh marker and its replies are scripted for that marker only
(`enqueue(match=...)`), as are the bystander's, so concurrent turns never race for the fake's queue.
Backoff sleeps are recorded instead of slept (`sleeps`), except in the test that measures one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic._base_client as sdk_base_client
import anyio
import httpx
import pytest
import pytest_asyncio

from agentvm.domain.usage import UsageRecord
from agentvm.drivers import anthropic_lite
from agentvm.ids import now_ms
from tests.fakes.fake_anthropic import (
    ErrorReply,
    FakeAnthropic,
    FakeUsage,
    Interrupt,
    Reply,
    Response,
    Text,
)
from tests.support.servers import InProcess, free_port, with_anthropic_driver
from tests.support.stock_client import Event, StockClient

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the module's servers live on the module's loop

API_KEY = "sk-ant-reliability-Qw7ZtK3mP9"
MODEL = "claude-sonnet-4-6"
MAX_RETRIES = 2
DRIVERS = ["sdk", "lite"]  # avm serve's (the anthropic SDK) and the function tier's (httpx, no SDK)

ERROR_TRIPLE = ["error_received", "error_message", "error_occurred"]
ERROR_TYPES = {*ERROR_TRIPLE, "system_error"}
START = ["message_persisted", "message_start", "conversation_start"]
TWO_CHUNKS = ["text_delta", "conversation_responding", "text_delta"]
# a completed two-chunk text turn, as the sender sees it (spec §3.9)
COMPLETED = [*START, *TWO_CHUNKS, "message_stop", "assistant_message", "conversation_end", "turn_response"]
# a turn that failed before anything streamed
FAILED_BEFORE_STREAM = ["message_persisted", *ERROR_TRIPLE, "turn_response"]
# a turn that failed after two text chunks streamed: no message_stop, no assistant_message event
FAILED_MID_STREAM = [*START, *TWO_CHUNKS, *ERROR_TRIPLE, "turn_response"]

# what must never reach a client: tracebacks, source paths, exception class names, library internals
LEAK = re.compile(r"Traceback|File \"|\.py\b|\b[A-Z][A-Za-z]*(?:Error|Exception)\b|httpx|anyio|"
                  r"anthropic\.|site-packages|" + re.escape(API_KEY))

# jittered exponential backoff of both drivers: 0.5 s then 1 s, each less up to 25 %
BACKOFF = [(0.375, 0.5), (0.75, 1.0)]


# --- the rig ---------------------------------------------------------------------------------

class _AnyioRecordingSleep:
    """Stands in for the `anyio` module inside the SDK's base client (used there only for the retry
    sleep): records each delay instead of sleeping it."""

    def __init__(self, record: Callable[[float], Any]) -> None:
        self.sleep = record

    def __getattr__(self, name: str) -> Any:
        return getattr(anyio, name)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every retry delay either driver chose, recorded instead of slept."""
    recorded: list[float] = []

    async def record(delay: float) -> None:
        recorded.append(delay)
        await asyncio.sleep(0)

    monkeypatch.setattr(anthropic_lite, "_sleep", record)
    monkeypatch.setattr(sdk_base_client, "anyio", _AnyioRecordingSleep(record))
    return recorded


def settings_for(base_url: str, *, timeout_s: float) -> dict[str, Any]:
    return {"llm_api_key": API_KEY, "llm_base_url": base_url, "llm_model": MODEL, "llm_timeout_s": timeout_s,
            "llm_max_retries": MAX_RETRIES}


@contextlib.asynccontextmanager
async def serve(data_dir: Path, kind: str, base_url: str, *, timeout_s: float = 10.0) -> AsyncIterator[InProcess]:
    """`avm serve` in-process with an Anthropic key pointing at `base_url` (`with_anthropic_driver`)."""
    async with with_anthropic_driver(data_dir, kind, settings_for(base_url, timeout_s=timeout_s)) as srv:
        yield srv


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(api_key=API_KEY) as f:
        yield f


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory, fake: FakeAnthropic) -> AsyncIterator[dict[str, InProcess]]:
    """One server per driver for the module: each test faults it again and checks it stayed well."""
    async with serve(tmp_path_factory.mktemp("sdk"), "sdk", fake.base_url) as sdk, \
            serve(tmp_path_factory.mktemp("lite"), "lite", fake.base_url) as lite:
        yield {"sdk": sdk, "lite": lite}


@dataclass
class Rig:
    srv: InProcess
    fake: FakeAnthropic | None  # None while nothing listens at the upstream address
    fault: str  # a marker in the victim's messages: the fake's replies scripted for it go to it only
    calm: str  # the bystander's marker
    victim: StockClient  # the connection whose turns meet the faults
    image: str
    bystander: StockClient  # another connection, another container, same server
    bystander_image: str

    def script(self, *responses: Response) -> None:
        assert self.fake is not None
        self.fake.enqueue(*responses, match=self.fault)

    def fault_requests(self) -> list[float]:
        """When each request of the victim's conversation reached the fake."""
        assert self.fake is not None
        return [r.at for r in self.fake.requests if self.fault in json.dumps(r.body)]

    async def usage_records(self, turn_id: str) -> list[UsageRecord]:
        meter = self.srv.runtime.services.deps.meter
        assert meter is not None
        records = await meter.ledger.list_usage("local", since_ms=now_ms() - 86_400_000, until_ms=now_ms() + 1)
        return [r for r in records if r.turn_id == turn_id]

    async def history(self) -> list[dict[str, Any]]:
        res = await self.victim.request("image_messages_request", {"imageId": self.image})
        return list(res["data"]["messages"])

    async def fault_turn(self, content: str, *, with_bystander: bool = True) -> list[Event]:
        """The victim's turn, with a bystander turn on the other connection running at the same time
        (checked to be unaffected)."""
        if not with_bystander:
            return await self.victim.turn(self.image, f"{self.fault} {content}")
        events, _ = await asyncio.gather(self.victim.turn(self.image, f"{self.fault} {content}"),
                                         self.bystander_turn())
        return events

    async def bystander_turn(self) -> None:
        assert self.fake is not None
        self.fake.enqueue(Reply([Text(["Still ", "here."])]), match=self.calm)
        start = len(self.bystander.events)
        events = await self.bystander.turn(self.bystander_image, f"{self.calm} are you there?")
        assert types(events) == COMPLETED
        assert text_of(events) == "Still here."
        assert turn_response(events)["status"] == "completed"
        assert not [e for e in self.bystander.events[start:] if e["type"] in ERROR_TYPES]
        # none of the victim's session events reached the bystander's connection
        assert not [e for e in self.bystander.events if (e.get("context") or {}).get("imageId") == self.image]

    async def next_message_completes(self, *, scripted: bool = False) -> None:
        """The next message on the faulted session: a normal, completed turn (`scripted`: its reply
        is already queued)."""
        if not scripted:
            self.script(Reply([Text(["Back ", "again."])]))
        events = await self.victim.turn(self.image, f"{self.fault} once more")
        assert types(events) == COMPLETED
        assert text_of(events) == "Back again."
        assert turn_response(events)["status"] == "completed"


@contextlib.asynccontextmanager
async def connect(srv: InProcess, fake: FakeAnthropic | None) -> AsyncIterator[Rig]:
    """Two new connections, each with a new container and image; afterwards: both connections and the
    server are still up, nothing leaked to either client, and the victim lost no event."""
    n = uuid.uuid4().hex[:10]
    async with StockClient(srv.url) as victim, StockClient(srv.url) as bystander:
        mine, theirs = await asyncio.gather(victim.new_image(f"c-victim-{n}"),
                                            bystander.new_image(f"c-bystander-{n}"))
        yield Rig(srv, fake, f"FAULT-{n}", f"CALM-{n}", victim, mine["imageId"], bystander, theirs["imageId"])
        assert not victim.closed.is_set() and not bystander.closed.is_set()
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{srv.http}/health", timeout=5)).json()["status"] == "ok"
        assert_no_leak(victim)
        assert_no_leak(bystander)
        assert_no_event_lost(victim, mine["imageId"])


# --- assertions ------------------------------------------------------------------------------

def types(events: list[Event]) -> list[str]:
    return [e["type"] for e in events]


def text_of(events: list[Event]) -> str:
    return "".join(e["data"]["text"] for e in events if e["type"] == "text_delta")


def turn_response(events: list[Event]) -> dict[str, Any]:
    [tr] = [e["data"] for e in events if e["type"] == "turn_response"]
    return dict(tr)


def error_triple(events: list[Event]) -> tuple[str, str]:
    """The triple's code and message, checked to agree across its three events."""
    got = {e["type"]: e["data"] for e in events if e["type"] in ERROR_TRIPLE}
    code, message = got["error_occurred"]["code"], got["error_occurred"]["message"]
    assert got["error_occurred"]["recoverable"] is True
    assert got["error_received"] == {"message": message, "errorCode": code}
    assert (got["error_message"]["content"], got["error_message"]["errorCode"]) == (message, code)
    assert got["error_message"]["role"] == "error"
    return code, message


def no_error_frames(client: StockClient, start: int = 0) -> None:
    assert not [e for e in client.events[start:] if e["type"] in ERROR_TYPES
                or (e.get("category") == "response" and "error" in (e.get("data") or {}))]


def assert_no_leak(client: StockClient) -> None:
    text = json.dumps(client.raw)
    assert not LEAK.search(text), LEAK.search(text)


def assert_no_event_lost(client: StockClient, image: str) -> None:
    """The victim's session events arrived in seq order with no gap but the `user_message` after each
    `message_persisted` (sent to the other subscribers only): no event was lost to a fault."""
    got = [(e["seq"], e["type"]) for e in client.events
           if "seq" in e and (e.get("context") or {}).get("imageId") == image]
    seqs = [s for s, _ in got]
    if not seqs:
        return  # no turn on the WebSocket (the SSE chat test)
    assert seqs == sorted(set(seqs))
    persisted = {s for s, t in got if t == "message_persisted"}
    missing = set(range(seqs[0], seqs[-1] + 1)) - set(seqs)
    assert missing == {s + 1 for s in persisted} - {seqs[-1] + 1}


def assert_billed_once(records: list[UsageRecord], tr: dict[str, Any], *, input_tokens: int, output_tokens: int,
                       status: str, estimated: bool = False) -> None:
    """Exactly one usage record for the turn's one call, with the reported tokens, and the turn's cost
    (what the user was told) equal to the record's."""
    [record] = records
    assert record.record_id == f"{tr['turnId']}#llm#1"
    assert (record.usage.input_tokens, record.usage.output_tokens) == (input_tokens, output_tokens)
    assert record.estimated is estimated
    assert (record.status, record.model, record.provider) == (status, MODEL, "anthropic")
    assert tr["usage"] == {"inputTokens": input_tokens, "outputTokens": output_tokens,
                           "cacheReadTokens": 0, "cacheWriteTokens": 0}
    assert Decimal(tr["cost"]["billed"]) == record.billed_cost > 0
    assert Decimal(tr["cost"]["list"]) == record.list_cost


# --- retried before anything streamed --------------------------------------------------------

@pytest.mark.parametrize(("fault", "expected_delay"), [
    (ErrorReply.rate_limit(retry_after_s=2), 2.0),
    (ErrorReply.overloaded(retry_after_s=3), 3.0),
    (ErrorReply.api_error(), None),  # no retry-after: the jittered backoff
], ids=["429-retry-after", "529-retry-after", "500"])
@pytest.mark.parametrize("kind", DRIVERS)
async def test_a_retryable_status_is_retried_and_the_turn_completes(
        servers: dict[str, InProcess], fake: FakeAnthropic, sleeps: list[float], kind: str, fault: ErrorReply,
        expected_delay: float | None) -> None:
    async with connect(servers[kind], fake) as r:
        r.script(fault, Reply([Text(["Fine ", "now."])], usage=FakeUsage(321, 12)))
        events = await r.fault_turn("hello")

        assert types(events) == COMPLETED
        assert text_of(events) == "Fine now."
        no_error_frames(r.victim)  # the user saw nothing of the fault
        assert len(r.fault_requests()) == 2  # one retry
        if expected_delay is None:
            [delay] = sleeps
            assert BACKOFF[0][0] <= delay <= BACKOFF[0][1]
        else:
            assert sleeps == [expected_delay]  # the server's retry-after, not the backoff
        tr = turn_response(events)
        assert tr["status"] == "completed"
        assert_billed_once(await r.usage_records(tr["turnId"]), tr, input_tokens=321, output_tokens=12,
                           status="completed")
        assert [m["subtype"] for m in await r.history()] == ["user", "assistant"]
        await r.next_message_completes()


@pytest.mark.parametrize("kind", DRIVERS)
async def test_the_retry_really_waits_the_servers_retry_after(servers: dict[str, InProcess], fake: FakeAnthropic,
                                                              kind: str) -> None:
    """Not patched: the gap between the two requests is the server's retry-after (0.25 s, below the
    0.375 s the backoff would wait at least)."""
    async with connect(servers[kind], fake) as r:
        r.script(ErrorReply.overloaded(retry_after_s=0.25), Reply([Text(["Fine ", "now."])]))
        events = await r.fault_turn("hello", with_bystander=False)
        assert types(events) == COMPLETED
        no_error_frames(r.victim)
        first, second = r.fault_requests()
        assert second - first >= 0.25


# --- retries exhausted -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", DRIVERS)
async def test_retries_exhausted_end_the_turn_with_the_error_triple(
        servers: dict[str, InProcess], fake: FakeAnthropic, sleeps: list[float], kind: str) -> None:
    async with connect(servers[kind], fake) as r:
        r.script(*[ErrorReply.overloaded(retry_after_s=1)] * (MAX_RETRIES + 1))
        events = await r.fault_turn("hello")

        assert types(events) == FAILED_BEFORE_STREAM
        assert error_triple(events) == ("overloaded_error", "Overloaded")
        assert len(r.fault_requests()) == MAX_RETRIES + 1
        assert sleeps == [1.0] * MAX_RETRIES
        tr = turn_response(events)
        assert (tr["status"], tr["messageId"], tr["stopReason"]) == ("failed", None, None)
        assert tr["usage"] == {"inputTokens": 0, "outputTokens": 0, "cacheReadTokens": 0, "cacheWriteTokens": 0}
        assert Decimal(tr["cost"]["billed"]) == 0
        assert await r.usage_records(tr["turnId"]) == []  # no token was reported: nothing billed
        history = await r.history()
        assert [m["subtype"] for m in history] == ["user", "error"]
        assert (history[1]["content"], history[1]["errorCode"]) == ("Overloaded", "overloaded_error")
        await r.next_message_completes()


# --- no connection, no first byte ------------------------------------------------------------

@pytest.mark.parametrize("kind", DRIVERS)
async def test_connection_refused_is_retried_then_the_error_triple(tmp_path: Path, sleeps: list[float],
                                                                   kind: str) -> None:
    port = free_port()  # nothing listens there until a fake comes up on it
    async with serve(tmp_path / "data", kind, f"http://127.0.0.1:{port}") as srv, connect(srv, None) as r:
        events = await r.fault_turn("hello", with_bystander=False)

        assert types(events) == FAILED_BEFORE_STREAM
        assert error_triple(events) == ("connection_error", "Could not reach Anthropic or the connection was lost")
        assert len(sleeps) == MAX_RETRIES  # three attempts
        for delay, (low, high) in zip(sleeps, BACKOFF, strict=True):
            assert low <= delay <= high
        tr = turn_response(events)
        assert tr["status"] == "failed"
        assert await r.usage_records(tr["turnId"]) == []
        assert [m["subtype"] for m in await r.history()] == ["user", "error"]

        # the upstream comes back: the same server and both connections go on
        with FakeAnthropic(api_key=API_KEY, port=port) as upstream:
            r.fake = upstream
            await r.bystander_turn()
            await r.next_message_completes()


@pytest.mark.parametrize("kind", DRIVERS)
async def test_a_timeout_before_the_first_byte_is_retried_then_the_error_triple(
        tmp_path: Path, fake: FakeAnthropic, sleeps: list[float], kind: str) -> None:
    # llm_timeout_s 0.3 s for the whole server: the bystander's turn and the next message must not mind
    async with serve(tmp_path / "data", kind, fake.base_url, timeout_s=0.3) as srv, connect(srv, fake) as r:
        r.script(*[Reply(delay_s=1.0)] * (MAX_RETRIES + 1))  # no response head for 1 s
        events = await r.fault_turn("hello")  # the bystander's turn runs meanwhile

        assert types(events) == FAILED_BEFORE_STREAM
        assert error_triple(events) == ("timeout", "The request to Anthropic timed out")
        assert len(r.fault_requests()) == MAX_RETRIES + 1
        for delay, (low, high) in zip(sleeps, BACKOFF, strict=True):
            assert low <= delay <= high
        tr = turn_response(events)
        assert tr["status"] == "failed"
        assert await r.usage_records(tr["turnId"]) == []
        assert [m["subtype"] for m in await r.history()] == ["user", "error"]
        await r.next_message_completes()


# --- after something streamed: no retry ------------------------------------------------------

@pytest.mark.parametrize(("interrupt", "code", "message"), [
    (Interrupt(2, "disconnect"), "connection_error", "Could not reach Anthropic or the connection was lost"),
    (Interrupt(2, "error", "overloaded_error", "Overloaded"), "overloaded_error", "Overloaded"),
], ids=["connection-cut", "overloaded-event"])
@pytest.mark.parametrize("kind", DRIVERS)
async def test_a_stream_cut_mid_message_keeps_the_text_and_bills_once(
        servers: dict[str, InProcess], fake: FakeAnthropic, sleeps: list[float], kind: str, interrupt: Interrupt,
        code: str, message: str) -> None:
    async with connect(servers[kind], fake) as r:
        # a retryable failure, but text already reached the user: a retry would repeat or contradict it.
        # A retry would take the second reply, and the next message would not get "Back again."
        r.script(Reply([Text(["Hel", "lo, ", "wor", "ld"])], usage=FakeUsage(1234, 50), interrupt=interrupt,
                       message_id="msg_cut"),
                 Reply([Text(["Back ", "again."])]))
        events = await r.fault_turn("hello")

        assert types(events) == FAILED_MID_STREAM  # the triple follows the text deltas
        assert [e["data"]["text"] for e in events if e["type"] == "text_delta"] == ["Hel", "lo, "]
        assert error_triple(events) == (code, message)
        assert len(r.fault_requests()) == 1 and sleeps == []  # no retry
        tr = turn_response(events)
        assert (tr["status"], tr["messageId"]) == ("failed", "msg_cut")
        # message_start reported the input tokens (and 1 output token), then "Hel" + "lo, " streamed
        # (7 bytes) without a final count: billed once, 1 + 7 output tokens, marked estimated
        assert_billed_once(await r.usage_records(tr["turnId"]), tr, input_tokens=1234, output_tokens=8,
                           status="failed", estimated=True)
        history = await r.history()
        assert [m["subtype"] for m in history] == ["user", "assistant", "error"]
        assert history[1]["content"] == [{"type": "text", "text": "Hello, "}]  # the partial text is kept
        assert history[2]["errorCode"] == code

        await r.next_message_completes(scripted=True)
        # the next call's context carries the partial answer, not the error
        assert fake.requests[-1].body["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": f"{r.fault} hello"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello, "}]},
            {"role": "user", "content": [{"type": "text", "text": f"{r.fault} once more"}]}]


@pytest.mark.parametrize("kind", DRIVERS)
async def test_a_stream_cut_before_any_text_is_not_retried_and_bills_the_input_once(
        servers: dict[str, InProcess], fake: FakeAnthropic, sleeps: list[float], kind: str) -> None:
    """message_start (and the tokens it reports) already reached the user and the meter: no retry."""
    async with connect(servers[kind], fake) as r:
        r.script(Reply([Text(["never", " sent"])], usage=FakeUsage(2048, 9), interrupt=Interrupt(0, "disconnect")),
                 Reply([Text(["Back ", "again."])]))
        events = await r.fault_turn("hello")

        assert types(events) == [*START, *ERROR_TRIPLE, "turn_response"]
        assert error_triple(events)[0] == "connection_error"
        assert len(r.fault_requests()) == 1 and sleeps == []
        tr = turn_response(events)
        assert_billed_once(await r.usage_records(tr["turnId"]), tr, input_tokens=2048, output_tokens=1,
                           status="failed")
        assert [m["subtype"] for m in await r.history()] == ["user", "error"]  # no text: nothing to keep
        await r.next_message_completes(scripted=True)


MALFORMED = {
    "truncated-json": 'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, "delta": {"ty\n\n',
    "garbage-data": "event: content_block_delta\ndata: <html><body>502 Bad Gateway</body></html>\n\n",
}


@pytest.mark.parametrize("raw", list(MALFORMED.values()), ids=list(MALFORMED))
@pytest.mark.parametrize("kind", DRIVERS)
async def test_a_malformed_event_mid_stream_ends_the_turn_and_the_session_goes_on(
        servers: dict[str, InProcess], fake: FakeAnthropic, sleeps: list[float], kind: str, raw: str) -> None:
    async with connect(servers[kind], fake) as r:
        # the bad event comes after two text deltas; the stream then goes on as if nothing happened
        r.script(Reply([Text(["Hel", "lo, ", "wor", "ld"])], usage=FakeUsage(777, 40),
                       interrupt=Interrupt(2, "malformed", raw=raw)))
        events = await r.fault_turn("hello")

        assert types(events) == FAILED_MID_STREAM
        assert text_of(events) == "Hello, "
        assert error_triple(events) == ("malformed_response", "Anthropic sent a malformed stream event")
        assert len(r.fault_requests()) == 1 and sleeps == []
        tr = turn_response(events)
        assert_billed_once(await r.usage_records(tr["turnId"]), tr, input_tokens=777, output_tokens=8,
                           status="failed", estimated=True)
        assert [m["subtype"] for m in await r.history()] == ["user", "assistant", "error"]
        await r.next_message_completes()


# --- the SSE chat API ------------------------------------------------------------------------

def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":"))
        if "event" in fields:
            out.append((fields["event"], json.loads(fields["data"])))
    return out


async def test_a_stream_cut_over_the_sse_chat_api(servers: dict[str, InProcess], fake: FakeAnthropic,
                                                  sleeps: list[float]) -> None:
    async with connect(servers["lite"], fake) as r, httpx.AsyncClient(base_url=r.srv.http, timeout=10) as http:
        r.script(Reply([Text(["Hel", "lo, ", "wor", "ld"])], usage=FakeUsage(1234, 50),
                       interrupt=Interrupt(2, "disconnect")))
        res = await http.post("/api/v1/chat/completions", json={"agent_type": "chat_basic",
                                                                "message": f"{r.fault} hello"})
        got = sse_events(res.text)
        assert [name for name, _ in got] == ["thought", "message", "message", "error", "done"]
        assert [d["content"] for name, d in got if name == "message"] == ["Hel", "lo, "]
        assert got[3][1] == {"code": "connection_error",
                             "message": "Could not reach Anthropic or the connection was lost"}
        done = got[4][1]
        assert done["status"] == "failed" and sleeps == [] and len(r.fault_requests()) == 1
        [record] = await r.usage_records(done["turn_id"])
        assert (record.usage.input_tokens, record.usage.output_tokens, record.estimated) == (1234, 8, True)
        assert Decimal(done["cost"]["billed"]) == record.billed_cost
        assert not LEAK.search(res.text)

        # the same session goes on over HTTP
        r.script(Reply([Text(["Back ", "again."])]))
        again = sse_events((await http.post("/api/v1/chat/completions", json={
            "session_id": done["session_id"], "message": f"{r.fault} once more"})).text)
        assert [name for name, _ in again][-1] == "done" and again[-1][1]["status"] == "completed"
        assert "".join(d["content"] for name, d in again if name == "message") == "Back again."
        history = (await http.get("/api/v1/chat/history", params={"session_id": done["session_id"]})).json()
        assert [m["role"] for m in history["messages"]] == ["user", "assistant", "error", "user", "assistant"]
