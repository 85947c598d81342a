"""The SDK-free Anthropic driver's non-streamed call (`LLMRequest.stream` False: the token API's
non-streamed requests): `stream: false` on the wire, the one JSON message mapped onto the events its
stream would give, and a 200 whose body is cut or malformed billed as a stream broken after its start;
over both HTTP clients (drivers/upstream_http.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from agentvm.domain.models import Principal, Usage
from agentvm.drivers.anthropic_lite import AnthropicLiteDriver
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
)
from agentvm.drivers.token_bounds import worst_input_tokens
from agentvm.errors import UpstreamError
from tests.fakes.fake_anthropic import ErrorReply, FakeAnthropic, FakeUsage, Reply, Text, ToolUse
from tests.unit.test_token_gateway import gateway, records

MODEL = "claude-haiku-4-5"
CLIENTS = ["httpx", "aiohttp"]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


@pytest.fixture(params=CLIENTS)
async def driver(request: pytest.FixtureRequest, fake: FakeAnthropic) -> AsyncIterator[AnthropicLiteDriver]:
    fake.reset()
    made = AnthropicLiteDriver("sk-test", base_url=fake.base_url, timeout_s=10, max_retries=2,
                               http_client=request.param)
    yield made
    await made.aclose()


def _request(*, stream: bool = False, max_tokens: int = 100) -> LLMRequest:
    return LLMRequest(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens, stream=stream)


async def _events(driver: AnthropicLiteDriver, request: LLMRequest) -> list[DriverEvent]:
    async with asyncio.timeout(10):
        return [event async for event in driver.stream(request)]


async def test_a_non_streamed_call_asks_for_one_message_and_gives_the_events_of_its_stream(
        fake: FakeAnthropic, driver: AnthropicLiteDriver) -> None:
    tool = ToolUse("toolu_1", "weather", {"city": "Oslo"})
    usage = FakeUsage(input_tokens=1000, output_tokens=200, cache_read_input_tokens=3000,
                      cache_creation_input_tokens=400)
    fake.enqueue(Reply([Text(["Let me ", "look."]), tool], stop_reason="tool_use", message_id="msg_j", usage=usage))

    events = await _events(driver, _request())

    final = Usage(1000, 200, 3000, 400)
    assert events == [MessageStart("msg_j", MODEL, final), TextDelta("Let me look."),
                      ToolUseStart("toolu_1", "weather"), InputJsonDelta('{"city": "Oslo"}'),
                      ToolUseStop("toolu_1", "weather", {"city": "Oslo"}), MessageStop("tool_use", final)]
    [sent] = fake.requests
    assert sent.body["stream"] is False
    assert sent.headers["content-type"] == "application/json"
    assert (sent.headers["x-api-key"], sent.headers["anthropic-version"]) == ("sk-test", "2023-06-01")


async def test_a_streamed_call_still_streams(fake: FakeAnthropic, driver: AnthropicLiteDriver) -> None:
    fake.enqueue(Reply([Text(["a", "b"])]))

    events = await _events(driver, _request(stream=True))

    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("a"), TextDelta("b")]
    assert fake.requests[0].body["stream"] is True


async def test_a_non_streamed_call_is_retried_on_a_429_as_a_stream_is(
        fake: FakeAnthropic, driver: AnthropicLiteDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def no_sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr("agentvm.drivers.anthropic_lite._sleep", no_sleep)
    fake.enqueue(ErrorReply.rate_limit(retry_after_s=0.25), Reply([Text("ok")]))

    events = await _events(driver, _request())

    assert events[1:] == [TextDelta("ok"), MessageStop("end_turn", Usage(10, 5))]
    assert slept == [0.25] and len(fake.requests) == 2


class Bad200:
    """A server that answers every request 200 with `body`, its Content-Length `missing` bytes more than
    it sends (the connection then cut); `served` counts the requests."""

    def __init__(self) -> None:
        self.body, self.missing, self.served, self.url = b"{}", 0, 0, ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        self.served += 1
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: "
                     + str(len(self.body) + self.missing).encode() + b"\r\n\r\n" + self.body)
        await writer.drain()
        writer.close()


@pytest.fixture
async def bad_200() -> AsyncIterator[Bad200]:
    bad = Bad200()
    server = await asyncio.start_server(bad.handle, "127.0.0.1", 0)
    bad.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield bad
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("body", "missing", "code"), [
    (b'{"type": "message", "content": [{"ty', 0, "malformed_response"),
    (b'{"type": "error"}', 0, "malformed_response"),
    (b"<html>oops</html>", 0, "malformed_response"),
    (b'{"type": "message", "content": [{"ty', 500, "connection_error"),
], ids=["cut-json", "not-a-message", "html", "cut-connection"])
async def test_a_200_whose_message_is_unreadable_is_started_with_its_output_unknown_and_not_retried(
        bad_200: Bad200, client: str, body: bytes, missing: int, code: str) -> None:
    bad_200.body, bad_200.missing = body, missing
    driver = AnthropicLiteDriver("sk-test", base_url=bad_200.url, timeout_s=10, max_retries=2, http_client=client)
    seen: list[DriverEvent] = []
    try:
        with pytest.raises(UpstreamError) as failed:
            async with asyncio.timeout(10):
                async for event in driver.stream(_request(max_tokens=300)):
                    seen.append(event)
    finally:
        await driver.aclose()

    assert seen == [MessageStart("", ""), HiddenOutput(300)]
    assert failed.value.code == code and bad_200.served == 1


async def test_a_broken_non_streamed_call_is_billed_its_input_bound_and_max_tokens_of_output(
        bad_200: Bad200, tmp_path: Path) -> None:
    bad_200.body = b'{"id": "msg_cut", "type": "mess'
    driver = AnthropicLiteDriver("sk-test", base_url=bad_200.url, timeout_s=10, max_retries=0, http_client="aiohttp")
    try:
        async with gateway(tmp_path, driver) as (gw, ledger):
            call = await gw.start(Principal("t1"), MODEL, _request(max_tokens=300))
            with pytest.raises(UpstreamError):
                async for _ in call.events:
                    pass
            [(provider, model, status, usage, billed, estimated)] = await records(ledger)
    finally:
        await driver.aclose()

    inputs = worst_input_tokens(_request())
    assert (provider, model, status, usage, estimated) == ("anthropic", MODEL, "failed", Usage(inputs, 300), True)
    # Haiku 4.5: input 1, output 5 USD per million tokens; × 1.05
    assert Decimal(billed) == (inputs * Decimal(1) + 300 * Decimal(5)) / 1_000_000 * Decimal("1.05")


@pytest.mark.parametrize("client", CLIENTS)
async def test_the_proxy_of_the_environment_is_used(client: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[bytes] = []
    message = json.dumps({"id": "msg_p", "type": "message", "model": MODEL, "content": [{"type": "text", "text": "p"}],
                          "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}}).encode()

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines.append(head.split(b"\r\n")[0])
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: "
                     + str(len(message)).encode() + b"\r\n\r\n" + message)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    driver = AnthropicLiteDriver("sk-test", base_url="http://anthropic.invalid", timeout_s=10, max_retries=0,
                                 http_client=client)
    try:
        events = await _events(driver, _request())
        await _events(driver, _request())  # the proxy looked up once, used again
    finally:
        await driver.aclose()
        server.close()
        await server.wait_closed()

    assert events[1] == TextDelta("p")
    assert lines == [b"POST http://anthropic.invalid/v1/messages HTTP/1.1"] * 2


def test_the_message_json_is_what_the_fake_serves() -> None:
    # the mapping reads the fields Anthropic's non-streamed answer has (the fake's, checked by the SDK
    # in test_anthropic_driver.test_fake_serves_non_streaming_messages)
    from agentvm.drivers.anthropic_lite import message_events

    message = {"id": "m", "type": "message", "role": "assistant", "model": MODEL, "stop_reason": "end_turn",
               "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "x"}],
               "usage": {"input_tokens": 3, "output_tokens": 4}}
    assert message_events(json.loads(json.dumps(message))) == [
        MessageStart("m", MODEL, Usage(3, 4)), TextDelta("x"), MessageStop("end_turn", Usage(3, 4))]
