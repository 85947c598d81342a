"""Message search in the SQLite database (`SearchIndex`): FTS5 beside `messages` (adapters/sqlite_fts.py)."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from agentvm.adapters.local.sqlite_database import SqliteDatabase
from agentvm.adapters.sqlite_fts import SNIPPET_ARGS, snippet_sql
from agentvm.domain.message_text import (
    cursor_int,
    match_expression,
    render_snippet,
    search_cursor,
    search_cursor_state,
)
from agentvm.domain.models import SearchHit


class SqliteSearch(SqliteDatabase):
    """`SearchIndex` on SQLite."""

    async def search_messages(self, tenant_id: str, query: str, *, limit: int = 20,
                              cursor: str | None = None) -> tuple[list[SearchHit], str | None]:
        """FTS5 over every message of the tenant, BM25 order (newest first among equals); the cursor
        is the offset of the next page. The page's rows are ranked first and only they get a snippet."""
        state = search_cursor_state(cursor, query)
        offset = cursor_int(state, "o") if state is not None else 0
        match = match_expression(query)
        limit = max(limit, 1)
        if match is None:
            return [], None

        def job(c: sqlite3.Connection) -> tuple[list[SearchHit], bool]:
            # the join to sessions: a message committed after its session was deleted never shows
            ranked = c.execute(
                "SELECT message_search.rowid, bm25(message_search) FROM message_search "
                "JOIN messages m ON m.pos=message_search.rowid "
                "JOIN sessions s ON s.tenant_id=m.tenant_id AND s.session_id=m.session_id "
                "WHERE message_search MATCH ? AND message_search.tenant_id=? "
                "ORDER BY bm25(message_search), message_search.rowid DESC LIMIT ? OFFSET ?",
                (match, tenant_id, limit + 1, offset)).fetchall()
            if not ranked:
                return [], False
            page = {int(r[0]): -float(r[1]) for r in ranked[:limit]}
            marks = ",".join("?" * len(page))
            rows = c.execute(
                f"SELECT message_search.rowid, {snippet_sql('message_search')}, m.session_id, m.message_id, "
                "m.created_at, json_extract(m.body, '$.role'), json_extract(m.body, '$.subtype'), s.image_id "
                "FROM message_search JOIN messages m ON m.pos=message_search.rowid "
                "JOIN sessions s ON s.tenant_id=m.tenant_id AND s.session_id=m.session_id "
                f"WHERE message_search MATCH ? AND message_search.rowid IN ({marks})",
                (*SNIPPET_ARGS, match, *page)).fetchall()
            by_pos = {int(r[0]): SearchHit(r[2], r[3], str(r[5] or ""), str(r[6] or ""), int(r[4]),
                                           render_snippet(str(r[1])), page[int(r[0])], r[7]) for r in rows}
            return [by_pos[pos] for pos in page if pos in by_pos], len(ranked) > limit
        hits, more = await self._run(job)
        return hits, search_cursor({"o": offset + limit}, query) if more else None


if TYPE_CHECKING:
    from agentvm.ports import SearchIndex

    def _implements_port(repo: SqliteSearch) -> SearchIndex:  # mypy checks the port's signatures
        return repo
