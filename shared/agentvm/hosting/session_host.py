"""Where a session's turns run and who publishes its events: the one seam between the runtimes.

`avm serve` hosts sessions in memory (`sessions.SessionRegistry`: an actor per session). The cloud
hosts none: `leased_sessions.LeasedSessions` coordinates through the session's lease record and
hands turns to `chat_turn`. The other services see only this interface."""

from __future__ import annotations

from typing import Any, Protocol

from agentvm.domain.models import Image, Principal, Turn
from agentvm.ports import Store


class SessionHost(Protocol):
    def set_agent(self, session_id: str, agent_id: str) -> None:
        """The image got an agent: its session events carry the agentId from now on."""
        ...

    async def send(self, p: Principal, connection_id: str | None, image: Image, agent_id: str,
                   content: str | list[dict[str, Any]], options: dict[str, Any] | None = None) -> Turn:
        """Store the user message, announce it (`message_persisted`, `user_message`), queue its turn
        (`options`: the turn's overrides, `temperature` and `maxTokens`)."""
        ...

    async def interrupt(self, image: Image, agent_id: str) -> None:
        """Interrupt the running turn (a no-op when none runs)."""
        ...

    async def stop(self, image: Image, agent_id: str, *, reason: str) -> None:
        """The agent was destroyed: end its turn, drop queued ones, announce `session_destroyed`."""
        ...

    async def subscribe(self, tenant_id: str, connection_id: str, session_id: str, after_seq: int | None) -> None:
        """Subscribe; with `after_seq`, first deliver the missed events exactly once, in order."""
        ...

    async def forget(self, image: Image) -> None:
        """The image is being deleted: stop whatever runs for its session."""
        ...

    async def shutdown(self) -> None: ...


async def session_views(store: Store, image: Image) -> list[Image]:
    """The image as each of its sessions runs it, the primary session first."""
    others = [s.session_id for s in await store.list_sessions(image.tenant_id, image.image_id)
              if s.session_id != image.session_id]
    return [image, *(image.for_session(sid) for sid in others)]
