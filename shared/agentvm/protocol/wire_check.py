"""Check a frame the server sent against the protocol models: the envelope, its metadata and its
`data`, strictly (camelCase names only, no unknown field, no coerced type).

The serving path never calls this: events go out as plain dicts, so no model is built per text
delta. The test suites run every frame they receive through `frame_problems` (the stock client of
tests/support, the Python client and the SSE chat tests), so an emitter that drifts from the models
fails them (docs/protocol.md, "Keeping the wire in line").
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import Field, ValidationError

from agentvm.protocol.base import WireModel
from agentvm.protocol.commands import RESPONSES, ResponseData
from agentvm.protocol.events import EVENT_DATA, EVENT_META, EventContext
from agentvm.protocol.messages import AssistantMessage, ErrorMessage, ToolCallMessage, ToolResultMessage, UserMessage

_REQUIRED = ("type", "timestamp", "data", "source", "category", "intent")
_OPTIONAL = ("context", "seq")
# history (`image_messages_response.messages`) holds the message objects of the message events
_MESSAGES: dict[str, type[WireModel]] = {"user": UserMessage, "assistant": AssistantMessage,
                                         "tool-call": ToolCallMessage, "tool-result": ToolResultMessage,
                                         "error": ErrorMessage}
# the sources whose events are published on a session's channel, each with its `seq`
_SESSION_SOURCES = frozenset({"agent", "session"})


class FrameRef(WireModel):
    """Cloud only: a frame above 128 KB, stored in S3 (docs/protocol.md, "Large frames in the cloud")."""

    url: str
    bytes: int
    sha256: str


class RefData(WireModel):
    ref: FrameRef = Field(alias="__ref")
    request_id: str | None = None


class TruncatedData(WireModel):
    """Cloud only: a frame above 128 KB that could not be stored."""

    truncated: Literal[True] = Field(alias="__truncated")
    bytes: int
    request_id: str | None = None


def _strict(model: type[WireModel], value: Any, where: str) -> list[str]:
    try:
        model.model_validate_json(orjson.dumps(value), strict=True, by_alias=True, by_name=False)
    except ValidationError as exc:
        return [f"{where}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" if err["loc"] else
                f"{where}: {err['msg']}" for err in exc.errors()]
    return []


def data_model(type_: str) -> type[WireModel] | None:
    """The model of an event type's `data`; None when the type has none (the server must not send it)."""
    if type_ in EVENT_DATA:
        return EVENT_DATA[type_]
    return RESPONSES.get(type_[: -len("_response")]) if type_.endswith("_response") else None


def data_problems(type_: str, data: Any) -> list[str]:
    """What is wrong with one event's `data` alone (where only the data is at hand)."""
    model = data_model(type_)
    if model is None:
        return [f"{type_}: no model for this event type (protocol/events.py)"]
    return _strict(model, data, f"{type_}: data")


def frame_problems(frame: str | bytes | dict[str, Any]) -> list[str]:
    """What is wrong with one sent frame (unwrapped): empty when it matches the models."""
    env = orjson.loads(frame) if isinstance(frame, (str, bytes)) else frame
    if not isinstance(env, dict):
        return [f"not a JSON object: {env!r:.80}"]
    type_ = env.get("type")
    if not isinstance(type_, str):
        return [f"envelope: no string type: {env!r:.120}"]
    out = [f"{type_}: envelope: missing {key}" for key in _REQUIRED if key not in env]
    out += [f"{type_}: envelope: unknown field {key}" for key in env if key not in _REQUIRED + _OPTIONAL]
    if not isinstance(env.get("timestamp"), int) or isinstance(env.get("timestamp"), bool):
        out.append(f"{type_}: timestamp: not an integer")
    data = env.get("data")
    if not isinstance(data, dict):
        return [*out, f"{type_}: data: not an object"]
    is_response = type_.endswith("_response") and type_ not in EVENT_DATA  # turn_response is an event
    model = data_model(type_)
    if is_response:
        meta: tuple[str, str, str] | None = ("command", "response", "result")
        if model is None:  # an unknown request type is answered with the common fields and an error
            model = ResponseData
            if not data.get("error"):
                out.append(f"{type_}: a response to an unknown command without an error")
    else:
        meta = EVENT_META.get(type_)
        if model is None or meta is None:
            return [*out, f"{type_}: no model for this event type (protocol/events.py)"]
    got = (env.get("source"), env.get("category"), env.get("intent"))
    if got != meta:
        out.append(f"{type_}: source/category/intent {got} != {meta}")
    if is_response:
        out += [f"{type_}: envelope: a response has no {key}" for key in _OPTIONAL if key in env]
    else:
        if "context" in env:
            out += _strict(EventContext, env["context"], f"{type_}: context")
        seq = env.get("seq")
        if (seq is not None) != (env.get("source") in _SESSION_SOURCES):
            out.append(f"{type_}: seq {seq!r}: session events (and only they) carry a seq")
        elif seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or seq < 0):
            out.append(f"{type_}: seq {seq!r}: not a non-negative integer")
    if "__ref" in data:
        model = RefData
    elif "__truncated" in data:
        model = TruncatedData
    elif type_ == "image_messages_response" and isinstance(data.get("messages"), list):
        for i, message in enumerate(data["messages"]):
            kind = message.get("subtype") if isinstance(message, dict) else None
            found = _MESSAGES.get(kind) if isinstance(kind, str) else None
            out += (_strict(found, message, f"{type_}: data.messages.{i}") if found is not None else
                    [f"{type_}: data.messages.{i}: no message model for subtype {kind!r}"])
    return out + _strict(model, data, f"{type_}: data")
