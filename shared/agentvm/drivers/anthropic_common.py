"""What the two Anthropic drivers share: tool-input assembly and the mapping of failures to
`UpstreamError`. No SDK import: the SDK-free driver depends on this module."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentvm.domain.models import Usage
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


# Anthropic's usage fields by the neutral Usage field they fill.
_USAGE_FIELDS = (("input_tokens", "input_tokens"), ("output_tokens", "output_tokens"),
                 ("cache_read_input_tokens", "cache_read_tokens"),
                 ("cache_creation_input_tokens", "cache_write_tokens"))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def reported_usage(raw: Any, base: Usage) -> tuple[Usage, bool]:
    """`base` updated by an Anthropic `usage` object (of `message_start` or `message_delta`): each
    count it carries replaces base's, since the counts are cumulative; a count it leaves out (or an
    absent `usage`) keeps base's. Also whether it carried `output_tokens`."""
    if not isinstance(raw, Mapping):
        return base, False
    values = {ours: _count(raw.get(theirs)) for theirs, ours in _USAGE_FIELDS}
    merged = Usage(**{ours: getattr(base, ours) if v is None else v for ours, v in values.items()})
    return merged, values["output_tokens"] is not None


def hidden_output_bytes(delta_type: Any, delta: Mapping[str, Any], *, tool_block: bool) -> int:
    """The UTF-8 bytes of model output a content_block_delta carries that no driver event shows:
    thinking, a server tool's input JSON (a client tool's input is an `InputJsonDelta`), a
    compaction summary. Citations and signatures are not model output tokens: 0."""
    if delta_type == "thinking_delta":
        text = delta.get("thinking")
    elif delta_type == "input_json_delta" and not tool_block:
        text = delta.get("partial_json")
    elif delta_type == "compaction_delta":
        text = delta.get("content")
    else:
        return 0
    return len(text.encode()) if isinstance(text, str) else 0


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
