"""The histories a process has read, kept for its next turns of the same sessions.

A warm Lambda environment or a turn host runs many turns of the same sessions; reading a session's
whole message list for each turn makes every turn cost reads that grow with the conversation. The
cache keeps each session's messages after a full read and, for the next turn, reads only the
messages created since its last read of the session, less `SKEW_MS` (`RecentMessages.
list_messages_since`: one Query over the message keys, which start with the creation time), merged
by id. Reads per turn then depend on what was said since, not on the conversation's length.

Why that top-up is complete. Messages are stored by the runner holding the session's lease, and by
`ws_default` (a user message, created just before it is stored). Runners hold the lease one after
another, so a runner that follows a read at time R creates its messages after R: only clock skew
between machines (`SKEW_MS` covers it) could date them earlier. A user message created before R
but stored after it (a `ws_default` slower than the window) is the one case the window can miss;
every turn has exactly one user message, stored with the turn, so the cache checks after each read
that every turn it holds messages of, and every turn about to run (`expect`), has its user message,
and reads the whole history again when one is missing. Bounded by bytes (least recently used
sessions go first)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import orjson

from agentvm.domain.models import StoredMessage
from agentvm.ports import RecentMessages

SKEW_MS = 2_000
_OVERHEAD = 200  # bytes per cached message beside its body (ids, the object itself)


def _complete(entry: _Entry, expect: Collection[str]) -> bool:
    """Does every turn the entry holds messages of have its user message, and every expected message?"""
    if any(mid not in entry.index for mid in expect):
        return False
    turns = {m.turn_id for m in entry.messages if m.turn_id}
    users = {m.turn_id for m in entry.messages if m.turn_id and m.role == "user"}
    return turns <= users


def _size(m: StoredMessage) -> int:
    return len(orjson.dumps(m.body)) + _OVERHEAD


@dataclass(slots=True)
class _Entry:
    messages: list[StoredMessage]
    read_at_ms: int
    size: int
    index: dict[str, int] = field(default_factory=dict)  # message id -> position in `messages`


class HistoryCache:
    def __init__(self, max_bytes: int, *, clock: Callable[[], float] = time.time) -> None:
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._bytes = 0
        self.full_reads = 0
        self.top_ups = 0
        self.misses = 0  # top-ups that found a user message missing (then a full read)

    @property
    def size(self) -> int:
        return self._bytes

    async def read(self, store: RecentMessages, tenant_id: str, session_id: str, *,
                   expect: Collection[str] = ()) -> list[StoredMessage]:
        """The session's messages in store order (a copy: the caller may extend it). `expect`: ids of
        messages that must be stored by now (the user messages of the turns about to run)."""
        key = (tenant_id, session_id)
        now = int(self._clock() * 1000)  # before the read: anything created later is newer than this
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size
            rows = await store.list_messages_since(tenant_id, session_id, entry.read_at_ms - SKEW_MS)
            self.top_ups += 1
            self._merge(entry, rows)
            entry.read_at_ms = now
            if not _complete(entry, expect):
                self.misses += 1
                entry = None
        if entry is None:
            entry = _Entry([], now, 0)
            self._merge(entry, await store.list_messages(tenant_id, session_id))
            self.full_reads += 1
        self._put(key, entry)
        return list(entry.messages)

    def extend(self, tenant_id: str, session_id: str, messages: list[StoredMessage]) -> None:
        """Messages this process has just stored (a cached session only)."""
        entry = self._entries.get((tenant_id, session_id))
        if entry is None:
            return
        self._bytes -= entry.size
        self._merge(entry, messages)
        self._put((tenant_id, session_id), entry)

    def invalidate(self, tenant_id: str, session_id: str) -> None:
        entry = self._entries.pop((tenant_id, session_id), None)
        if entry is not None:
            self._bytes -= entry.size

    def _merge(self, entry: _Entry, rows: list[StoredMessage]) -> None:
        for m in rows:
            at = entry.index.get(m.message_id)
            if at is not None:  # stored again (a replayed checkpoint): the store keeps the last write
                entry.size += _size(m) - _size(entry.messages[at])
                entry.messages[at] = m
                continue
            entry.index[m.message_id] = len(entry.messages)
            entry.messages.append(m)
            entry.size += _size(m)

    def _put(self, key: tuple[str, str], entry: _Entry) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        self._bytes += entry.size
        while self._bytes > self.max_bytes and self._entries:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.size
