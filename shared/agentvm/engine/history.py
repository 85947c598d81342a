"""A session's stored history, read from the store once and then kept up to date in memory, with
the LLM context of each turn built once: a new turn builds only its own messages, so the cost of
a turn does not grow with the length of the conversation."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

from agentvm.domain.models import StoredMessage
from agentvm.engine.context import build_group, join_groups
from agentvm.engine.history_cache import HistoryCache
from agentvm.ports import RecentMessages, Store


class SessionHistory:
    def __init__(self, store: Store, tenant_id: str, session_id: str, *, cache: HistoryCache | None = None,
                 recent: RecentMessages | None = None, expect: Collection[str] = ()) -> None:
        """With `cache` (and `recent`, the store's reader of recent messages), the messages are read
        through the process's cache: only what was stored since its last read of the session.
        `expect`: ids of messages that must be there (see HistoryCache.read)."""
        self._expect = expect
        self._store = store
        self._cache = cache if recent is not None else None
        self._recent = recent
        self._tenant_id = tenant_id
        self._session_id = session_id
        self._messages: list[StoredMessage] | None = None
        self._loading: asyncio.Task[None] | None = None
        self._arrived: list[StoredMessage] = []  # committed while the first read was running
        # messages by turn (turns in order of first appearance), and each turn's built entries
        self._groups: dict[str, list[StoredMessage]] = {}
        self._built: dict[str, tuple[int, list[dict[str, Any]]]] = {}

    async def load(self) -> list[StoredMessage]:
        if self._messages is None:
            if self._loading is None:
                self._loading = asyncio.get_running_loop().create_task(self._read())
            await asyncio.shield(self._loading)
        assert self._messages is not None
        return self._messages

    async def _read(self) -> None:
        try:
            if self._cache is not None and self._recent is not None:
                rows = await self._cache.read(self._recent, self._tenant_id, self._session_id, expect=self._expect)
            else:
                rows = await self._store.list_messages(self._tenant_id, self._session_id)
        except BaseException:
            self._loading = None
            raise
        known = {m.message_id for m in rows}
        rows.extend(m for m in self._arrived if m.message_id not in known)
        self._arrived = []
        self._messages = rows
        self._group(rows)

    def extend(self, messages: list[StoredMessage]) -> None:
        """Record messages that were just committed to the store."""
        if self._cache is not None:
            self._cache.extend(self._tenant_id, self._session_id, messages)
        if self._messages is not None:
            self._messages.extend(messages)
            self._group(messages)
        elif self._loading is not None:
            self._arrived.extend(messages)

    def _group(self, messages: list[StoredMessage]) -> None:
        for m in messages:
            self._groups.setdefault(m.turn_id or f"_solo:{m.message_id}", []).append(m)

    def context(self, until_turn_id: str) -> list[dict[str, Any]]:
        """The LLM messages of the conversation up to and including turn `until_turn_id` (after
        `load()`). Only turns whose messages changed since the last call are built again."""
        chosen: list[list[dict[str, Any]]] = []
        for key, group in self._groups.items():
            cached = self._built.get(key)
            if cached is None or cached[0] != len(group):
                cached = (len(group), build_group(group))
                self._built[key] = cached
            chosen.append(cached[1])
            if key == until_turn_id:
                break
        return join_groups(chosen)
