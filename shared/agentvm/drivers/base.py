"""The neutral driver contract: an LLM request in, a stream of driver events out.

Messages use the Anthropic Messages API shape (role + content blocks), which Bedrock shares.
A driver raises `UpstreamError` (with the provider's error code) when the call fails, before or
during the stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentvm.domain.models import Usage

JSON = dict[str, Any]


@dataclass(slots=True)
class LLMRequest:
    model: str
    messages: list[JSON]
    max_tokens: int
    system: str | None = None
    tools: list[JSON] = field(default_factory=list)
    temperature: float | None = None
    # the token API's callers' fields (services/token_gateway.py), in Anthropic's shapes; agent turns leave
    # them unset (None: the provider's default)
    system_blocks: list[JSON] | None = None  # the system prompt as content blocks (cache_control kept); over `system`
    stop_sequences: list[str] | None = None
    tool_choice: JSON | None = None  # {"type": "auto" | "any" | "tool" | "none", "name"?}
    top_p: float | None = None
    # False: the caller wants the whole message, not its stream (the token API's non-streamed calls); a
    # driver may then ask its provider for one answer (anthropic_lite does); the events are the same
    stream: bool = True


@dataclass(frozen=True, slots=True)
class MessageStart:
    message_id: str
    model: str
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolUseStart:
    tool_call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class InputJsonDelta:
    partial_json: str


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    output: Any
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class ToolUseStop:
    tool_call_id: str
    name: str
    input: JSON
    # A result supplied by the driver itself (the scripted driver's mock tools); real drivers
    # leave it None and the engine runs the tool.
    result: ToolOutcome | None = None


@dataclass(frozen=True, slots=True)
class HiddenOutput:
    """Output the model streamed that no other event carries (thinking, a server tool's input, a
    compaction summary), as its UTF-8 byte count: billed output if the stream breaks before the
    provider reports its final usage (docs/billing.md)."""

    nbytes: int


@dataclass(frozen=True, slots=True)
class UsageUpdate:
    """Usage the provider reported during the stream (Anthropic's `message_delta`: cumulative, so
    it replaces what was reported before; fields it leaves out keep their earlier values)."""

    usage: Usage
    output_reported: bool = True  # the update carried the output count (else only input or cache counts)


@dataclass(frozen=True, slots=True)
class MessageStop:
    """The end of the message. `usage` is the call's final usage, authoritative as it stands (a final
    0 is 0); `usage_final` is False when the provider never reported the output count after
    message start, so that `usage.output_tokens` does not cover what was streamed."""

    stop_reason: str
    usage: Usage = field(default_factory=Usage)
    usage_final: bool = True


DriverEvent = (MessageStart | TextDelta | ToolUseStart | InputJsonDelta | ToolUseStop | HiddenOutput | UsageUpdate
               | MessageStop)
