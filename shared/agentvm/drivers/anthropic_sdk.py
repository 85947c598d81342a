"""The Anthropic driver, on the official `anthropic` SDK (streamed Messages API).

Raw stream events are mapped one to one onto the neutral driver events; thinking and server-side
blocks are dropped. Every failure surfaces as `UpstreamError` carrying Anthropic's error type as
its code. The API key is never part of an error message: messages that come from upstream are
scrubbed of it, and SDK exceptions (whose request objects carry the key header) are not chained.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import cast

import anthropic
import httpx2
from anthropic.types import MessageParam, ToolUnionParam

from agentvm.domain.models import Usage
from agentvm.drivers.base import (
    JSON,
    DriverEvent,
    InputJsonDelta,
    LLMRequest,
    MessageStart,
    MessageStop,
    TextDelta,
    ToolUseStart,
    ToolUseStop,
)
from agentvm.errors import UpstreamError

# Anthropic error types worth retrying even when they arrive inside a 200 stream.
_RETRYABLE_TYPES = frozenset({"rate_limit_error", "overloaded_error", "api_error", "timeout_error"})

# Error code by HTTP status, for error bodies that carry no `error.type` (e.g. a proxy's page).
_CODE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


@dataclass(slots=True)
class _ToolBlock:
    tool_call_id: str
    name: str
    start_input: JSON
    parts: list[str] = field(default_factory=list)

    def parsed_input(self) -> JSON:
        if not self.parts:
            return self.start_input
        try:
            value = json.loads("".join(self.parts))
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


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
            # This SDK's signature has no `temperature`; the API still takes it in the body.
            extra_body={"temperature": request.temperature} if request.temperature is not None else None,
            stream=True,
        )
        start_usage = Usage()
        final_usage: Usage | None = None
        stop_reason: str | None = None
        tools: dict[int, _ToolBlock] = {}
        stopped = False
        async with sdk_stream:
            async for event in sdk_stream:
                if stopped:
                    continue  # nothing follows message_stop; drain to release the connection
                if event.type == "message_start":
                    message = event.message
                    u = message.usage
                    start_usage = Usage(
                        input_tokens=u.input_tokens,
                        output_tokens=u.output_tokens,
                        cache_read_tokens=u.cache_read_input_tokens or 0,
                        cache_write_tokens=u.cache_creation_input_tokens or 0,
                    )
                    yield MessageStart(message_id=message.id, model=message.model, usage=start_usage)
                elif event.type == "content_block_start":
                    block = event.content_block
                    if block.type == "tool_use":
                        start_input = block.input if isinstance(block.input, dict) else {}
                        tools[event.index] = _ToolBlock(block.id, block.name, dict(start_input))
                        yield ToolUseStart(tool_call_id=block.id, name=block.name)
                elif event.type == "content_block_delta":
                    delta = event.delta
                    if delta.type == "text_delta":
                        if delta.text:
                            yield TextDelta(text=delta.text)
                    elif delta.type == "input_json_delta":
                        tool = tools.get(event.index)
                        if tool is not None and delta.partial_json:
                            tool.parts.append(delta.partial_json)
                            yield InputJsonDelta(partial_json=delta.partial_json)
                elif event.type == "content_block_stop":
                    tool = tools.pop(event.index, None)
                    if tool is not None:
                        yield ToolUseStop(tool_call_id=tool.tool_call_id, name=tool.name,
                                          input=tool.parsed_input())
                elif event.type == "message_delta":
                    if event.delta.stop_reason is not None:
                        stop_reason = event.delta.stop_reason
                    du = event.usage
                    base = final_usage or start_usage
                    final_usage = Usage(
                        input_tokens=du.input_tokens if du.input_tokens is not None else base.input_tokens,
                        output_tokens=du.output_tokens,
                        cache_read_tokens=(du.cache_read_input_tokens
                                           if du.cache_read_input_tokens is not None
                                           else base.cache_read_tokens),
                        cache_write_tokens=(du.cache_creation_input_tokens
                                            if du.cache_creation_input_tokens is not None
                                            else base.cache_write_tokens),
                    )
                elif event.type == "message_stop":
                    stopped = True
                    yield MessageStop(stop_reason=stop_reason or "end_turn",
                                      usage=final_usage or start_usage)
        if not stopped:
            raise UpstreamError("The Anthropic stream ended before message_stop",
                                code="connection_error", retryable=True)

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "[redacted]") if self._api_key else text

    def _upstream_error(self, exc: Exception) -> UpstreamError:
        if isinstance(exc, anthropic.APIStatusError):
            status = exc.status_code
            error = exc.body.get("error") if isinstance(exc.body, dict) else None
            error_type = error.get("type") if isinstance(error, dict) else None
            error_message = error.get("message") if isinstance(error, dict) else None
            code = error_type if isinstance(error_type, str) and error_type else _CODE_BY_STATUS.get(
                status, "api_error" if status >= 500 else "upstream_error")
            message = (error_message if isinstance(error_message, str) and error_message
                       else f"Anthropic API error (HTTP {status})")
            retryable = status in (408, 429) or status >= 500 or code in _RETRYABLE_TYPES
            return UpstreamError(self._redact(message), code=code, retryable=retryable)
        # APITimeoutError subclasses APIConnectionError; mid-stream transport failures are raised
        # by the HTTP library unwrapped.
        if isinstance(exc, anthropic.APITimeoutError | httpx2.TimeoutException):
            return UpstreamError("The request to Anthropic timed out", code="timeout", retryable=True)
        if isinstance(exc, anthropic.APIConnectionError | httpx2.TransportError):
            return UpstreamError("Could not reach Anthropic or the connection was lost",
                                 code="connection_error", retryable=True)
        return UpstreamError(self._redact(f"Anthropic request failed: {type(exc).__name__}: {exc}"),
                             code="upstream_error")
