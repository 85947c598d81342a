"""Driver contract suite against the fake Anthropic Messages API (real HTTP on 127.0.0.1).

Every test that takes `make_driver` runs once per driver factory in `_FACTORIES`; a new
Anthropic-compatible driver joins the contract by adding a factory there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Literal, Protocol

import anthropic
import pytest

from agentvm.domain.models import Usage
from agentvm.drivers import anthropic_lite
from agentvm.drivers.anthropic_lite import AnthropicLiteDriver
from agentvm.drivers.anthropic_sdk import AnthropicDriver
from agentvm.drivers.base import (
    DriverEvent,
    HiddenOutput,
    InputJsonDelta,
    LLMRequest,
    MessageStart,
    MessageStop,
    TextDelta,
    ToolUseStart,
    ToolUseStop,
    UsageUpdate,
)
from agentvm.drivers.sse import SSEEvent, SSEParser, aiter_sse
from agentvm.errors import UpstreamError
from agentvm.ports import Driver
from tests.fakes.fake_anthropic import (
    ErrorReply,
    FakeAnthropic,
    FakeUsage,
    Interrupt,
    Reply,
    Text,
    Thinking,
    ToolUse,
)

API_KEY = "sk-ant-test-Zq81xY7mKp3NcVbT"
MODEL = "claude-test-1"
REPO_ROOT = Path(__file__).resolve().parents[2]


class MakeDriver(Protocol):
    def __call__(self, base_url: str, *, timeout_s: float = 10.0) -> Driver: ...


def _anthropic_sdk(base_url: str, timeout_s: float) -> Driver:
    return AnthropicDriver(API_KEY, base_url=base_url, timeout_s=timeout_s, max_retries=0)


def _anthropic_lite(base_url: str, timeout_s: float) -> Driver:
    return AnthropicLiteDriver(API_KEY, base_url=base_url, timeout_s=timeout_s, max_retries=0)


def _anthropic_lite_aiohttp(base_url: str, timeout_s: float) -> Driver:
    return AnthropicLiteDriver(API_KEY, base_url=base_url, timeout_s=timeout_s, max_retries=0, http_client="aiohttp")


_FACTORIES: dict[str, Callable[[str, float], Driver]] = {"anthropic_sdk": _anthropic_sdk,
                                                         "anthropic_lite": _anthropic_lite,
                                                         "anthropic_lite_aiohttp": _anthropic_lite_aiohttp}


@pytest.fixture(params=sorted(_FACTORIES))
async def make_driver(request: pytest.FixtureRequest) -> AsyncIterator[MakeDriver]:
    factory = _FACTORIES[request.param]
    created: list[Driver] = []

    def make(base_url: str, *, timeout_s: float = 10.0) -> Driver:
        driver = factory(base_url, timeout_s)
        created.append(driver)
        return driver

    yield make
    for driver in created:
        aclose = getattr(driver, "aclose", None)
        if aclose is not None:
            await aclose()


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


@pytest.fixture
def driver(make_driver: MakeDriver, fake: FakeAnthropic) -> Driver:
    return make_driver(fake.base_url)


def _request(**overrides: object) -> LLMRequest:
    fields: dict[str, object] = {"model": MODEL, "max_tokens": 256,
                                 "messages": [{"role": "user", "content": "Hi"}]}
    fields.update(overrides)
    return LLMRequest(**fields)  # type: ignore[arg-type]


async def _collect(driver: Driver, request: LLMRequest | None = None) -> list[DriverEvent]:
    async with asyncio.timeout(10):
        return [event async for event in driver.stream(request or _request())]


async def _collect_until_error(driver: Driver,
                               request: LLMRequest | None = None) -> tuple[list[DriverEvent], UpstreamError]:
    events: list[DriverEvent] = []
    async with asyncio.timeout(10):
        with pytest.raises(UpstreamError) as info:
            async for event in driver.stream(request or _request()):
                events.append(event)
    return events, info.value


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _assert_no_key(exc: BaseException) -> None:
    rendered = "".join(traceback.format_exception(exc))
    assert API_KEY not in str(exc)
    assert API_KEY not in repr(exc)
    assert API_KEY not in rendered
    if isinstance(exc, UpstreamError):
        assert API_KEY not in exc.message


# --- successful streams ----------------------------------------------------------------------

async def test_text_reply(fake: FakeAnthropic, driver: Driver) -> None:
    fake.enqueue(Reply([Text(["Hel", "", "lo", " world"])], message_id="msg_01",
                       usage=FakeUsage(input_tokens=25, output_tokens=12, cache_read_input_tokens=100,
                                       cache_creation_input_tokens=50)))

    events = await _collect(driver)

    assert events == [
        MessageStart("msg_01", MODEL, Usage(25, 1, 100, 50)),
        TextDelta("Hel"),
        TextDelta("lo"),
        TextDelta(" world"),
        UsageUpdate(Usage(25, 12, 100, 50)),
        MessageStop("end_turn", Usage(25, 12, 100, 50)),
    ]


async def test_model_and_id_come_from_the_response(fake: FakeAnthropic, driver: Driver) -> None:
    fake.enqueue(Reply([Text("ok")], message_id="msg_served", model="claude-served-2"))

    events = await _collect(driver)

    assert events[0] == MessageStart("msg_served", "claude-served-2", Usage(10, 1, 0, 0))


async def test_tool_use(fake: FakeAnthropic, driver: Driver) -> None:
    tool = ToolUse("toolu_01", "get_weather", {"city": "Paris", "units": ["metric", "c"]}, chunks=3)
    fake.enqueue(Reply([tool], stop_reason="tool_use", message_id="msg_t",
                       usage=FakeUsage(input_tokens=40, output_tokens=17)))
    pieces = tool.pieces()
    assert len(pieces) == 3

    events = await _collect(driver)

    assert events == [
        MessageStart("msg_t", MODEL, Usage(40, 1, 0, 0)),
        ToolUseStart("toolu_01", "get_weather"),
        *[InputJsonDelta(piece) for piece in pieces],
        ToolUseStop("toolu_01", "get_weather", {"city": "Paris", "units": ["metric", "c"]}),
        UsageUpdate(Usage(40, 17, 0, 0)),
        MessageStop("tool_use", Usage(40, 17, 0, 0)),
    ]


async def test_multi_block_text_then_tools_counts_thinking_but_does_not_show_it(fake: FakeAnthropic,
                                                                                driver: Driver) -> None:
    fake.enqueue(Reply(
        [Thinking(["Let me ", "check."]), Text(["Checking ", "both."]),
         ToolUse("toolu_a", "read", {"path": "/a"}, partial_json=['{"path"', ': "/a"}']),
         ToolUse("toolu_b", "list", {}, partial_json=["{}"])],
        stop_reason="tool_use", message_id="msg_m", usage=FakeUsage(input_tokens=8, output_tokens=30)))

    events = await _collect(driver)

    assert events == [
        MessageStart("msg_m", MODEL, Usage(8, 1, 0, 0)),
        HiddenOutput(len("Let me ")),
        HiddenOutput(len("check.")),
        TextDelta("Checking "),
        TextDelta("both."),
        ToolUseStart("toolu_a", "read"),
        InputJsonDelta('{"path"'),
        InputJsonDelta(': "/a"}'),
        ToolUseStop("toolu_a", "read", {"path": "/a"}),
        ToolUseStart("toolu_b", "list"),
        InputJsonDelta("{}"),
        ToolUseStop("toolu_b", "list", {}),
        UsageUpdate(Usage(8, 30, 0, 0)),
        MessageStop("tool_use", Usage(8, 30, 0, 0)),
    ]


@pytest.mark.parametrize("partial_json", [[], ['{"a": ', "1"], ["[1, 2]"]],
                         ids=["empty", "unparseable", "not-an-object"])
async def test_tool_input_falls_back_to_empty_object(fake: FakeAnthropic, driver: Driver,
                                                    partial_json: list[str]) -> None:
    fake.enqueue(Reply([ToolUse("toolu_x", "f", partial_json=partial_json)], stop_reason="tool_use"))

    events = await _collect(driver)

    stops = [e for e in events if isinstance(e, ToolUseStop)]
    assert stops == [ToolUseStop("toolu_x", "f", {})]
    assert [e for e in events if isinstance(e, InputJsonDelta)] == [InputJsonDelta(p) for p in partial_json]


async def test_usage_reported_by_message_delta_wins(fake: FakeAnthropic, driver: Driver) -> None:
    fake.enqueue(Reply([Text("x")], start_usage=FakeUsage(25, 1, 0, 0),
                       usage=FakeUsage(input_tokens=30, output_tokens=9, cache_read_input_tokens=5,
                                       cache_creation_input_tokens=6),
                       delta_reports_input=True))

    events = await _collect(driver)

    assert events[0] == MessageStart("msg_fake_1", MODEL, Usage(25, 1, 0, 0))
    assert events[-1] == MessageStop("end_turn", Usage(30, 9, 5, 6))


async def test_missing_stop_reason_defaults_to_end_turn(fake: FakeAnthropic, driver: Driver) -> None:
    fake.enqueue(Reply([Text("x")], stop_reason=None))

    events = await _collect(driver)

    assert events[-1] == MessageStop("end_turn", Usage(10, 5, 0, 0))


async def test_sequential_streams_and_early_close_reuse_the_driver(fake: FakeAnthropic,
                                                                  driver: Driver) -> None:
    fake.enqueue(Reply([Text(["a", "b", "c"])], event_delay_s=0.01), Reply([Text("second")]))

    stream = driver.stream(_request())
    async with asyncio.timeout(10):
        first = [await anext(stream), await anext(stream)]
        await stream.aclose()
        second = await _collect(driver)

    assert first == [MessageStart("msg_fake_1", MODEL, Usage(10, 1, 0, 0)), TextDelta("a")]
    assert [e for e in second if isinstance(e, TextDelta)] == [TextDelta("second")]
    assert len(fake.requests) == 2


# --- request mapping -------------------------------------------------------------------------

async def test_request_fields_are_sent_as_given(fake: FakeAnthropic, driver: Driver) -> None:
    messages = [
        {"role": "user", "content": "What's the weather?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "-3C"}]},
    ]
    tools = [{"name": "get_weather", "description": "Weather for a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}]

    await _collect(driver, _request(messages=messages, system="Be terse.", tools=tools, max_tokens=1024,
                                    temperature=0.25))

    sent = fake.last_request
    assert sent.method == "POST"
    assert sent.path == "/v1/messages"
    assert sent.api_key == API_KEY
    assert sent.body == {"model": MODEL, "max_tokens": 1024, "messages": messages, "system": "Be terse.",
                         "tools": tools, "temperature": 0.25, "stream": True}


async def test_unset_fields_are_not_sent(fake: FakeAnthropic, driver: Driver) -> None:
    await _collect(driver, _request(system=None, tools=[], temperature=None))

    assert fake.last_request.body == {"model": MODEL, "max_tokens": 256,
                                      "messages": [{"role": "user", "content": "Hi"}], "stream": True}


# --- errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("reply", "code", "retryable"), [
    (ErrorReply.rate_limit(retry_after_s=0, message="Rate limited, slow down"), "rate_limit_error", True),
    (ErrorReply.overloaded("Overloaded"), "overloaded_error", True),
    (ErrorReply.api_error("Internal server error"), "api_error", True),
    (ErrorReply.invalid_request("messages: Field required"), "invalid_request_error", False),
    (ErrorReply(401, "authentication_error", "invalid x-api-key"), "authentication_error", False),
], ids=["429", "529", "500", "400", "401"])
async def test_http_errors_map_to_upstream_error(fake: FakeAnthropic, driver: Driver, reply: ErrorReply,
                                                 code: str, retryable: bool) -> None:
    fake.enqueue(reply)

    events, exc = await _collect_until_error(driver)

    assert events == []
    assert (exc.code, exc.retryable, exc.message) == (code, retryable, reply.message)
    assert len(fake.requests) == 1  # max_retries=0: no retry
    _assert_no_key(exc)


async def test_error_event_mid_stream_after_text(fake: FakeAnthropic, driver: Driver) -> None:
    fake.enqueue(Reply([Text(["Hel", "lo", "never sent"])], message_id="msg_e",
                       interrupt=Interrupt(after_deltas=2, kind="error", error_type="overloaded_error",
                                           message="Overloaded")))

    events, exc = await _collect_until_error(driver)

    assert events == [MessageStart("msg_e", MODEL, Usage(10, 1, 0, 0)), TextDelta("Hel"), TextDelta("lo")]
    assert (exc.code, exc.retryable, exc.message) == ("overloaded_error", True, "Overloaded")
    _assert_no_key(exc)


async def test_non_retryable_error_event_mid_stream(fake: FakeAnthropic, driver: Driver) -> None:
    fake.enqueue(Reply([Text(["a", "b"])], interrupt=Interrupt(1, "error", "invalid_request_error", "bad")))

    events, exc = await _collect_until_error(driver)

    assert events[1:] == [TextDelta("a")]
    assert (exc.code, exc.retryable, exc.message) == ("invalid_request_error", False, "bad")


@pytest.mark.parametrize("kind", ["disconnect", "truncate"])
async def test_stream_cut_mid_way_is_a_connection_error(fake: FakeAnthropic, driver: Driver,
                                                        kind: Literal["disconnect", "truncate"]) -> None:
    fake.enqueue(Reply([Text(["part", "rest"])], message_id="msg_c", interrupt=Interrupt(1, kind)))

    events, exc = await _collect_until_error(driver)

    assert events == [MessageStart("msg_c", MODEL, Usage(10, 1, 0, 0)), TextDelta("part")]
    assert (exc.code, exc.retryable) == ("connection_error", True)
    _assert_no_key(exc)


@pytest.mark.parametrize("raw", ['event: content_block_delta\ndata: {"type": "content_bl\n\n',
                                 "event: content_block_delta\ndata: <html>502</html>\n\n",
                                 'event: content_block_delta\ndata: {"type": "\udcff"}\n\n'],
                         ids=["truncated-json", "garbage", "invalid-utf8"])
async def test_a_malformed_event_mid_stream_is_a_malformed_response(fake: FakeAnthropic, driver: Driver,
                                                                     raw: str) -> None:
    fake.enqueue(Reply([Text(["one", "two"])], message_id="msg_m", interrupt=Interrupt(1, "malformed", raw=raw)))

    events, exc = await _collect_until_error(driver)

    assert events == [MessageStart("msg_m", MODEL, Usage(10, 1, 0, 0)), TextDelta("one")]
    # no parser internals (exception names, character offsets) in the message a client sees
    assert (exc.code, exc.retryable, exc.message) == ("malformed_response", True,
                                                      "Anthropic sent a malformed stream event")


async def test_a_junk_line_that_is_no_sse_field_is_ignored(fake: FakeAnthropic, driver: Driver) -> None:
    fake.enqueue(Reply([Text(["one", "two"])], interrupt=Interrupt(1, "malformed", raw="<html>oops</html>\n")))

    events = await _collect(driver)  # the WHATWG parser ignores a line with an unknown field name

    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("one"), TextDelta("two")]
    assert isinstance(events[-1], MessageStop)


async def test_connection_refused(make_driver: MakeDriver) -> None:
    driver = make_driver(f"http://127.0.0.1:{_free_port()}")

    events, exc = await _collect_until_error(driver)

    assert events == []
    assert (exc.code, exc.retryable) == ("connection_error", True)
    _assert_no_key(exc)


async def test_timeout(fake: FakeAnthropic, make_driver: MakeDriver) -> None:
    fake.enqueue(Reply(delay_s=3.0))
    driver = make_driver(fake.base_url, timeout_s=0.3)

    events, exc = await _collect_until_error(driver)

    assert events == []
    assert (exc.code, exc.retryable) == ("timeout", True)
    _assert_no_key(exc)


async def test_api_key_echoed_by_upstream_is_redacted(fake: FakeAnthropic, driver: Driver) -> None:
    fake.enqueue(ErrorReply(401, "authentication_error", f"invalid x-api-key: {API_KEY}"))

    _, exc = await _collect_until_error(driver)

    assert exc.code == "authentication_error"
    assert exc.message.startswith("invalid x-api-key: ")
    _assert_no_key(exc)


# --- SDK driver specifics --------------------------------------------------------------------

async def test_sdk_client_is_created_lazily_and_reused(fake: FakeAnthropic) -> None:
    driver = AnthropicDriver(API_KEY, base_url=fake.base_url, max_retries=0)
    assert driver.name == "anthropic"
    assert API_KEY not in repr(driver)
    try:
        assert driver._client is None
        await _collect(driver)
        client = driver._client
        await _collect(driver)
        assert client is not None
        assert driver._client is client
    finally:
        await driver.aclose()
    assert len(fake.requests) == 2


# --- lite driver specifics -------------------------------------------------------------------

def _lite(base_url: str, *, max_retries: int = 2, timeout_s: float = 10.0) -> AnthropicLiteDriver:
    return AnthropicLiteDriver(API_KEY, base_url=base_url, timeout_s=timeout_s, max_retries=max_retries)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The lite driver's backoff sleeps, recorded instead of slept."""
    recorded: list[float] = []

    async def fake_sleep(delay: float) -> None:
        recorded.append(delay)

    monkeypatch.setattr(anthropic_lite, "_sleep", fake_sleep)
    return recorded


async def test_lite_client_is_created_lazily_reused_and_keeps_the_connection(fake: FakeAnthropic) -> None:
    driver = _lite(fake.base_url + "/")
    assert driver.name == "anthropic"
    assert repr(driver) == f"AnthropicLiteDriver(base_url='{fake.base_url}/')"
    try:
        assert driver._http.client is None
        await _collect(driver)
        client = driver._http.client
        assert client is not None
        pool = client._transport._pool  # type: ignore[attr-defined]
        first_connections = list(pool.connections)
        await _collect(driver)
        assert driver._http.client is client
        # The first stream was drained to its end, so its keep-alive connection served the second.
        assert len(first_connections) == 1
        assert list(pool.connections) == first_connections
    finally:
        await driver.aclose()
    assert driver._http.client is None
    assert [(r.method, r.path) for r in fake.requests] == [("POST", "/v1/messages")] * 2


async def test_lite_sends_the_api_key_and_version_headers(fake: FakeAnthropic) -> None:
    driver = AnthropicLiteDriver(API_KEY, base_url=fake.base_url, anthropic_version="2099-01-01")
    try:
        await _collect(driver)
    finally:
        await driver.aclose()

    headers = fake.last_request.headers
    assert headers["x-api-key"] == API_KEY
    assert headers["anthropic-version"] == "2099-01-01"
    assert headers["content-type"] == "application/json"
    assert "authorization" not in headers


def test_lite_makes_a_new_client_for_a_new_event_loop(fake: FakeAnthropic) -> None:
    driver = _lite(fake.base_url)
    clients: list[object] = []

    async def call() -> list[DriverEvent]:
        events = await _collect(driver)
        client = driver._http.client
        assert client is not None
        clients.append(client)
        await client.aclose()  # behind the driver's back: reusing this client would now fail
        return events

    first = asyncio.run(call())
    second = asyncio.run(call())  # a new loop: the driver does not reuse the first loop's client
    asyncio.run(driver.aclose())  # the client of a finished loop is dropped, not closed from here

    assert first[-1] == second[-1] == MessageStop("end_turn", Usage(10, 5, 0, 0))
    assert clients[0] is not clients[1]
    assert driver._http.client is None
    assert len(fake.requests) == 2


async def test_lite_retries_a_429_after_its_retry_after(fake: FakeAnthropic, sleeps: list[float]) -> None:
    fake.enqueue(ErrorReply.rate_limit(retry_after_s=0), Reply([Text(["after ", "retry"])], message_id="msg_r"))
    driver = _lite(fake.base_url)
    try:
        events = await _collect(driver)
    finally:
        await driver.aclose()

    assert events == [MessageStart("msg_r", MODEL, Usage(10, 1, 0, 0)), TextDelta("after "), TextDelta("retry"),
                      UsageUpdate(Usage(10, 5, 0, 0)), MessageStop("end_turn", Usage(10, 5, 0, 0))]
    assert len(fake.requests) == 2
    assert sleeps == [0.0]


async def test_lite_gives_up_after_max_retries(fake: FakeAnthropic, sleeps: list[float]) -> None:
    fake.enqueue(*[ErrorReply.overloaded("Overloaded")] * 3, Reply())
    driver = _lite(fake.base_url, max_retries=2)
    try:
        events, exc = await _collect_until_error(driver)
    finally:
        await driver.aclose()

    assert events == []
    assert (exc.code, exc.retryable, exc.message) == ("overloaded_error", True, "Overloaded")
    assert len(fake.requests) == 3
    assert fake.pending == 1
    # Jittered exponential backoff: 0.5 s then 1 s, each less up to 25 %.
    assert len(sleeps) == 2
    assert 0.375 <= sleeps[0] <= 0.5
    assert 0.75 <= sleeps[1] <= 1.0
    assert exc.__cause__ is None and exc.__suppress_context__
    _assert_no_key(exc)


@pytest.mark.parametrize("interrupt", [
    Interrupt(1, "error", "overloaded_error", "Overloaded"),
    Interrupt(1, "disconnect"),
    Interrupt(1, "truncate"),
], ids=["error-event", "disconnect", "truncate"])
async def test_lite_never_retries_once_an_event_was_yielded(fake: FakeAnthropic, sleeps: list[float],
                                                           interrupt: Interrupt) -> None:
    fake.enqueue(Reply([Text(["one", "two"])], message_id="msg_i", interrupt=interrupt), Reply())
    driver = _lite(fake.base_url, max_retries=2)
    try:
        events, exc = await _collect_until_error(driver)
    finally:
        await driver.aclose()

    assert events == [MessageStart("msg_i", MODEL, Usage(10, 1, 0, 0)), TextDelta("one")]
    assert exc.retryable is True
    assert exc.code == ("overloaded_error" if interrupt.kind == "error" else "connection_error")
    assert len(fake.requests) == 1
    assert sleeps == []


@pytest.mark.parametrize("reply", [
    ErrorReply.invalid_request("messages: Field required"),
    ErrorReply(401, "authentication_error", "invalid x-api-key"),
    ErrorReply(529, "overloaded_error", "Overloaded", {"x-should-retry": "false"}),
], ids=["400", "401", "x-should-retry-false"])
async def test_lite_does_not_retry_what_it_must_not(fake: FakeAnthropic, sleeps: list[float],
                                                   reply: ErrorReply) -> None:
    fake.enqueue(reply, Reply())
    driver = _lite(fake.base_url, max_retries=2)
    try:
        _, exc = await _collect_until_error(driver)
    finally:
        await driver.aclose()

    assert (exc.code, exc.message) == (reply.error_type, reply.message)
    assert len(fake.requests) == 1
    assert sleeps == []


async def test_lite_retries_connection_errors(sleeps: list[float]) -> None:
    driver = _lite(f"http://127.0.0.1:{_free_port()}", max_retries=3)
    try:
        events, exc = await _collect_until_error(driver)
    finally:
        await driver.aclose()

    assert events == []
    assert (exc.code, exc.retryable) == ("connection_error", True)
    assert len(sleeps) == 3
    _assert_no_key(exc)


async def test_lite_retries_a_timeout(fake: FakeAnthropic, sleeps: list[float]) -> None:
    # The timeout is generous enough for the second attempt on a loaded CI machine; the first
    # attempt's handler, still sleeping, is cancelled when the fake stops.
    fake.enqueue(Reply(delay_s=60.0), Reply([Text("late but fine")]))
    driver = _lite(fake.base_url, max_retries=1, timeout_s=2.0)
    try:
        events = await _collect(driver)
    finally:
        await driver.aclose()

    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("late but fine")]
    assert len(fake.requests) == 2
    assert len(sleeps) == 1


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, None),
    ({"retry-after": "0"}, 0.0),
    ({"retry-after": "2.5"}, 2.5),
    ({"retry-after-ms": "250", "retry-after": "3"}, 0.25),
    ({"retry-after-ms": "soon", "retry-after": "3"}, 3.0),
    ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),
    ({"retry-after": "-1"}, None),
    ({"retry-after": "nan"}, None),
])
def test_lite_retry_after_parsing(headers: dict[str, str], expected: float | None) -> None:
    assert anthropic_lite.retry_after_s(headers) == expected


def test_lite_retry_delay() -> None:
    assert anthropic_lite.retry_delay_s(0, 0.0) == 0.0
    assert anthropic_lite.retry_delay_s(3, 1.5) == 1.5
    assert anthropic_lite.retry_delay_s(0, 120.0) == 8.0  # retry-after is capped
    for retries_done, nominal in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (10, 8.0)]:
        for _ in range(50):
            assert nominal * 0.75 <= anthropic_lite.retry_delay_s(retries_done, None) <= nominal


async def test_lite_429_retry_honours_the_capped_retry_after(fake: FakeAnthropic, sleeps: list[float]) -> None:
    fake.enqueue(ErrorReply(429, "rate_limit_error", "slow down", {"retry-after": "30"}), Reply())
    driver = _lite(fake.base_url, max_retries=1)
    try:
        events = await _collect(driver)
    finally:
        await driver.aclose()

    assert isinstance(events[-1], MessageStop)
    assert sleeps == [8.0]


def test_lite_request_body() -> None:
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    assert anthropic_lite.request_body(_request(system="S", tools=tools, temperature=0.0)) == {
        "model": MODEL, "max_tokens": 256, "messages": [{"role": "user", "content": "Hi"}], "system": "S",
        "tools": tools, "temperature": 0.0, "stream": True}


# --- the SSE parser --------------------------------------------------------------------------

_SSE_STREAM = (
    "\ufeff: a comment, then an event with CRLF line ends\r\n"
    'event: message_start\r\ndata: {"type": "message_start"}\r\n\r\n'
    "event:ping\ndata:\n\n"  # no space after the colon; an empty data field still dispatches
    "data: line one\ndata:  line two\ndata\n: comment inside\n\n"  # no event field; a bare `data`
    "event: only-an-event\n\n"  # no data field: not dispatched
    "\n\n"  # blank lines alone dispatch nothing
    "id: 7\nretry: 100\nunknown: x\nevent: é\rdata: ünï 🎉\r\r"  # CR line ends, multi-byte text
    "event:\ndata: x\r\n\r\n"  # an empty event field is no event name
    "event: tail\ndata: unterminated\n"  # the stream ends mid-event: dropped
).encode()

_SSE_EVENTS = [
    SSEEvent("message_start", '{"type": "message_start"}'),
    SSEEvent("ping", ""),
    SSEEvent(None, "line one\n line two\n"),
    SSEEvent("é", "ünï 🎉"),
    SSEEvent(None, "x"),
]


def _parse(chunks: list[bytes]) -> list[SSEEvent]:
    parser = SSEParser()
    return [event for chunk in chunks for event in parser.feed(chunk)]


def test_sse_parses_a_whole_stream() -> None:
    assert _parse([_SSE_STREAM]) == _SSE_EVENTS


def test_sse_split_at_every_byte_boundary() -> None:
    data = _SSE_STREAM
    assert _parse([data[i:i + 1] for i in range(len(data))]) == _SSE_EVENTS
    for i in range(len(data) + 1):
        assert _parse([data[:i], b"", data[i:]]) == _SSE_EVENTS, i
    for i in range(0, len(data) + 1, 3):
        for j in range(i, len(data) + 1):
            assert _parse([data[:i], data[i:j], data[j:]]) == _SSE_EVENTS, (i, j)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_sse_line_endings(newline: bytes) -> None:
    lines = [b"event: e", b"data: a", b"data: b", b"", b"data: c", b""]
    data = newline.join(lines) + newline
    assert _parse([data]) == [SSEEvent("e", "a\nb"), SSEEvent(None, "c")]
    # A CRLF split between its CR and LF is one line end, not two (which would be a blank line).
    assert _parse([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]) == [SSEEvent(None, "a\nb")]


async def test_sse_aiter_over_a_byte_stream() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(_SSE_STREAM), 7):
            yield _SSE_STREAM[i:i + 7]

    assert [event async for event in aiter_sse(chunks())] == _SSE_EVENTS


# --- the fake itself -------------------------------------------------------------------------

async def test_fake_serves_non_streaming_messages(fake: FakeAnthropic) -> None:
    fake.enqueue(Reply([Text(["Hi ", "there"]), ToolUse("toolu_9", "f", {"x": 1})], stop_reason="tool_use",
                       message_id="msg_j", usage=FakeUsage(3, 4, 5, 6)))
    async with anthropic.AsyncAnthropic(api_key=API_KEY, base_url=fake.base_url, max_retries=0,
                                        timeout=10) as client:
        message = await client.messages.create(model=MODEL, max_tokens=10,
                                               messages=[{"role": "user", "content": "Hi"}])

    assert message.id == "msg_j"
    assert [block.model_dump(exclude_none=True) for block in message.content] == [
        {"type": "text", "text": "Hi there"},
        {"type": "tool_use", "id": "toolu_9", "name": "f", "input": {"x": 1}},
    ]
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens, message.usage.cache_read_input_tokens,
            message.usage.cache_creation_input_tokens) == (3, 4, 5, 6)
    assert fake.last_request.body.get("stream") is None


async def test_fake_runs_standalone_with_a_script(tmp_path: Path, make_driver: MakeDriver) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([
        {"blocks": [{"type": "text", "chunks": ["from ", "script"]}], "message_id": "msg_s"},
        {"error": {"status": 529, "type": "overloaded_error", "message": "Busy"}},
    ]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fakes.fake_anthropic", "--port", "0", "--script", str(script),
        cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode().strip()
        assert line.startswith("listening http://127.0.0.1:")
        driver = make_driver(line.removeprefix("listening "))

        events = await _collect(driver)
        _, exc = await _collect_until_error(driver)

        assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("from "), TextDelta("script")]
        assert events[0] == MessageStart("msg_s", MODEL, Usage(10, 1, 0, 0))
        assert (exc.code, exc.message) == ("overloaded_error", "Busy")
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
    assert proc.returncode == 0  # SIGTERM is a clean shutdown


async def test_tool_choice_and_stop_sequences_are_sent(fake: FakeAnthropic, driver: Driver) -> None:
    fake.enqueue(Reply([Text("ok")]))
    tools = [{"name": "look", "input_schema": {"type": "object", "properties": {}}}]

    await _collect(driver, _request(tools=tools, tool_choice={"type": "tool", "name": "look"},
                                    stop_sequences=["END", "STOP"]))

    body = fake.requests[0].body
    assert body["tool_choice"] == {"type": "tool", "name": "look"}
    assert body["stop_sequences"] == ["END", "STOP"]


async def test_unset_tool_choice_and_stop_sequences_are_left_out(fake: FakeAnthropic, driver: Driver) -> None:
    fake.enqueue(Reply([Text("ok")]))

    await _collect(driver)

    assert "tool_choice" not in fake.requests[0].body and "stop_sequences" not in fake.requests[0].body
