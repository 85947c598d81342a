"""A lightweight Anthropic driver: the Messages API over plain HTTP (httpx or aiohttp), without the SDK.

Importing the `anthropic` SDK costs around a second of cold start, which AWS Lambda bills. This
driver speaks the wire protocol itself (a JSON POST, a Server-Sent Events response parsed by
`agentvm.drivers.sse`) and never imports `anthropic`, directly or transitively. It honours the
same contract as the SDK driver (`agentvm.drivers.anthropic_sdk`): the same event mapping, the
same `UpstreamError` codes and `retryable` flags, and the API key never in an error message.

A request that does not need a stream (`LLMRequest.stream` False: the token API's non-streamed calls)
is sent with `stream: false` and its one JSON message mapped onto the same events as its stream
would give; a 200 whose body is then cut or malformed is billed as a stream broken after its start
(`message_events`). The HTTP client is httpx unless the composition root picks aiohttp
(`agentvm.drivers.upstream_http`).

Retries happen only before the first event was yielded, only for retryable failures (408, 429,
5xx and 529 responses, an error event of a retryable type, a malformed event, connection errors
and timeouts), at most `max_retries` times, after a jittered exponential backoff or the server's
`retry-after`, capped at 8 s. An `x-should-retry: false` response header vetoes the retry, as it
does for the SDK. Once an event was yielded a failure is raised as is: the caller has seen partial
output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from agentvm.domain.models import Usage
from agentvm.drivers.anthropic_common import (
    ToolBlock,
    connection_error,
    hidden_output_bytes,
    malformed_response,
    reported_usage,
    status_error,
    timeout_error,
    unexpected_error,
)
from agentvm.drivers.base import (
    JSON,
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
from agentvm.drivers.sse import SSEParser
from agentvm.drivers.upstream_http import UpstreamHttp, UpstreamResponse, upstream_http
from agentvm.errors import UpstreamError

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_ANTHROPIC_VERSION = "2023-06-01"

# Backoff between attempts: 0.5 s, 1 s, 2 s, ... minus up to 25 % jitter; never above the cap,
# which also bounds a server's `retry-after`.
INITIAL_RETRY_DELAY_S = 0.5
MAX_RETRY_DELAY_S = 8.0

# Sleeps between attempts go through here (tests replace it to observe the delays).
_sleep = asyncio.sleep


class StatusFailure(Exception):
    """An HTTP error response, with what the retry decision needs from its headers (also the
    OpenAI-compatible driver's)."""

    def __init__(self, error: UpstreamError, retry_after_s: float | None, should_retry: str | None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after_s = retry_after_s
        self.should_retry = should_retry


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _str(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The server's requested delay: `retry-after-ms`, else `retry-after` in (possibly fractional)
    seconds; None when absent, unparseable or negative (HTTP dates are not supported)."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) * scale
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            return value
    return None


def retry_delay_s(retries_done: int, retry_after: float | None) -> float:
    """How long to wait before retry number `retries_done + 1`."""
    if retry_after is not None:
        return min(retry_after, MAX_RETRY_DELAY_S)
    delay = min(INITIAL_RETRY_DELAY_S * 2.0 ** retries_done, MAX_RETRY_DELAY_S)
    return delay * (1.0 - 0.25 * random.random())


def request_body(request: LLMRequest) -> JSON:
    """The Messages API body (streamed unless `request.stream` is False); unset optional fields are left out."""
    body: JSON = {"model": request.model, "max_tokens": request.max_tokens, "messages": request.messages}
    if request.system_blocks is not None:
        body["system"] = request.system_blocks
    elif request.system is not None:
        body["system"] = request.system
    if request.tools:
        body["tools"] = request.tools
    if request.tool_choice is not None:
        body["tool_choice"] = request.tool_choice
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.stop_sequences:
        body["stop_sequences"] = request.stop_sequences
    body["stream"] = request.stream
    return body


class MalformedMessage(ValueError):
    """A 200 answer to a non-streamed call that is not a message."""


def message_events(message: Any) -> list[DriverEvent]:
    """A whole (non-streamed) message as the events its stream would have given: its content blocks
    in order, then the stop with the message's usage, final when it carries the output count. Blocks
    no event shows (thinking, a server tool's) need no `HiddenOutput`: the usage is the final one."""
    if not isinstance(message, dict) or message.get("type") != "message":
        raise MalformedMessage("not a message")
    usage, final = reported_usage(message.get("usage"), Usage())
    events: list[DriverEvent] = [MessageStart(message_id=_str(message.get("id")), model=_str(message.get("model")),
                                              usage=usage)]
    content = message.get("content")
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            text = _str(block.get("text"))
            if text:
                events.append(TextDelta(text=text))
        elif block.get("type") == "tool_use":
            tool_id, name, tool_input = _str(block.get("id")), _str(block.get("name")), _dict(block.get("input"))
            events.append(ToolUseStart(tool_call_id=tool_id, name=name))
            if tool_input:
                events.append(InputJsonDelta(partial_json=json.dumps(tool_input)))
            events.append(ToolUseStop(tool_call_id=tool_id, name=name, input=dict(tool_input)))
    stop_reason = message.get("stop_reason")
    events.append(MessageStop(stop_reason=stop_reason if isinstance(stop_reason, str) else "end_turn", usage=usage,
                              usage_final=final))
    return events


class _EventMapper:
    """Maps the API's stream events (parsed JSON) one to one onto driver events."""

    def __init__(self) -> None:
        self.usage = Usage()
        self.output_reported = False  # a message_delta reported output_tokens
        self.stop_reason: str | None = None
        self.tools: dict[int, ToolBlock] = {}
        self.stopped = False

    def map(self, payload: JSON) -> DriverEvent | None:
        kind = payload.get("type")
        if kind == "message_start":
            message = _dict(payload.get("message"))
            self.usage, _ = reported_usage(message.get("usage"), Usage())
            return MessageStart(message_id=_str(message.get("id")), model=_str(message.get("model")),
                                usage=self.usage)
        if kind == "content_block_start":
            block = _dict(payload.get("content_block"))
            if block.get("type") == "tool_use":
                tool = ToolBlock(_str(block.get("id")), _str(block.get("name")), dict(_dict(block.get("input"))))
                self.tools[_int(payload.get("index"))] = tool
                return ToolUseStart(tool_call_id=tool.tool_call_id, name=tool.name)
            return None
        if kind == "content_block_delta":
            delta = _dict(payload.get("delta"))
            delta_type = delta.get("type")
            tool_block = self.tools.get(_int(payload.get("index")))
            if delta_type == "text_delta":
                text = _str(delta.get("text"))
                return TextDelta(text=text) if text else None
            if delta_type == "input_json_delta" and tool_block is not None:
                partial = _str(delta.get("partial_json"))
                if partial:
                    tool_block.parts.append(partial)
                    return InputJsonDelta(partial_json=partial)
                return None
            hidden = hidden_output_bytes(delta_type, delta, tool_block=tool_block is not None)
            return HiddenOutput(hidden) if hidden else None
        if kind == "content_block_stop":
            done = self.tools.pop(_int(payload.get("index")), None)
            if done is None:
                return None
            return ToolUseStop(tool_call_id=done.tool_call_id, name=done.name, input=done.parsed_input())
        if kind == "message_delta":
            stop_reason = _dict(payload.get("delta")).get("stop_reason")
            if isinstance(stop_reason, str):
                self.stop_reason = stop_reason
            raw = payload.get("usage")
            self.usage, has_output = reported_usage(raw, self.usage)
            self.output_reported = self.output_reported or has_output
            return UsageUpdate(self.usage, has_output) if isinstance(raw, dict) else None
        if kind == "message_stop":
            self.stopped = True
            return MessageStop(stop_reason=self.stop_reason or "end_turn", usage=self.usage,
                               usage_final=self.output_reported)
        return None  # ping, signature / citation deltas, future event types


class AnthropicLiteDriver:
    """`Driver` for the Anthropic Messages API without the SDK. `http_client`: "httpx" (the default,
    every runtime has it) or "aiohttp" (faster; `avm serve`), see `agentvm.drivers.upstream_http`."""

    name = "anthropic"

    def __init__(self, api_key: str, *, base_url: str | None = None, timeout_s: float = 600.0,
                 max_retries: int = 2, anthropic_version: str = DEFAULT_ANTHROPIC_VERSION,
                 http_client: str = "httpx") -> None:
        self._api_key = api_key
        self._base_url = base_url
        self._url = (base_url or DEFAULT_BASE_URL).rstrip("/") + "/v1/messages"
        self._max_retries = max(0, max_retries)
        self._http: UpstreamHttp = upstream_http(http_client, {
            "x-api-key": api_key, "anthropic-version": anthropic_version, "content-type": "application/json"},
            timeout_s)

    def __repr__(self) -> str:
        return f"AnthropicLiteDriver(base_url={self._base_url!r})"

    async def aclose(self) -> None:
        """Close the HTTP client and its connection pool (a later call makes a new one). A client of
        another event loop cannot be closed from this one: it is dropped."""
        await self._http.aclose()

    async def stream(self, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
        try:
            content = json.dumps(request_body(request)).encode()
        except Exception as exc:
            raise self._upstream_error(exc) from None
        retries = 0
        while True:
            yielded = False
            retry_after: float | None = None
            veto = False
            try:
                # aclosing: a consumer that stops early releases the HTTP response right away.
                async with contextlib.aclosing(self._attempt(content, request)) as events:
                    async for event in events:
                        yielded = True
                        yield event
                return
            except StatusFailure as failure:
                error = failure.error
                retry_after = failure.retry_after_s
                veto = failure.should_retry == "false"
            except UpstreamError as exc:
                error = exc
            except Exception as exc:
                error = self._upstream_error(exc)
            if yielded or veto or not error.retryable or retries >= self._max_retries:
                raise error from None
            await _sleep(retry_delay_s(retries, retry_after))
            retries += 1

    async def _attempt(self, content: bytes, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
        async with self._http.post(self._url, content) as response:
            if not 200 <= response.status < 300:
                body = _json_or_text((await response.read()).decode(errors="replace"))
                raise StatusFailure(self._status_error(response.status, body),
                                    retry_after_s(response.headers), response.headers.get("x-should-retry"))
            if not request.stream:
                async for whole in self._message(response, request):
                    yield whole
                return
            parser = SSEParser()
            mapper = _EventMapper()
            async for chunk in response.chunks():
                for sse in parser.events(chunk):
                    if mapper.stopped:
                        continue  # nothing follows message_stop; drain to release the connection
                    if sse.event is None or sse.event == "ping":
                        continue
                    if sse.event == "error":
                        raise self._status_error(response.status, _json_or_text(sse.data))
                    if not sse.data:
                        continue
                    payload = json.loads(sse.data)
                    if not isinstance(payload, dict):
                        continue
                    event = mapper.map(payload)
                    if event is not None:
                        yield event
        if not mapper.stopped:
            raise UpstreamError("The Anthropic stream ended before message_stop",
                                code="connection_error", retryable=True)

    async def _message(self, response: UpstreamResponse, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
        try:
            events = message_events(json.loads(await response.read()))
        except Exception as exc:
            # The provider took the call (200) and made the whole message before answering, so it billed
            # it: as a stream broken after its start, the request's input bound and, its output count
            # lost, up to max_tokens of output (drivers/token_bounds.billed_usage); never retried.
            yield MessageStart(message_id="", model="")
            yield HiddenOutput(request.max_tokens)
            raise self._upstream_error(exc) from None
        for event in events:
            yield event

    def _status_error(self, status: int, body: Any) -> UpstreamError:
        return status_error(status, body, self._api_key)

    def _upstream_error(self, exc: Exception) -> UpstreamError:
        failure = self._http.failure(exc)
        if failure == "timeout":
            return timeout_error()
        if failure == "connection":
            return connection_error()
        if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError | MalformedMessage):
            return malformed_response()
        return unexpected_error(exc, self._api_key)
