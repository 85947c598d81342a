"""What the two Anthropic drivers share: tool-input assembly and the mapping of failures to
`UpstreamError`. No SDK import: the SDK-free driver depends on this module."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agentvm.drivers.base import JSON
from agentvm.errors import UpstreamError

# Anthropic error types worth retrying even when they arrive inside a 200 stream.
RETRYABLE_TYPES = frozenset({"rate_limit_error", "overloaded_error", "api_error", "timeout_error"})

# Error code by HTTP status, for error bodies that carry no `error.type` (e.g. a proxy's page).
CODE_BY_STATUS = {
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
class ToolBlock:
    """A streamed tool_use block: its input arrives as `input_json_delta` fragments."""

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


def redact(text: str, api_key: str) -> str:
    return text.replace(api_key, "[redacted]") if api_key else text


def status_error(status: int, body: Any, api_key: str) -> UpstreamError:
    """An HTTP error response of the Messages API as an UpstreamError (code = the API's error type)."""
    error = body.get("error") if isinstance(body, dict) else None
    error_type = error.get("type") if isinstance(error, dict) else None
    error_message = error.get("message") if isinstance(error, dict) else None
    code = error_type if isinstance(error_type, str) and error_type else CODE_BY_STATUS.get(
        status, "api_error" if status >= 500 else "upstream_error")
    message = (error_message if isinstance(error_message, str) and error_message
               else f"Anthropic API error (HTTP {status})")
    retryable = status in (408, 429) or status >= 500 or code in RETRYABLE_TYPES
    return UpstreamError(redact(message, api_key), code=code, retryable=retryable)


def timeout_error() -> UpstreamError:
    return UpstreamError("The request to Anthropic timed out", code="timeout", retryable=True)


def connection_error() -> UpstreamError:
    return UpstreamError("Could not reach Anthropic or the connection was lost", code="connection_error",
                         retryable=True)


def malformed_response() -> UpstreamError:
    """A stream event that is not valid JSON (or UTF-8): the parser's details stay out of the message."""
    return UpstreamError("Anthropic sent a malformed stream event", code="malformed_response", retryable=True)


def unexpected_error(exc: Exception, api_key: str) -> UpstreamError:
    return UpstreamError(redact(f"Anthropic request failed: {type(exc).__name__}: {exc}", api_key),
                         code="upstream_error")
