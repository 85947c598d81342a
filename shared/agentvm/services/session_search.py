"""Full-text search over the caller's messages, every session of every image of its tenant.

What is searchable and how a query is read: agentvm.domain.message_text. The store does the search
(`Store.search_messages`): SQLite FTS5 locally, per-tenant month partitions ranked in windows in
the cloud (docs/sessions.md)."""

from __future__ import annotations

from agentvm.domain.models import Principal, SearchHit
from agentvm.errors import InvalidRequest
from agentvm.ports import Store

MAX_QUERY_CHARS = 200
MAX_LIMIT = 50
DEFAULT_LIMIT = 20


class SessionSearch:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def search(self, p: Principal, q: str, *, limit: int = DEFAULT_LIMIT,
                     cursor: str | None = None) -> tuple[list[SearchHit], str | None]:
        """A page of the caller's messages that hold every word of `q`, best first, and the cursor
        of the next page (None: nothing more). A page may be short while a cursor follows."""
        if not isinstance(q, str) or not q.strip() or len(q) > MAX_QUERY_CHARS:
            raise InvalidRequest(f"q: must be 1 to {MAX_QUERY_CHARS} characters, not blank", field="q")
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidRequest(f"limit: must be from 1 to {MAX_LIMIT}", field="limit")
        return await self.store.search_messages(p.tenant_id, q, limit=limit, cursor=cursor)
