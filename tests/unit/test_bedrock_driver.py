"""The Bedrock ConverseStream driver: a real botocore client (SigV4, HTTP, event-stream parsing)
against a local server sending the vnd.amazon.eventstream wire format, and botocore's Stubber."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Iterator

import botocore.eventstream
import botocore.session
import pytest
from botocore.stub import Stubber

from agentvm.domain.models import Usage
from agentvm.drivers import bedrock_converse
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
from agentvm.drivers.bedrock_converse import BedrockConverseDriver
from agentvm.drivers.bedrock_wire import converse_params
from agentvm.errors import UpstreamError
from tests.aws_fixtures import aws_env  # noqa: F401  (a fixture)
from tests.fakes import fake_bedrock as br
from tests.fakes.http_stub import StubServer

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
MSG_ID = f"msg_bdrk_{br.REQUEST_ID}"


@pytest.fixture
def server() -> Iterator[StubServer]:
    with StubServer() as stub:
        yield stub


@pytest.fixture
async def driver(server: StubServer, aws_env: None) -> AsyncIterator[BedrockConverseDriver]:  # noqa: F811
    drv = BedrockConverseDriver(region="us-east-1", endpoint_url=server.base_url, timeout_s=10, max_retries=0,
                                session=botocore.session.Session())
    yield drv
    await drv.aclose()


def _request(**overrides: object) -> LLMRequest:
    fields: dict[str, object] = {"model": MODEL, "max_tokens": 300, "messages": [{"role": "user", "content": "Hi"}]}
    fields.update(overrides)
    return LLMRequest(**fields)  # type: ignore[arg-type]


async def _collect(driver: BedrockConverseDriver, request: LLMRequest | None = None) -> list[DriverEvent]:
    async with asyncio.timeout(10):
        return [event async for event in driver.stream(request or _request())]


async def _until_error(driver: BedrockConverseDriver,
                       request: LLMRequest | None = None) -> tuple[list[DriverEvent], UpstreamError]:
    events: list[DriverEvent] = []
    async with asyncio.timeout(10):
        with pytest.raises(UpstreamError) as info:
            async for event in driver.stream(request or _request()):
                events.append(event)
    return events, info.value


def test_the_fake_speaks_the_wire_format_botocore_parses() -> None:
    buffer = botocore.eventstream.EventStreamBuffer()
    buffer.add_data(br.event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "hé"}}))
    [parsed] = list(buffer)
    assert parsed.headers == {":event-type": "contentBlockDelta", ":content-type": "application/json",
                              ":message-type": "event"}
    assert b'"text": "h\\u00e9"' in parsed.payload


# --- streams ---------------------------------------------------------------------------------

async def test_text_reply_usage_and_the_signed_request(server: StubServer, driver: BedrockConverseDriver) -> None:
    server.enqueue(br.stream([br.message_start(), *br.text(0, ["Hel", "lo"]), br.message_stop("end_turn"),
                              br.metadata(18, 4, cache_read=2048, cache_write=96)]))

    events = await _collect(driver, _request(system="Be brief.", temperature=0.3, stop_sequences=["END"]))

    assert events == [
        MessageStart(MSG_ID, MODEL, Usage()),
        TextDelta("Hel"), TextDelta("lo"),
        UsageUpdate(Usage(18, 4, 2048, 96)),
        MessageStop("end_turn", Usage(18, 4, 2048, 96)),
    ]
    [sent] = server.requests
    assert sent.path == "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse-stream"
    assert sent.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=testing/")
    assert "/us-east-1/bedrock/aws4_request" in sent.headers["authorization"]
    assert sent.json == {"messages": [{"role": "user", "content": [{"text": "Hi"}]}],
                         "system": [{"text": "Be brief."}],
                         "inferenceConfig": {"maxTokens": 300, "temperature": 0.3, "stopSequences": ["END"]}}


async def test_messages_split_across_http_chunks(server: StubServer, driver: BedrockConverseDriver) -> None:
    server.enqueue(br.stream([br.message_start(), *br.text(0, ["a", "b"]), br.message_stop("max_tokens"),
                              br.metadata(3, 2)], split=True))

    events = await _collect(driver)

    assert events[1:] == [TextDelta("a"), TextDelta("b"), UsageUpdate(Usage(3, 2)), MessageStop("max_tokens",
                                                                                                 Usage(3, 2))]


async def test_text_then_tool_use_with_input_fragments(server: StubServer, driver: BedrockConverseDriver) -> None:
    server.enqueue(br.stream([
        br.message_start(), *br.text(0, ["Checking."]),
        *br.tool_use(1, "tooluse_Ab1", "get_weather", ['{"ci', 'ty": "Par', 'is"}']),
        *br.tool_use(2, "tooluse_Cd2", "list_files", []),
        br.message_stop("tool_use"), br.metadata(90, 41)]))

    events = await _collect(driver)

    assert events == [
        MessageStart(MSG_ID, MODEL, Usage()),
        TextDelta("Checking."),
        ToolUseStart("tooluse_Ab1", "get_weather"),
        InputJsonDelta('{"ci'), InputJsonDelta('ty": "Par'), InputJsonDelta('is"}'),
        ToolUseStop("tooluse_Ab1", "get_weather", {"city": "Paris"}),
        ToolUseStart("tooluse_Cd2", "list_files"),
        ToolUseStop("tooluse_Cd2", "list_files", {}),
        UsageUpdate(Usage(90, 41)),
        MessageStop("tool_use", Usage(90, 41)),
    ]


async def test_reasoning_is_counted_and_guardrails_stop_as_refusal(server: StubServer,
                                                                   driver: BedrockConverseDriver) -> None:
    server.enqueue(br.stream([
        br.message_start(),
        br.event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "hmm"}}}),
        br.event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "s"}}}),
        br.event("contentBlockStop", {"contentBlockIndex": 0}),
        br.message_stop("guardrail_intervened"), br.metadata(5, 3)]))

    events = await _collect(driver)

    assert events[1:] == [HiddenOutput(3), UsageUpdate(Usage(5, 3)), MessageStop("refusal", Usage(5, 3))]


async def test_a_stream_without_metadata_leaves_the_usage_unreported(server: StubServer,
                                                                      driver: BedrockConverseDriver) -> None:
    server.enqueue(br.stream([br.message_start(), *br.text(0, ["x"]), br.message_stop("end_turn")]))

    events = await _collect(driver)

    assert events[-1] == MessageStop("end_turn", Usage(), usage_final=False)


# --- failures --------------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "aws_code", "expected", "retryable"), [
    (400, "ValidationException", "invalid_request_error", False),
    (403, "AccessDeniedException", "permission_error", False),
    (403, "UnrecognizedClientException", "authentication_error", False),
    (404, "ResourceNotFoundException", "not_found_error", False),
    (429, "ThrottlingException", "rate_limit_error", True),
    (500, "InternalServerException", "api_error", True),
    (503, "ServiceUnavailableException", "overloaded_error", True),
    (408, "ModelTimeoutException", "timeout_error", True),
])
async def test_http_errors(server: StubServer, driver: BedrockConverseDriver, status: int, aws_code: str,
                           expected: str, retryable: bool) -> None:
    server.enqueue(br.error(status, aws_code, "The upstream says no."))

    events, error = await _until_error(driver)

    assert events == []
    assert (error.code, error.retryable) == (expected, retryable)
    if expected == "permission_error":  # AWS's text names the role and account: not passed on
        assert error.message == (f"Bedrock: {aws_code}: the deployment's AWS role may not call this model, or "
                                 "access to it is not enabled in the Bedrock console")
    elif expected == "authentication_error":
        assert error.message == f"Bedrock: {aws_code}: the deployment's AWS credentials were refused"
    else:
        assert error.message == "Bedrock: The upstream says no."


async def test_an_exception_event_mid_stream(server: StubServer, driver: BedrockConverseDriver) -> None:
    server.enqueue(br.stream([br.message_start(), *br.text(0, ["par"])[:1],
                              br.exception("modelStreamErrorException", "The model stream broke.")]))

    events, error = await _until_error(driver)

    assert events[-1] == TextDelta("par")
    assert (error.code, error.retryable, error.message) == ("api_error", True, "Bedrock: The model stream broke.")


async def test_retryable_failures_before_output_are_retried(server: StubServer, aws_env: None,  # noqa: F811
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    delays: list[float] = []

    async def no_sleep(delay: float) -> None:
        delays.append(delay)

    monkeypatch.setattr(bedrock_converse, "_sleep", no_sleep)
    server.enqueue(br.error(429, "ThrottlingException", "Too many requests"),
                   br.stream([br.exception("throttlingException", "Too many tokens")]),
                   br.text_reply(["fine"]))
    drv = BedrockConverseDriver(region="us-east-1", endpoint_url=server.base_url, max_retries=2,
                                session=botocore.session.Session())
    try:
        events = await _collect(drv)
    finally:
        await drv.aclose()

    assert TextDelta("fine") in events
    assert len(server.requests) == 3 and len(delays) == 2  # botocore's own retries are off


async def test_a_cut_stream_is_a_retryable_connection_error(server: StubServer,
                                                            driver: BedrockConverseDriver) -> None:
    server.enqueue(br.stream([br.message_start(), *br.text(0, ["par"])[:1]], cut=True))

    events, error = await _until_error(driver)

    assert events[-1] == TextDelta("par")
    assert (error.code, error.retryable) == ("connection_error", True)


async def test_a_stream_ending_before_message_stop(server: StubServer, driver: BedrockConverseDriver) -> None:
    server.enqueue(br.stream([br.message_start(), *br.text(0, ["par"])]))

    _, error = await _until_error(driver)

    assert (error.code, error.retryable, error.message) == (
        "connection_error", True, "The Bedrock stream ended before messageStop")


async def test_a_corrupt_message_is_malformed(server: StubServer, driver: BedrockConverseDriver) -> None:
    bad = bytearray(br.message_start())
    bad[-1] ^= 0xFF  # the message CRC no longer matches
    server.enqueue(br.stream([bytes(bad)]))

    _, error = await _until_error(driver)

    assert (error.code, error.retryable) == ("malformed_response", True)


async def test_stubbed_client_error_and_missing_credentials(monkeypatch: pytest.MonkeyPatch,
                                                             aws_env: None) -> None:  # noqa: F811
    client = botocore.session.Session().create_client("bedrock-runtime", region_name="us-east-1")
    with Stubber(client) as stubber:
        stubber.add_client_error("converse_stream", service_error_code="AccessDeniedException",
                                 service_message="You don't have access to the model with the specified model ID.",
                                 http_status_code=403)
        drv = BedrockConverseDriver(client=client, max_retries=2)
        _, error = await _until_error(drv)
        await drv.aclose()
        stubber.assert_no_pending_responses()
    assert (error.code, error.retryable) == ("permission_error", False)
    assert "specified model ID" not in error.message and error.message.startswith("Bedrock: AccessDeniedException: ")

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    drv = BedrockConverseDriver(region="us-east-1", endpoint_url="http://127.0.0.1:9",
                                session=botocore.session.Session())
    _, error = await _until_error(drv)
    await drv.aclose()
    assert (error.code, error.retryable) == ("authentication_error", False)


# --- request translation ---------------------------------------------------------------------

def test_a_tool_round_trip_with_images_and_cache_points() -> None:
    png = base64.b64encode(b"\x89PNG\r\n").decode()
    request = _request(
        system="sys",
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Look", "cache_control": {"type": "ephemeral"}},
                                         {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": png}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                              {"type": "text", "text": "Calling."},
                                              {"type": "tool_use", "id": "tu_1", "name": "look",
                                               "input": {"q": "cat"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "is_error": True,
                                          "content": [{"type": "text", "text": "no cat"}]},
                                         {"type": "tool_result", "tool_use_id": "tu_2", "content": "ok"}]},
        ],
        tools=[{"name": "look", "description": "Look", "input_schema": {"type": "object"},
                "cache_control": {"type": "ephemeral"}}],
        tool_choice={"type": "tool", "name": "look"})

    params = converse_params(request)

    assert params["messages"] == [
        {"role": "user", "content": [{"text": "Look"}, {"cachePoint": {"type": "default"}},
                                     {"image": {"format": "png", "source": {"bytes": b"\x89PNG\r\n"}}}]},
        {"role": "assistant", "content": [{"text": "Calling."},
                                          {"toolUse": {"toolUseId": "tu_1", "name": "look", "input": {"q": "cat"}}}]},
        {"role": "user", "content": [
            {"toolResult": {"toolUseId": "tu_1", "content": [{"text": "no cat"}], "status": "error"}},
            {"toolResult": {"toolUseId": "tu_2", "content": [{"text": "ok"}], "status": "success"}}]},
    ]
    assert params["toolConfig"] == {
        "tools": [{"toolSpec": {"name": "look", "description": "Look", "inputSchema": {"json": {"type": "object"}}}},
                  {"cachePoint": {"type": "default"}}],
        "toolChoice": {"tool": {"name": "look"}}}
    assert params["system"] == [{"text": "sys"}]


def test_tool_choice_none_leaves_the_tools_out_of_a_conversation_without_tool_blocks() -> None:
    tools = [{"name": "look", "input_schema": {"type": "object"}}]
    assert "toolConfig" not in converse_params(_request(tools=tools, tool_choice={"type": "none"}))
    assert converse_params(_request(tools=tools, tool_choice={"type": "any"}))["toolConfig"]["toolChoice"] == {
        "any": {}}


@pytest.mark.parametrize(("overrides", "field", "text"), [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x"}}]}]},
     "messages[0].content[0].source", "base64 data, not 'url'"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/bmp", "data": "AA=="}}]}]},
     "messages[0].content[0].source.media_type", "must be one of"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "not base64!"}}]}]},
     "messages[0].content[0].source.data", "not valid base64"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "messages[0].content[0].type", "'document'"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0]", "'bash_20250124'"),
    ({"tools": [{"name": "t"}], "tool_choice": {"type": "none"},
      "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "t", "input": {}}]}]},
     "tool_choice.type", "no 'none'"),
])
async def test_what_cannot_be_translated_is_refused_before_any_call(server: StubServer,
                                                                    driver: BedrockConverseDriver,
                                                                    overrides: dict[str, object], field: str,
                                                                    text: str) -> None:
    _, error = await _until_error(driver, _request(**overrides))

    assert (error.code, error.retryable, error.field) == ("invalid_request_error", False, field)
    assert text in error.message
    assert server.requests == []


async def test_streams_wait_on_the_drivers_own_threads(server: StubServer, driver: BedrockConverseDriver) -> None:
    """A stream waiting for the model holds a thread of the driver's own pool, not one of the loop's
    default executor, which `asyncio.to_thread` users and DNS lookups need: with the default executor's
    only thread held for the whole stream, the stream still completes."""
    import concurrent.futures
    import threading

    server.enqueue(br.text_reply(["slow"]))
    loop = asyncio.get_running_loop()
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
    release = threading.Event()
    held = loop.run_in_executor(None, release.wait)  # the default executor's one thread, busy until the end
    try:
        events = await _collect(driver)
    finally:
        release.set()
        await held
    assert TextDelta("slow") in events


async def test_a_consumer_that_stops_early_releases_the_stream(server: StubServer,
                                                               driver: BedrockConverseDriver) -> None:
    server.enqueue(br.text_reply(["one", "two", "three"]), br.text_reply(["again"]))

    async with asyncio.timeout(10):
        stream = driver.stream(_request())
        async for event in stream:
            if isinstance(event, TextDelta):
                break
        await stream.aclose()
        events = await _collect(driver)

    assert TextDelta("again") in events and len(server.requests) == 2


def test_the_token_apis_system_blocks_keep_their_cache_marks_and_top_p() -> None:
    blocks = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Answer in French."}]
    params = converse_params(_request(system="ignored", system_blocks=blocks, top_p=0.25))
    assert params["system"] == [{"text": "Be brief."}, {"cachePoint": {"type": "default"}},
                                {"text": "Answer in French."}]
    assert params["inferenceConfig"]["topP"] == 0.25
