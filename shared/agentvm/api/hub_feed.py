"""The chat API's feed on `avm serve`: an in-process listener registered in the hub like a
WebSocket connection (its own bounded queue, `afterSeq` replay through the session host)."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from agentvm.api.ws_hub import Connection, LocalHub
from agentvm.hosting.local_host import SessionRegistry
from agentvm.ids import connection_id


class HubFeed:
    def __init__(self, hub: LocalHub, sessions: SessionRegistry, tenant_id: str, *, max_queue: int) -> None:
        self.hub = hub
        self.sessions = sessions
        self.tenant_id = tenant_id
        self.conn = Connection(connection_id(), tenant_id, max_queue=max_queue, wrap=False)

    @property
    def connection_id(self) -> str:
        return self.conn.id

    async def __aenter__(self) -> Self:
        self.hub.register(self.conn)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.hub.unregister(self.conn)

    async def follow(self, session_id: str, container_id: str, after_seq: int) -> None:
        await self.sessions.subscribe(self.tenant_id, self.conn.id, session_id, after_seq)

    async def receive(self, timeout: float) -> str | None:
        if self.conn.closed:
            raise ConnectionError(f"the feed was closed: {self.conn.close_reason}")
        return await self.conn.receive(timeout)


class HubFeeds:
    def __init__(self, hub: LocalHub, sessions: SessionRegistry, *, max_queue: int) -> None:
        self.hub, self.sessions, self.max_queue = hub, sessions, max_queue

    def open(self, tenant_id: str) -> HubFeed:
        return HubFeed(self.hub, self.sessions, tenant_id, max_queue=self.max_queue)
