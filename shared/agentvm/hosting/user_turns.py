"""A user message and the turn it queues (hosting/session_events.py announces it on the session)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentvm.domain.models import Image, Principal, StoredMessage, Turn, TurnStatus
from agentvm.ids import message_id, now_ms, turn_id
from agentvm.protocol import messages as msgs


@dataclass(frozen=True, slots=True)
class UserTurn:
    message: StoredMessage
    turn: Turn


TASK_CHARS = 200  # how much of the user message the turn log keeps as the turn's task


def new_user_turn(p: Principal, image: Image, content: str | list[dict[str, Any]],
                  options: dict[str, Any] | None = None) -> UserTurn:
    ts = now_ms()
    mid = message_id()
    body = msgs.user_message(mid, content, ts)
    turn = Turn(p.tenant_id, turn_id(), image.session_id, image.image_id, image.container_id, mid,
                TurnStatus.QUEUED, ts, agent=(image.config.get("sources") or {}).get("agent") or image.name,
                task=task_of(content), options=dict(options or {}), key_id=p.key_id)
    return UserTurn(StoredMessage(image.session_id, mid, body, turn.turn_id), turn)


def task_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        text = content
    else:
        text = " ".join(str(part.get("text", f"[{part.get('type')}]")) for part in content)
    text = " ".join(text.split())
    return text if len(text) <= TASK_CHARS else text[:TASK_CHARS - 1] + "…"

