"""A user message and the turn it queues, and how both runtimes announce it on the session."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentvm.domain.models import Image, Principal, StoredMessage, Turn, TurnStatus
from agentvm.engine.channel import SessionChannel
from agentvm.ids import message_id, now_ms, turn_id
from agentvm.protocol import messages as msgs


@dataclass(frozen=True, slots=True)
class UserTurn:
    message: StoredMessage
    turn: Turn


def new_user_turn(p: Principal, image: Image, content: str | list[dict[str, Any]]) -> UserTurn:
    ts = now_ms()
    mid = message_id()
    body = msgs.user_message(mid, content, ts)
    turn = Turn(p.tenant_id, turn_id(), image.session_id, image.image_id, image.container_id, mid,
                TurnStatus.QUEUED, ts)
    return UserTurn(StoredMessage(image.session_id, mid, body, turn.turn_id), turn)


def announce(channel: SessionChannel, message: StoredMessage, *, sender: str | None) -> None:
    """`message_persisted` to everyone, `user_message` to everyone but the sender (who shows it already)."""
    channel.publish("message_persisted", {"sessionId": message.session_id, "messageId": message.message_id,
                                          "savedAt": now_ms()})
    channel.publish("user_message", message.body, exclude=sender, timestamp=int(message.body["timestamp"]))
