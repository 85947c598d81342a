"""The image and agent a runner read for a session, kept for its next turns of that session.

A warm `chat_turn` environment or a turn host runs turn after turn of the same sessions, and each
turn used to read the session's image and agent again (two consistent reads, 2 of ~20 read units
per turn). The cache keeps them per session, and an entry is used only while all of this holds:

* the session still exists: the runner takes its lease first, a conditional write on the session
  item that fails when the session is gone, and deleting an image deletes its sessions' items, so a
  deleted image never runs another turn, whatever is cached;
* the session's `definitions` counter (on the session item, returned by that same write) is the one
  the entry was read at: destroying an agent bumps it on each of the image's sessions
  (`SessionLeases.bump_definitions`) before its queued turns are dropped, and a new agent can only
  follow a destroyed one, so an entry never outlives the agent it holds;
* it is younger than `ttl_s` (`AVM_DEFINITION_CACHE_S`, 60 s): an image's editable fields (name,
  description; its config is a frozen snapshot) reach the turns that start `ttl_s` after the edit.

No read of its own: the lease's write returns the counter anyway. Entries without an agent are not
kept (the next turn reads again). Bounded by entries, least recently used first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from agentvm.domain.models import Agent, Image


@dataclass(frozen=True, slots=True)
class _Entry:
    image: Image
    agent: Agent
    definitions: int
    read_at: float


class DefinitionCache:
    def __init__(self, ttl_s: float, *, max_entries: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, tenant_id: str, session_id: str, image_id: str, definitions: int) -> tuple[Image, Agent] | None:
        """The cached image and agent of the session, if they are still good (see the module)."""
        key = (tenant_id, session_id)
        entry = self._entries.get(key)
        if entry is None or entry.definitions != definitions or entry.image.image_id != image_id \
                or self._clock() - entry.read_at > self.ttl_s:
            if entry is not None:
                del self._entries[key]
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry.image, entry.agent

    def put(self, tenant_id: str, session_id: str, definitions: int, image: Image, agent: Agent | None) -> None:
        """Keep what was just read (at `definitions`), or forget the session when it has no agent."""
        key = (tenant_id, session_id)
        if agent is None or self.ttl_s <= 0:
            self._entries.pop(key, None)
            return
        self._entries[key] = _Entry(image, agent, definitions, self._clock())
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def forget(self, tenant_id: str, session_id: str) -> None:
        self._entries.pop((tenant_id, session_id), None)

    def __len__(self) -> int:
        return len(self._entries)
