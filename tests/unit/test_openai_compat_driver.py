"""The OpenAI-compatible driver against a local server streaming real Chat Completions chunks."""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import AsyncIterator, Iterator

import pytest

from agentvm.domain.models import Usage
from agentvm.drivers import openai_compat
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
from agentvm.drivers.openai_compat import OpenAICompatDriver
from agentvm.drivers.openai_wire import chat_body
from agentvm.errors import UpstreamError
from tests.fakes import fake_openai as oa
from tests.fakes.http_stub import StubServer

API_KEY = "sk-proj-test-Hq71Lm0PzX4vWc9R"
MODEL = "gpt-4o-mini"


@pytest.fixture
def server() -> Iterator[StubServer]:
    with StubServer() as stub:
        yield stub


@pytest.fixture(params=["httpx", "aiohttp"])
async def driver(server: StubServer, request: pytest.FixtureRequest) -> AsyncIterator[OpenAICompatDriver]:
    drv = OpenAICompatDriver(API_KEY, base_url=server.base_url + "/v1", timeout_s=10, max_retries=0,
                             http_client=request.param)
    yield drv
    await drv.aclose()


def _request(**overrides: object) -> LLMRequest:
    fields: dict[str, object] = {"model": MODEL, "max_tokens": 256, "messages": [{"role": "user", "content": "Hi"}]}
    fields.update(overrides)
    return LLMRequest(**fields)  # type: ignore[arg-type]


async def _collect(driver: OpenAICompatDriver, request: LLMRequest | None = None) -> list[DriverEvent]:
    async with asyncio.timeout(10):
        return [event async for event in driver.stream(request or _request())]


async def _until_error(driver: OpenAICompatDriver,
                       request: LLMRequest | None = None) -> tuple[list[DriverEvent], UpstreamError]:
    events: list[DriverEvent] = []
    async with asyncio.timeout(10):
        with pytest.raises(UpstreamError) as info:
            async for event in driver.stream(request or _request()):
                events.append(event)
    rendered = "".join(traceback.format_exception(info.value))
    assert API_KEY not in rendered and API_KEY not in info.value.message
    return events, info.value


# --- streams ---------------------------------------------------------------------------------

async def test_text_reply_with_usage_and_the_request_it_sent(server: StubServer,
                                                             driver: OpenAICompatDriver) -> None:
    server.enqueue(oa.text_reply(["Hel", "lo", " world"], prompt=1200, completion=7, cached=1024))

    events = await _collect(driver, _request(system="Be brief.", temperature=0.2, stop_sequences=["END"]))

    assert events == [
        MessageStart("chatcmpl-AbC123", oa.MODEL, Usage()),
        TextDelta("Hel"), TextDelta("lo"), TextDelta(" world"),
        UsageUpdate(Usage(176, 7, 1024, 0)),
        MessageStop("end_turn", Usage(176, 7, 1024, 0)),
    ]
    [sent] = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.json == {"model": MODEL, "max_tokens": 256, "stream": True,
                         "stream_options": {"include_usage": True}, "temperature": 0.2, "stop": ["END"],
                         "messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Hi"}]}


async def test_events_split_across_http_chunks_are_joined(server: StubServer, driver: OpenAICompatDriver) -> None:
    server.enqueue(oa.stream([oa.role_chunk(), *oa.text_chunks(["a", "b"]), oa.finish_chunk("length"),
                              oa.usage_chunk(3, 2)], split=True))

    events = await _collect(driver)

    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("a"), TextDelta("b")]
    assert events[-1] == MessageStop("max_tokens", Usage(3, 2, 0, 0))


async def test_tool_calls_with_argument_fragments_across_chunks(server: StubServer,
                                                                driver: OpenAICompatDriver) -> None:
    server.enqueue(oa.stream([
        *oa.tool_call_chunks(0, "call_A1", "get_weather", ['{"ci', 'ty": "Pa', 'ris"}']),
        *oa.tool_call_chunks(1, "call_B2", "list_files", ["{}"]),
        oa.finish_chunk("tool_calls"), oa.usage_chunk(80, 31)]))

    events = await _collect(driver)

    assert events == [
        MessageStart("chatcmpl-AbC123", oa.MODEL, Usage()),
        ToolUseStart("call_A1", "get_weather"),
        InputJsonDelta('{"ci'), InputJsonDelta('ty": "Pa'), InputJsonDelta('ris"}'),
        ToolUseStop("call_A1", "get_weather", {"city": "Paris"}),
        ToolUseStart("call_B2", "list_files"),
        InputJsonDelta("{}"),
        ToolUseStop("call_B2", "list_files", {}),
        UsageUpdate(Usage(80, 31, 0, 0)),
        MessageStop("tool_use", Usage(80, 31, 0, 0)),
    ]


async def test_text_then_a_tool_call_and_a_server_saying_stop(server: StubServer,
                                                              driver: OpenAICompatDriver) -> None:
    """Some servers (older Ollama) end a tool-calling reply with finish_reason "stop": still tool_use.
    Calls sent whole without an index are told apart by their ids."""
    whole = [oa.chunk({"tool_calls": [{"id": "c1", "type": "function",
                                       "function": {"name": "a", "arguments": '{"x": 1}'}}]}),
             oa.chunk({"tool_calls": [{"id": "c2", "type": "function",
                                       "function": {"name": "b", "arguments": '{"y": 2}'}}]})]
    server.enqueue(oa.stream([oa.role_chunk(), *oa.text_chunks(["Let me look."]), *whole,
                              oa.finish_chunk("stop"), oa.usage_chunk(10, 9)]))

    events = await _collect(driver)

    assert events[1:] == [
        TextDelta("Let me look."),
        ToolUseStart("c1", "a"), InputJsonDelta('{"x": 1}'), ToolUseStop("c1", "a", {"x": 1}),
        ToolUseStart("c2", "b"), InputJsonDelta('{"y": 2}'), ToolUseStop("c2", "b", {"y": 2}),
        UsageUpdate(Usage(10, 9, 0, 0)),
        MessageStop("tool_use", Usage(10, 9, 0, 0)),
    ]


async def test_reasoning_is_counted_not_shown_and_deepseek_cache_hits(server: StubServer,
                                                                      driver: OpenAICompatDriver) -> None:
    usage = oa.chunk(choices=False, model="deepseek-reasoner")
    usage["usage"] = {"prompt_tokens": 500, "completion_tokens": 40, "total_tokens": 540,
                      "prompt_cache_hit_tokens": 384, "prompt_cache_miss_tokens": 116}
    server.enqueue(oa.stream([oa.chunk({"role": "assistant", "content": None, "reasoning_content": "Hmm, "}),
                              oa.chunk({"reasoning_content": "ok."}), *oa.text_chunks(["42"]),
                              oa.finish_chunk("stop"), usage]))

    events = await _collect(driver)

    assert events[1:] == [HiddenOutput(5), HiddenOutput(3), TextDelta("42"), UsageUpdate(Usage(116, 40, 384, 0)),
                          MessageStop("end_turn", Usage(116, 40, 384, 0))]


async def test_no_usage_chunk_leaves_the_usage_unreported(server: StubServer) -> None:
    drv = OpenAICompatDriver(None, base_url=server.base_url, include_usage=False, max_retries=0,
                             max_tokens_field="max_completion_tokens")
    server.enqueue(oa.stream([oa.role_chunk(), *oa.text_chunks(["x"]), oa.finish_chunk("stop")]))
    try:
        events = await _collect(drv)
    finally:
        await drv.aclose()

    assert events[-1] == MessageStop("end_turn", Usage(), usage_final=False)
    [sent] = server.requests
    assert "authorization" not in sent.headers  # Ollama/vLLM without a key
    assert "stream_options" not in sent.json and sent.json["max_completion_tokens"] == 256


async def test_a_stream_without_done_after_its_finish_completes(server: StubServer,
                                                               driver: OpenAICompatDriver) -> None:
    server.enqueue(oa.stream([oa.role_chunk(), *oa.text_chunks(["ok"]), oa.finish_chunk("stop"),
                              oa.usage_chunk(4, 1)], done=False))

    events = await _collect(driver)

    assert events[-1] == MessageStop("end_turn", Usage(4, 1, 0, 0))


# --- failures --------------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "error_type", "code", "expected", "retryable"), [
    (400, "invalid_request_error", None, "invalid_request_error", False),
    (401, "invalid_request_error", "invalid_api_key", "authentication_error", False),
    (403, "invalid_request_error", "unsupported_country_region_territory", "permission_error", False),
    (404, "invalid_request_error", "model_not_found", "not_found_error", False),
    (429, "requests", "rate_limit_exceeded", "rate_limit_error", True),
    (429, "insufficient_quota", "insufficient_quota", "billing_error", False),
    (500, "server_error", None, "api_error", True),
    (503, "server_error", None, "api_error", True),
])
async def test_http_errors_map_like_the_anthropic_drivers(server: StubServer, driver: OpenAICompatDriver,
                                                          status: int, error_type: str, code: str | None,
                                                          expected: str, retryable: bool) -> None:
    server.enqueue(oa.error(status, f"Upstream says no ({API_KEY})", error_type=error_type, code=code))

    events, error = await _until_error(driver)

    assert events == []
    assert (error.code, error.retryable) == (expected, retryable)
    if status in (401, 403):  # the upstream's text may name the operator's key or account: not passed on
        assert error.message == ("The OpenAI-compatible upstream refused the configured credentials "
                                 f"(HTTP {status}: {code})")
    else:
        assert error.message == "Upstream says no ([redacted])"


async def test_retryable_errors_are_retried_before_output(server: StubServer,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    delays: list[float] = []

    async def no_sleep(delay: float) -> None:
        delays.append(delay)

    monkeypatch.setattr(openai_compat, "_sleep", no_sleep)
    server.enqueue(oa.error(429, "slow down", error_type="requests", code="rate_limit_exceeded",
                            headers={"retry-after": "3"}),
                   oa.error(500, "oops", error_type="server_error"), oa.text_reply(["fine"]))
    drv = OpenAICompatDriver(API_KEY, base_url=server.base_url, max_retries=2)
    try:
        events = await _collect(drv)
    finally:
        await drv.aclose()

    assert TextDelta("fine") in events
    assert len(server.requests) == 3 and delays[0] == 3.0 and 0.75 <= delays[1] <= 1.0  # the 2nd retry: 1 s - jitter


async def test_should_retry_false_vetoes_and_non_retryable_is_not_retried(server: StubServer,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_compat, "_sleep", lambda _d: asyncio.sleep(0))
    server.enqueue(oa.error(500, "no", error_type="server_error", headers={"x-should-retry": "false"}),
                   oa.error(400, "bad", param="messages"))
    drv = OpenAICompatDriver(API_KEY, base_url=server.base_url, max_retries=3)
    try:
        _, first = await _until_error(drv)
        _, second = await _until_error(drv)
    finally:
        await drv.aclose()
    assert (first.code, second.code, len(server.requests)) == ("api_error", "invalid_request_error", 2)


async def test_an_error_inside_the_stream_after_output_is_raised(server: StubServer,
                                                                 driver: OpenAICompatDriver) -> None:
    server.enqueue(oa.stream([oa.role_chunk(), *oa.text_chunks(["par"]),
                              {"error": {"message": "The server had an error", "type": "server_error"}}],
                             done=False))

    events, error = await _until_error(driver)

    assert events[-1] == TextDelta("par")
    assert (error.code, error.retryable) == ("api_error", True)


async def test_a_cut_stream_is_a_retryable_connection_error(server: StubServer, driver: OpenAICompatDriver) -> None:
    server.enqueue(oa.stream([oa.role_chunk(), *oa.text_chunks(["par"])], done=False, cut=True))

    events, error = await _until_error(driver)

    assert events[-1] == TextDelta("par")
    assert (error.code, error.retryable) == ("connection_error", True)


async def test_a_stream_ending_before_its_finish_is_a_connection_error(server: StubServer,
                                                                      driver: OpenAICompatDriver) -> None:
    server.enqueue(oa.stream([oa.role_chunk(), *oa.text_chunks(["par"])], done=False))

    _, error = await _until_error(driver)

    assert (error.code, error.retryable) == ("connection_error", True)
    assert error.message == "The OpenAI-compatible upstream stream ended before the reply finished"


async def test_a_malformed_chunk(server: StubServer, driver: OpenAICompatDriver) -> None:
    server.enqueue(oa.stream(['{"id": "x", "choi'], done=False))

    _, error = await _until_error(driver)

    assert (error.code, error.retryable) == ("malformed_response", True)


async def test_unreachable_upstream(driver: OpenAICompatDriver) -> None:
    drv = OpenAICompatDriver(API_KEY, base_url="http://127.0.0.1:9", max_retries=0)
    try:
        _, error = await _until_error(drv)
    finally:
        await drv.aclose()
    assert (error.code, error.retryable) == ("connection_error", True)


# --- request translation ---------------------------------------------------------------------

def test_a_tool_round_trip_with_images_translates_to_chat_messages() -> None:
    png = "iVBORw0KGgo="
    request = _request(
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is here?"},
                                         {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": png}},
                                         {"type": "image", "source": {"type": "url",
                                                                      "url": "https://x.test/a.jpg"}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                              {"type": "text", "text": "Checking."},
                                              {"type": "tool_use", "id": "call_1", "name": "look",
                                               "input": {"q": "cat"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                          "content": [{"type": "text", "text": "a cat"},
                                                      {"type": "image", "source": {
                                                          "type": "base64", "media_type": "image/jpeg",
                                                          "data": "AAAA"}}]},
                                         {"type": "text", "text": "And now?", "cache_control": {"type": "ephemeral"}}]},
        ],
        tools=[{"name": "look", "description": "Look it up", "input_schema": {
            "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True})

    body = chat_body(request, max_tokens_field="max_completion_tokens")

    assert body["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "What is here?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
            {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}}]},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": '{"q": "cat"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a cat"},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}},
            {"type": "text", "text": "And now?"}]},
    ]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "look", "description": "Look it up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert body["max_completion_tokens"] == 256 and "max_tokens" not in body


@pytest.mark.parametrize(("choice", "expected"), [
    ({"type": "auto"}, "auto"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "look"}, {"type": "function", "function": {"name": "look"}}),
])
def test_tool_choice(choice: dict[str, str], expected: object) -> None:
    assert chat_body(_request(tool_choice=choice))["tool_choice"] == expected


@pytest.mark.parametrize(("overrides", "field", "text"), [
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]", "'web_search_20250305'"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "messages[0].content[0].type", "'document'"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]},
     "messages[0].content[0].source", "base64"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name", "needs the tool's name"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role", "'user' or 'assistant'"),
])
async def test_what_cannot_be_translated_is_refused_before_any_call(server: StubServer, driver: OpenAICompatDriver,
                                                                    overrides: dict[str, object], field: str,
                                                                    text: str) -> None:
    _, error = await _until_error(driver, _request(**overrides))

    assert (error.code, error.retryable, error.field) == ("invalid_request_error", False, field)
    assert text in error.message
    assert server.requests == []


async def test_a_refusal_streams_as_text(server: StubServer, driver: OpenAICompatDriver) -> None:
    server.enqueue(oa.stream([oa.chunk({"role": "assistant", "content": None, "refusal": ""}),
                              oa.chunk({"refusal": "I can't help"}), oa.chunk({"refusal": " with that."}),
                              oa.finish_chunk("stop"), oa.usage_chunk(9, 6)]))

    events = await _collect(driver)

    assert events[1:3] == [TextDelta("I can't help"), TextDelta(" with that.")]


async def test_a_consumer_that_stops_early_releases_the_stream(server: StubServer,
                                                               driver: OpenAICompatDriver) -> None:
    server.enqueue(oa.text_reply(["one", "two", "three"]), oa.text_reply(["again"]))

    async with asyncio.timeout(10):
        stream = driver.stream(_request())
        async for event in stream:
            if isinstance(event, TextDelta):
                break
        await stream.aclose()
        events = await _collect(driver)

    assert TextDelta("again") in events and len(server.requests) == 2


async def test_presets_name_the_provider_and_pick_the_max_tokens_field(server: StubServer) -> None:
    server.enqueue(oa.text_reply(["a"]), oa.text_reply(["b"]),
                   oa.error(401, f"Incorrect API key provided: {API_KEY}", code="invalid_api_key"))
    openai_drv = OpenAICompatDriver.for_provider("openai", API_KEY, base_url=server.base_url, max_retries=0)
    ollama = OpenAICompatDriver.for_provider("ollama", None, base_url=server.base_url)
    try:
        await _collect(openai_drv)
        await _collect(ollama)
        _, error = await _until_error(openai_drv)
    finally:
        await openai_drv.aclose()
        await ollama.aclose()

    assert (openai_drv.name, ollama.name) == ("openai", "ollama")
    first, second, _ = (r.json for r in server.requests)
    assert first["max_completion_tokens"] == 256 and "max_tokens" not in first
    assert second["max_tokens"] == 256 and "max_completion_tokens" not in second
    assert error.message == "OpenAI refused the configured credentials (HTTP 401: invalid_api_key)"
    assert OpenAICompatDriver.for_provider("deepseek", "k")._url == "https://api.deepseek.com/v1/chat/completions"
    with pytest.raises(ValueError, match="base_url: required for the OpenAI-compatible provider 'together'"):
        OpenAICompatDriver.for_provider("together", "k")
    custom = OpenAICompatDriver.for_provider("together", "k", base_url="https://api.together.xyz/v1")
    assert (custom.name, custom._url) == ("together", "https://api.together.xyz/v1/chat/completions")


def test_the_token_apis_system_blocks_and_top_p_reach_the_body() -> None:
    blocks = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Answer in French."}]
    body = chat_body(_request(system="ignored: the blocks win", system_blocks=blocks, top_p=0.5))
    assert body["messages"][0] == {"role": "system", "content": "Be brief.\n\nAnswer in French."}
    assert body["top_p"] == 0.5
    assert "top_p" not in chat_body(_request())


def test_the_upstream_factories_make_each_familys_driver() -> None:
    from agentvm.drivers.bedrock_converse import BedrockConverseDriver
    from agentvm.services.model_catalog import ProviderSpec
    from agentvm.services.model_drivers import upstream_factories

    factories = upstream_factories(timeout_s=30.0, max_retries=1)
    assert sorted(factories) == ["bedrock", "openai"]
    openai = factories["openai"](ProviderSpec("deepseek", "openai", "https://api.deepseek.com/v1", "DS_KEY"), "k")
    assert isinstance(openai, OpenAICompatDriver) and openai.name == "deepseek"
    assert repr(openai) == "OpenAICompatDriver(name='deepseek', base_url='https://api.deepseek.com/v1')"
    bedrock = factories["bedrock"](ProviderSpec("bedrock", "bedrock", region="us-west-2"), None)
    assert isinstance(bedrock, BedrockConverseDriver) and bedrock.name == "bedrock"
