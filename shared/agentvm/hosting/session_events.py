"""The session events the hosts publish themselves (a turn's own events come from the engine), and
the stop rule: what becomes of the turns still queued when an agent is stopped. Both hosts, the
local one and the leased one (with its worker), use these, so local and cloud say the same."""

from __future__ import annotations

from collections.abc import Iterable

from agentvm.domain.models import Image, StoredMessage, Turn, TurnStatus
from agentvm.engine.channel import SessionChannel
from agentvm.ids import now_ms
from agentvm.protocol import events as wire

AGENT_STOPPED = "agent_stopped"
AGENT_STOPPED_TEXT = "The agent was stopped."


def session_context(image: Image, agent_id: str | None) -> dict[str, str]:
    """The context every event of the session carries."""
    ctx = {"containerId": image.container_id, "imageId": image.image_id, "sessionId": image.session_id}
    if agent_id:
        ctx["agentId"] = agent_id
    return ctx


def announce(channel: SessionChannel, message: StoredMessage, *, sender: str | None) -> None:
    """`message_persisted` to everyone, `user_message` to everyone but the sender (who shows it already)."""
    channel.publish("message_persisted", wire.message_persisted(message.session_id, message.message_id, now_ms()))
    channel.publish("user_message", message.body, exclude=sender, timestamp=int(message.body["timestamp"]))


def queued(channel: SessionChannel, message_id: str) -> None:
    """The message's turn waits behind another one."""
    channel.publish("conversation_queued", wire.conversation_queued(message_id))


def interrupted(channel: SessionChannel, agent_id: str, container_id: str) -> None:
    channel.publish("interrupted", wire.interrupted(agent_id, container_id))


def session_destroyed(channel: SessionChannel, image: Image, agent_id: str) -> None:
    channel.publish("session_destroyed", wire.session_destroyed(image.session_id, agent_id, image.container_id))


def drop_stopped(turns: Iterable[Turn], reason: str = AGENT_STOPPED_TEXT) -> list[Turn]:
    """The stop rule: queued turns of a stopped agent never run; each ends interrupted
    (`agent_stopped`, with `reason`). Returns them, for the caller to store."""
    dropped = list(turns)
    ts = now_ms()
    for turn in dropped:
        turn.status, turn.ended_at = TurnStatus.INTERRUPTED, ts
        turn.error_code, turn.error_message = AGENT_STOPPED, reason
    return dropped
