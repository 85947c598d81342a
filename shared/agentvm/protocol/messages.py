"""AgentX Message objects (spec §5.4): what history holds and what message events carry."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import Field

from agentvm.protocol.base import InboundModel, WireModel

MAX_TEXT_CHARS = 1_000_000


class TextPart(InboundModel):
    type: Literal["text"]
    text: Annotated[str, Field(max_length=MAX_TEXT_CHARS)]


class ImagePart(InboundModel):
    type: Literal["image"]
    data: str = Field(min_length=1)
    media_type: Literal["image/png", "image/jpeg", "image/gif", "image/webp"]
    name: str | None = None


class FilePart(InboundModel):
    type: Literal["file"]
    data: str = Field(min_length=1)
    media_type: str = Field(min_length=1)
    filename: str | None = None


UserContentPart = Annotated[TextPart | ImagePart | FilePart, Field(discriminator="type")]
UserContent = Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | list[UserContentPart]


def content_wire(content: str | list[Any]) -> str | list[dict[str, Any]]:
    """Validated user content as stored and sent: the text, or each part's wire dict."""
    if isinstance(content, str):
        return content
    return [part.model_dump(by_alias=True, exclude_none=True) for part in content]


class UserMessage(WireModel):
    id: str
    role: Literal["user"] = "user"
    subtype: Literal["user"] = "user"
    content: str | list[dict[str, Any]]
    timestamp: int


class AssistantMessage(WireModel):
    id: str
    role: Literal["assistant"] = "assistant"
    subtype: Literal["assistant"] = "assistant"
    content: list[dict[str, Any]]
    timestamp: int
    usage: dict[str, int] | None = None


class ToolCall(WireModel):
    type: Literal["tool-call"] = "tool-call"
    id: str
    name: str
    input: dict[str, Any]


class ToolCallMessage(WireModel):
    id: str
    role: Literal["assistant"] = "assistant"
    subtype: Literal["tool-call"] = "tool-call"
    tool_call: ToolCall
    timestamp: int
    parent_id: str | None = None


class ToolOutput(WireModel):
    type: Literal["text", "error-text", "json", "error-json"]
    value: Any


class ToolResult(WireModel):
    type: Literal["tool-result"] = "tool-result"
    id: str
    name: str
    output: ToolOutput


class ToolResultMessage(WireModel):
    id: str
    role: Literal["tool"] = "tool"
    subtype: Literal["tool-result"] = "tool-result"
    tool_call_id: str
    tool_result: ToolResult
    timestamp: int


class ErrorMessage(WireModel):
    id: str
    role: Literal["error"] = "error"
    subtype: Literal["error"] = "error"
    content: str
    error_code: str | None = None
    timestamp: int


def _all_set(model: WireModel) -> dict[str, Any]:
    # Literal defaults (role, subtype) must be on the wire even though they were not passed.
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def user_message(message_id: str, content: str | list[dict[str, Any]], ts: int) -> dict[str, Any]:
    return _all_set(UserMessage(id=message_id, content=content, timestamp=ts))


def assistant_message(message_id: str, text: str, ts: int) -> dict[str, Any]:
    return _all_set(AssistantMessage(id=message_id, content=[{"type": "text", "text": text}], timestamp=ts))


def tool_call_message(message_id: str, call_id: str, name: str, input_: dict[str, Any],
                      parent_id: str | None, ts: int) -> dict[str, Any]:
    return _all_set(ToolCallMessage(id=message_id, tool_call=ToolCall(id=call_id, name=name, input=input_),
                                    timestamp=ts, parent_id=parent_id))


def tool_result_message(message_id: str, call_id: str, name: str, output: Any, is_error: bool,
                        ts: int) -> dict[str, Any]:
    value = output if isinstance(output, str) else _json_text(output)
    out = ToolOutput(type="error-text" if is_error else "text", value=value)
    return _all_set(ToolResultMessage(id=message_id, tool_call_id=call_id,
                                      tool_result=ToolResult(id=call_id, name=name or "unknown", output=out),
                                      timestamp=ts))


def error_message(message_id: str, text: str, code: str | None, ts: int) -> dict[str, Any]:
    return _all_set(ErrorMessage(id=message_id, content=text, error_code=code, timestamp=ts))


def _json_text(value: Any) -> str:
    return orjson.dumps(value).decode()
