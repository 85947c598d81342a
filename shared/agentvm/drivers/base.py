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
class MessageStop:
    stop_reason: str
    usage: Usage = field(default_factory=Usage)


DriverEvent = MessageStart | TextDelta | ToolUseStart | InputJsonDelta | ToolUseStop | MessageStop
