"""A session's stored history, read from the store once and then kept up to date in memory, so a
turn does not re-read (and the engine does not re-scan) the whole conversation every time."""

from __future__ import annotations

import asyncio

from agentvm.domain.models import StoredMessage
from agentvm.ports import Store


class SessionHistory:
    def __init__(self, store: Store, tenant_id: str, session_id: str) -> None:
        self._store = store
        self._tenant_id = tenant_id
        self._session_id = session_id
        self._messages: list[StoredMessage] | None = None
        self._loading: asyncio.Task[None] | None = None
        self._arrived: list[StoredMessage] = []  # committed while the first read was running

    async def load(self) -> list[StoredMessage]:
        if self._messages is None:
            if self._loading is None:
                self._loading = asyncio.get_running_loop().create_task(self._read())
            await asyncio.shield(self._loading)
        assert self._messages is not None
        return self._messages

    async def _read(self) -> None:
        try:
            rows = await self._store.list_messages(self._tenant_id, self._session_id)
        except BaseException:
            self._loading = None
            raise
        known = {m.message_id for m in rows}
        rows.extend(m for m in self._arrived if m.message_id not in known)
        self._arrived = []
        self._messages = rows

    def extend(self, messages: list[StoredMessage]) -> None:
        """Record messages that were just committed to the store."""
        if self._messages is not None:
            self._messages.extend(messages)
        elif self._loading is not None:
            self._arrived.extend(messages)
