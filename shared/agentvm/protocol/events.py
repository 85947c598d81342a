"""Every event the server sends (spec §3, §4), with its source/category/intent and data shape.

The models are the one source of truth for the wire. The engine and the hosts send plain dicts
(no model is built per text delta), so every frame the test suites receive is checked against
these models (protocol/wire_check.py; docs/protocol.md, "Keeping the wire in line"). Rare events
are built by the small constructors at the end of this module, whose field names are the models'.
"""

from __future__ import annotations

from typing import Any, Literal

from agentvm.protocol.base import WireModel
from agentvm.protocol.messages import (
    AssistantMessage,
    ErrorMessage,
    ToolCallMessage,
    ToolResultMessage,
    UserMessage,
)


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
    reason: Literal["completed", "interrupted", "error"]


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


class TokenUsage(_D):
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int


class TurnCost(_D):
    """Money as decimal strings, never floats."""

    list: str
    billed: str
    currency: str


class TurnResponse(_D):
    turn_id: str
    message_id: str | None = None
    duration_ms: int
    usage: TokenUsage
    cost: TurnCost
    model: str | None = None
    tier: Literal["function", "container"]
    stop_reason: str | None = None
    status: Literal["completed", "failed", "interrupted"]
    timestamp: int


class SystemError(_D):
    message: str
    request_id: str | None = None
    severity: Literal["info", "warn", "error", "fatal"] = "error"
    code: str | None = None
    details: str | None = None


class EventContext(_D):
    """The envelope's `context` (spec §1.4): the scope of the event."""

    container_id: str | None = None
    image_id: str | None = None
    agent_id: str | None = None
    session_id: str | None = None


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
    "user_message": UserMessage,
    "assistant_message": AssistantMessage,
    "tool_call_message": ToolCallMessage,
    "tool_result_message": ToolResultMessage,
    "error_message": ErrorMessage,
    "turn_response": TurnResponse,
    "system_error": SystemError,
}


# ---- constructors for the rare events: plain dicts (no model built), named as the models are ----

def container_created(container_id: str, created_at: int) -> dict[str, Any]:
    return {"containerId": container_id, "createdAt": created_at}


def agent_registered(container_id: str, agent_id: str, definition_name: str, registered_at: int) -> dict[str, Any]:
    return {"containerId": container_id, "agentId": agent_id, "definitionName": definition_name,
            "registeredAt": registered_at}


def agent_unregistered(container_id: str, agent_id: str) -> dict[str, Any]:
    return {"containerId": container_id, "agentId": agent_id}


def message_persisted(session_id: str, message_id: str, saved_at: int) -> dict[str, Any]:
    return {"sessionId": session_id, "messageId": message_id, "savedAt": saved_at}


def session_destroyed(session_id: str, agent_id: str, container_id: str) -> dict[str, Any]:
    return {"sessionId": session_id, "agentId": agent_id, "containerId": container_id}


def interrupted(agent_id: str, container_id: str) -> dict[str, Any]:
    return {"agentId": agent_id, "containerId": container_id}


def conversation_queued(message_id: str) -> dict[str, Any]:
    return {"messageId": message_id}


def conversation_end(reason: str) -> dict[str, Any]:
    return {"reason": reason}


def tool_executing(tool_id: str, tool_name: str, input_: dict[str, Any]) -> dict[str, Any]:
    return {"toolId": tool_id, "toolName": tool_name, "input": input_}


def tool_result(tool_call_id: str, result: Any, is_error: bool) -> dict[str, Any]:
    return {"toolCallId": tool_call_id, "result": result, "isError": is_error}


def error_received(message: str, error_code: str | None) -> dict[str, Any]:
    return {"message": message, "errorCode": error_code}


def error_occurred(code: str, message: str, *, recoverable: bool = True) -> dict[str, Any]:
    return {"code": code, "message": message, "recoverable": recoverable}


def turn_response(*, turn_id: str, message_id: str | None, duration_ms: int, usage: dict[str, int],
                  cost: dict[str, str], model: str | None, tier: str, stop_reason: str | None, status: str,
                  timestamp: int) -> dict[str, Any]:
    return {"turnId": turn_id, "messageId": message_id, "durationMs": duration_ms, "usage": usage, "cost": cost,
            "model": model, "tier": tier, "stopReason": stop_reason, "status": status, "timestamp": timestamp}
