"""A driver for any OpenAI-compatible Chat Completions upstream (OpenAI, DeepSeek, vLLM, Ollama, …):
a base URL and a key.

Transport: plain HTTP, as `anthropic_lite` uses (httpx, or aiohttp when the composition root picks it:
`agentvm.drivers.upstream_http`), not the `openai` SDK: httpx is already in the Lambda layer and cheap
to import, the SDK is not in the layer and costs cold start; the stream is parsed by
`agentvm.drivers.sse` and mapped by `agentvm.drivers.openai_wire`.

Failures are `UpstreamError`s with the same codes and `retryable` flags as the Anthropic drivers
(by HTTP status: 401 authentication_error, 403 permission_error, 404 not_found_error, 429
rate_limit_error, 5xx api_error, …; a 429 whose code is `insufficient_quota` is a billing_error and
not retried), a connection lost or a stream that ends before its finish is a retryable
connection_error, an unparseable chunk a malformed_response. Retries follow `anthropic_lite`: only
before the first event was yielded, only retryable failures, at most `max_retries`, jittered
exponential backoff or the server's `retry-after` (capped at 8 s), vetoed by
`x-should-retry: false`. The key is sent only as the `Authorization` header and is scrubbed from
any message an upstream sends back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from agentvm.drivers.anthropic_common import CODE_BY_STATUS, redact
from agentvm.drivers.anthropic_lite import StatusFailure, retry_after_s, retry_delay_s
from agentvm.drivers.base import DriverEvent, LLMRequest
from agentvm.drivers.openai_wire import ChunkMapper, chat_body
from agentvm.drivers.sse import SSEParser
from agentvm.drivers.upstream_http import UpstreamHttp, upstream_http
from agentvm.errors import UpstreamError

DEFAULT_BASE_URL = "https://api.openai.com/v1"

# Error codes an error object may carry inside a 200 stream (no status to go by).
_RETRYABLE_IN_STREAM = frozenset({"server_error", "api_error", "rate_limit_exceeded", "rate_limit_error",
                                  "overloaded_error", "timeout", "internal_error", "service_unavailable"})

# What differs between the well-known OpenAI-compatible upstreams (docs/providers.md); a catalog entry
# for one of them is its name, a key and, for a self-hosted server, its base URL.
PRESETS: dict[str, dict[str, Any]] = {
    "openai": {"base_url": DEFAULT_BASE_URL, "label": "OpenAI", "max_tokens_field": "max_completion_tokens"},
    "deepseek": {"base_url": "https://api.deepseek.com/v1", "label": "DeepSeek"},
    "vllm": {"base_url": "http://127.0.0.1:8000/v1", "label": "vLLM"},
    "ollama": {"base_url": "http://127.0.0.1:11434/v1", "label": "Ollama"},
}

# Sleeps between attempts go through here (tests replace it to observe the delays).
_sleep = asyncio.sleep


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


class OpenAICompatDriver:
    """`Driver` for an OpenAI-compatible `POST {base_url}/chat/completions` with `stream: true`.

    `name` is the provider's name in the ledger ("openai", "deepseek", "ollama", …) and `label` how
    errors call it. `max_tokens_field`: "max_completion_tokens" for OpenAI's own API (its reasoning
    models refuse `max_tokens`), "max_tokens" for most others. `include_usage: False` for a server
    that refuses `stream_options` (its calls are then billed the request's input bound and the streamed
    bytes, marked estimated).
    The HTTP client ("httpx" or "aiohttp", `http_client`) is made on first use per event loop and
    reused, as in `AnthropicLiteDriver`.
    """

    def __init__(self, api_key: str | None, *, base_url: str | None = None, name: str = "openai",
                 label: str = "The OpenAI-compatible upstream", timeout_s: float = 600.0, max_retries: int = 2,
                 max_tokens_field: str = "max_tokens", include_usage: bool = True,
                 http_client: str = "httpx") -> None:
        if max_tokens_field not in ("max_tokens", "max_completion_tokens"):
            raise ValueError("max_tokens_field: must be 'max_tokens' or 'max_completion_tokens'")
        self.name = name
        self._label = label
        self._api_key = api_key or ""
        self._base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self._url = self._base_url + "/chat/completions"
        self._max_retries = max(0, max_retries)
        self._max_tokens_field = max_tokens_field
        self._include_usage = include_usage
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        self._http: UpstreamHttp = upstream_http(http_client, headers, timeout_s)

    @classmethod
    def for_provider(cls, name: str, api_key: str | None, *, base_url: str | None = None,
                     **options: Any) -> OpenAICompatDriver:
        """A driver for a known upstream (`PRESETS`), or any other `name` with its `base_url`."""
        preset = dict(PRESETS.get(name, {}))
        if base_url is None and "base_url" not in preset:
            raise ValueError(f"base_url: required for the OpenAI-compatible provider {name!r} "
                             f"(known without one: {', '.join(sorted(PRESETS))})")
        if base_url is not None:
            preset["base_url"] = base_url
        preset.setdefault("label", name)
        return cls(api_key, name=name, **{**preset, **options})

    def __repr__(self) -> str:
        return f"OpenAICompatDriver(name={self.name!r}, base_url={self._base_url!r})"

    async def aclose(self) -> None:
        await self._http.aclose()

    async def stream(self, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
        body = chat_body(request, max_tokens_field=self._max_tokens_field, include_usage=self._include_usage)
        try:
            content = json.dumps(body).encode()
        except Exception as exc:
            raise self._unexpected(exc) from None
        retries = 0
        while True:
            yielded = False
            retry_after: float | None = None
            veto = False
            try:
                async with contextlib.aclosing(self._attempt(content, request.model)) as events:
                    async for event in events:
                        yielded = True
                        yield event
                return
            except StatusFailure as failure:
                error, retry_after, veto = failure.error, failure.retry_after_s, failure.should_retry == "false"
            except UpstreamError as exc:
                error = exc
            except Exception as exc:
                error = self._transport_error(exc)
            if yielded or veto or not error.retryable or retries >= self._max_retries:
                raise error from None
            await _sleep(retry_delay_s(retries, retry_after))
            retries += 1

    async def _attempt(self, content: bytes, model: str) -> AsyncGenerator[DriverEvent, None]:
        mapper = ChunkMapper(model)
        done = False
        async with self._http.post(self._url, content) as response:
            if not 200 <= response.status < 300:
                body = _json_or_text((await response.read()).decode(errors="replace"))
                raise StatusFailure(self.status_error(response.status, body),
                                    retry_after_s(response.headers), response.headers.get("x-should-retry"))
            parser = SSEParser()
            async for chunk in response.chunks():
                for sse in parser.events(chunk):
                    if done:
                        continue  # nothing follows [DONE]; drain to release the connection
                    data = sse.data.strip()
                    if data == "[DONE]":
                        done = True
                        for event in mapper.finish():
                            yield event
                        continue
                    if not data:
                        continue
                    payload = json.loads(data)
                    if not isinstance(payload, dict):
                        continue
                    if sse.event == "error" or "error" in payload:
                        raise self.stream_error(payload)
                    for event in mapper.map(payload):
                        yield event
        if done:
            return
        if mapper.finish_reason is not None:
            # A server that ends the stream after the finish (and usage) without `[DONE]`.
            for event in mapper.finish():
                yield event
            return
        raise UpstreamError(f"{self._label} stream ended before the reply finished", code="connection_error",
                            retryable=True)

    def status_error(self, status: int, body: Any) -> UpstreamError:
        """An HTTP error response as an UpstreamError: the code by status (as the Anthropic drivers
        name them), the upstream's message with the key scrubbed."""
        error = body.get("error") if isinstance(body, Mapping) else None
        error = error if isinstance(error, Mapping) else {}
        upstream_code = error.get("code") if isinstance(error.get("code"), str) else error.get("type")
        if status == 429 and upstream_code == "insufficient_quota":
            code, retryable = "billing_error", False
        else:
            code = CODE_BY_STATUS.get(status, "api_error" if status >= 500 else "upstream_error")
            retryable = status in (408, 409, 429) or status >= 500
        message = error.get("message")
        if status in (401, 403):
            # The upstream's text names the operator's key (masked) or account: not for the caller.
            detail = f": {upstream_code}" if isinstance(upstream_code, str) and upstream_code else ""
            message = f"{self._label} refused the configured credentials (HTTP {status}{detail})"
        elif not isinstance(message, str) or not message:
            message = f"{self._label} answered HTTP {status}"
        return UpstreamError(redact(message, self._api_key), code=code, retryable=retryable)

    def stream_error(self, payload: Mapping[str, Any]) -> UpstreamError:
        """An error object sent inside the 200 stream (`data: {"error": {...}}`)."""
        error = payload.get("error")
        error = error if isinstance(error, Mapping) else payload
        kind = error.get("code") if isinstance(error.get("code"), str) else error.get("type")
        kind = kind if isinstance(kind, str) else ""
        message = error.get("message")
        if not isinstance(message, str) or not message:
            message = f"{self._label} reported an error in the stream"
        retryable = kind in _RETRYABLE_IN_STREAM or not kind
        code = "rate_limit_error" if "rate_limit" in kind else "api_error" if retryable else kind
        return UpstreamError(redact(message, self._api_key), code=code, retryable=retryable)

    def _transport_error(self, exc: Exception) -> UpstreamError:
        failure = self._http.failure(exc)
        if failure == "timeout":
            return UpstreamError(f"The request to {self._label_lower} timed out", code="timeout", retryable=True)
        if failure == "connection":
            return UpstreamError(f"Could not reach {self._label_lower} or the connection was lost",
                                 code="connection_error", retryable=True)
        if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
            return UpstreamError(f"{self._label} sent a malformed stream chunk", code="malformed_response",
                                 retryable=True)
        return self._unexpected(exc)

    def _unexpected(self, exc: Exception) -> UpstreamError:
        return UpstreamError(redact(f"{self._label} request failed: {type(exc).__name__}: {exc}", self._api_key),
                             code="upstream_error")

    @property
    def _label_lower(self) -> str:
        return self._label[:1].lower() + self._label[1:] if self._label.startswith("The ") else self._label
