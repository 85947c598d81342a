"""Every event the server sends (spec §3, §4), with its source/category/intent and data shape."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agentvm.protocol.base import WireModel


class _D(WireModel):
    pass


# container lifecycle (tenant-wide)
class ContainerCreated(_D):
    container_id: str
    created_at: int


class AgentRegistered(_D):
    container_id: str
    agent_id: str
    definition_name: str
    registered_at: int


class AgentUnregistered(_D):
    container_id: str
    agent_id: str


# session
class MessagePersisted(_D):
    session_id: str
    message_id: str
    saved_at: int


class SessionDestroyed(_D):
    session_id: str
    agent_id: str
    container_id: str


class Interrupted(_D):
    agent_id: str
    container_id: str


# stream
class MessageStart(_D):
    message_id: str
    model: str


class TextDelta(_D):
    text: str


class MessageStop(_D):
    stop_reason: str | None = None


class ToolUseStart(_D):
    tool_call_id: str
    tool_name: str


class InputJsonDelta(_D):
    partial_json: str


class ToolUseStop(_D):
    tool_call_id: str
    tool_name: str
    input: dict[str, Any]


class ToolResultEvent(_D):
    tool_call_id: str
    result: Any
    is_error: bool


# state
class ConversationStart(_D):
    message_id: str


class ConversationResponding(_D):
    pass


class ConversationEnd(_D):
    reason: str


class ConversationQueued(_D):
    message_id: str


class ToolPlanned(_D):
    tool_id: str
    tool_name: str


class ToolExecuting(_D):
    tool_id: str
    tool_name: str
    input: dict[str, Any]


class ErrorOccurred(_D):
    code: str
    message: str
    recoverable: bool
    category: str | None = None


class ErrorReceived(_D):
    message: str
    error_code: str | None = None


class TurnResponse(_D):
    turn_id: str
    message_id: str | None = None
    duration_ms: int
    usage: dict[str, int]
    cost: dict[str, str]
    model: str | None = None
    tier: str
    stop_reason: str | None = None
    status: str
    timestamp: int


class SystemError(_D):
    message: str
    request_id: str | None = None
    severity: str = "error"
    code: str | None = None
    details: str | None = None


class MessageEventData(_D):
    """Message events carry a complete Message object; its shape is in protocol.messages."""

    model_config = {"extra": "allow"}
    id: str = Field(...)


# type → (source, category, intent)
EVENT_META: dict[str, tuple[str, str, str]] = {
    "container_created": ("container", "lifecycle", "notification"),
    "agent_registered": ("container", "lifecycle", "notification"),
    "agent_unregistered": ("container", "lifecycle", "notification"),
    "message_persisted": ("session", "persist", "result"),
    "session_destroyed": ("session", "lifecycle", "notification"),
    "interrupted": ("agent", "lifecycle", "notification"),
    "message_start": ("agent", "stream", "notification"),
    "text_delta": ("agent", "stream", "notification"),
    "message_stop": ("agent", "stream", "notification"),
    "tool_use_start": ("agent", "stream", "notification"),
    "input_json_delta": ("agent", "stream", "notification"),
    "tool_use_stop": ("agent", "stream", "notification"),
    "tool_result": ("agent", "stream", "notification"),
    "conversation_start": ("agent", "state", "notification"),
    "conversation_responding": ("agent", "state", "notification"),
    "conversation_end": ("agent", "state", "notification"),
    "conversation_queued": ("agent", "state", "notification"),
    "tool_planned": ("agent", "state", "notification"),
    "tool_executing": ("agent", "state", "notification"),
    "error_occurred": ("agent", "state", "notification"),
    "error_received": ("agent", "state", "notification"),
    "user_message": ("agent", "message", "notification"),
    "assistant_message": ("agent", "message", "notification"),
    "tool_call_message": ("agent", "message", "notification"),
    "tool_result_message": ("agent", "message", "notification"),
    "error_message": ("agent", "message", "notification"),
    "turn_response": ("agent", "turn", "notification"),
    "system_error": ("command", "error", "notification"),
}

EVENT_DATA: dict[str, type[WireModel]] = {
    "container_created": ContainerCreated,
    "agent_registered": AgentRegistered,
    "agent_unregistered": AgentUnregistered,
    "message_persisted": MessagePersisted,
    "session_destroyed": SessionDestroyed,
    "interrupted": Interrupted,
    "message_start": MessageStart,
    "text_delta": TextDelta,
    "message_stop": MessageStop,
    "tool_use_start": ToolUseStart,
    "input_json_delta": InputJsonDelta,
    "tool_use_stop": ToolUseStop,
    "tool_result": ToolResultEvent,
    "conversation_start": ConversationStart,
    "conversation_responding": ConversationResponding,
    "conversation_end": ConversationEnd,
    "conversation_queued": ConversationQueued,
    "tool_planned": ToolPlanned,
    "tool_executing": ToolExecuting,
    "error_occurred": ErrorOccurred,
    "error_received": ErrorReceived,
    "user_message": MessageEventData,
    "assistant_message": MessageEventData,
    "tool_call_message": MessageEventData,
    "tool_result_message": MessageEventData,
    "error_message": MessageEventData,
    "turn_response": TurnResponse,
    "system_error": SystemError,
}
