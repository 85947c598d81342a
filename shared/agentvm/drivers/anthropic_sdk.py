"""The Anthropic driver, on the official `anthropic` SDK (streamed Messages API).

Raw stream events are mapped one to one onto the neutral driver events; thinking and server-side
blocks are not shown, only counted (`HiddenOutput`) for the bill of a stream that breaks. Events
without `usage` are tolerated. Every failure surfaces as `UpstreamError` carrying Anthropic's error type as
its code. The API key is never part of an error message: messages that come from upstream are
scrubbed of it, and SDK exceptions (whose request objects carry the key header) are not chained.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from typing import cast

import anthropic
import httpx2
from anthropic.types import MessageParam, ToolUnionParam

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
from agentvm.errors import UpstreamError


class AnthropicDriver:
    """`Driver` for the Anthropic Messages API. The SDK client is made on first use and reused."""

    name = "anthropic"

    def __init__(self, api_key: str, *, base_url: str | None = None, timeout_s: float = 600.0,
                 max_retries: int = 2) -> None:
        self._api_key = api_key
        self._base_url = base_url
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._client: anthropic.AsyncAnthropic | None = None

    def __repr__(self) -> str:
        return f"AnthropicDriver(base_url={self._base_url!r})"

    def _get_client(self) -> anthropic.AsyncAnthropic:
        if self._client is None:
            self._client = anthropic.AsyncAnthropic(
                api_key=self._api_key,
                base_url=self._base_url,
                timeout=self._timeout_s,
                max_retries=self._max_retries,
            )
        return self._client

    async def aclose(self) -> None:
        """Close the SDK client and its connection pool (a later call makes a new one)."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def stream(self, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
        try:
            # aclosing: a consumer that stops early releases the HTTP response right away.
            async with contextlib.aclosing(self._stream(request)) as events:
                async for event in events:
                    yield event
        except UpstreamError:
            raise
        except Exception as exc:
            raise self._upstream_error(exc) from None

    async def _stream(self, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
        omit = anthropic.omit
        sdk_stream = await self._get_client().messages.create(
            model=request.model,
            max_tokens=request.max_tokens,
            messages=cast("list[MessageParam]", request.messages),
            system=request.system if request.system is not None else omit,
            tools=cast("list[ToolUnionParam]", request.tools) if request.tools else omit,
            # This SDK's signature has no `temperature`; the API still takes it in the body, as it
            # takes the token API's fields (a list `system` replaces the text one).
            extra_body=_extra_body(request) or None,
            stream=True,
        )
        usage = Usage()
        output_reported = False  # a message_delta reported output_tokens
        stop_reason: str | None = None
        tools: dict[int, ToolBlock] = {}
        stopped = False
        async with sdk_stream:
            async for event in sdk_stream:
                if stopped:
                    continue  # nothing follows message_stop; drain to release the connection
                if event.type == "message_start":
                    message = event.message
                    usage, _ = reported_usage(_plain(getattr(message, "usage", None)), Usage())
                    yield MessageStart(message_id=message.id, model=message.model, usage=usage)
                elif event.type == "content_block_start":
                    block = event.content_block
                    if block.type == "tool_use":
                        start_input = block.input if isinstance(block.input, dict) else {}
                        tools[event.index] = ToolBlock(block.id, block.name, dict(start_input))
                        yield ToolUseStart(tool_call_id=block.id, name=block.name)
                elif event.type == "content_block_delta":
                    delta = event.delta
                    tool = tools.get(event.index)
                    if delta.type == "text_delta":
                        if delta.text:
                            yield TextDelta(text=delta.text)
                    elif delta.type == "input_json_delta" and tool is not None:
                        if delta.partial_json:
                            tool.parts.append(delta.partial_json)
                            yield InputJsonDelta(partial_json=delta.partial_json)
                    else:
                        hidden = hidden_output_bytes(delta.type, _plain(delta), tool_block=tool is not None)
                        if hidden:
                            yield HiddenOutput(hidden)
                elif event.type == "content_block_stop":
                    tool = tools.pop(event.index, None)
                    if tool is not None:
                        yield ToolUseStop(tool_call_id=tool.tool_call_id, name=tool.name,
                                          input=tool.parsed_input())
                elif event.type == "message_delta":
                    stop = getattr(event.delta, "stop_reason", None)
                    if stop is not None:
                        stop_reason = stop
                    raw = _plain(getattr(event, "usage", None))
                    usage, has_output = reported_usage(raw, usage)
                    output_reported = output_reported or has_output
                    if raw:
                        yield UsageUpdate(usage, has_output)
                elif event.type == "message_stop":
                    stopped = True
                    yield MessageStop(stop_reason=stop_reason or "end_turn", usage=usage,
                                      usage_final=output_reported)
        if not stopped:
            raise UpstreamError("The Anthropic stream ended before message_stop",
                                code="connection_error", retryable=True)

    def _upstream_error(self, exc: Exception) -> UpstreamError:
        if isinstance(exc, anthropic.APIStatusError):
            return status_error(exc.status_code, exc.body, self._api_key)
        # APITimeoutError subclasses APIConnectionError; mid-stream transport failures are raised
        # by the HTTP library unwrapped.
        if isinstance(exc, anthropic.APITimeoutError | httpx2.TimeoutException):
            return timeout_error()
        if isinstance(exc, anthropic.APIConnectionError | httpx2.TransportError):
            return connection_error()
        if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
            return malformed_response()
        return unexpected_error(exc, self._api_key)


def _extra_body(request: LLMRequest) -> dict[str, object]:
    extra: dict[str, object] = {}
    if request.temperature is not None:
        extra["temperature"] = request.temperature
    if request.top_p is not None:
        extra["top_p"] = request.top_p
    if request.system_blocks is not None:
        extra["system"] = request.system_blocks
    if request.tool_choice is not None:
        extra["tool_choice"] = request.tool_choice
    if request.stop_sequences:
        extra["stop_sequences"] = request.stop_sequences
    return extra


def _plain(value: object) -> dict[str, object]:
    """An SDK object's fields that the stream carried, as a dict ({} for None: a `usage` the event
    left out)."""
    if value is None:
        return {}
    dump = getattr(value, "model_dump", None)
    return dict(dump(exclude_none=True)) if callable(dump) else {}
