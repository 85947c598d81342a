"""The SystemEvent envelope, the reliable-delivery wrapper and ACKs (spec §1.3–§1.5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from agentvm.ids import now_ms
from agentvm.protocol.base import WireModel
from agentvm.protocol.events import EVENT_META


def event(type_: str, data: dict[str, Any] | WireModel, context: dict[str, str] | None = None,
          *, timestamp: int | None = None, seq: int | None = None) -> dict[str, Any]:
    """Build an outgoing event envelope as a dict."""
    source, category, intent = EVENT_META[type_]
    env: dict[str, Any] = {
        "type": type_,
        "timestamp": now_ms() if timestamp is None else timestamp,
        "data": data.wire() if isinstance(data, WireModel) else data,
        "source": source,
        "category": category,
        "intent": intent,
    }
    if context is not None:
        env["context"] = context
    if seq is not None:
        env["seq"] = seq
    return env


def response(command: str, data: WireModel) -> dict[str, Any]:
    """A `<command>_response` envelope (no context, spec §2.1)."""
    return {
        "type": f"{command}_response",
        "timestamp": now_ms(),
        "data": data.wire(),
        "source": "command",
        "category": "response",
        "intent": "result",
    }


def encode(env: dict[str, Any]) -> str:
    return orjson.dumps(env).decode()


def wrap(msg_id: str, payload: str) -> str:
    """The reliable wrapper. `__payload` must be a JSON *string* holding the event JSON."""
    return '{"__msgId":' + orjson.dumps(msg_id).decode() + ',"__payload":' + orjson.dumps(payload).decode() + "}"


@dataclass(frozen=True, slots=True)
class Inbound:
    """A classified client frame."""

    kind: str  # "ack" | "subscribe" | "auth" | "request" | "other" | "invalid"
    body: dict[str, Any]


def classify(text: str | bytes) -> Inbound:
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        return Inbound("invalid", {})
    if not isinstance(body, dict):
        return Inbound("invalid", {})
    if "__ack" in body:
        return Inbound("ack", body)
    t = body.get("type")
    if t == "subscribe":
        return Inbound("subscribe", body)
    if t == "auth":
        return Inbound("auth", body)
    if isinstance(t, str) and t.endswith("_request"):
        return Inbound("request", body)
    return Inbound("other", body)
