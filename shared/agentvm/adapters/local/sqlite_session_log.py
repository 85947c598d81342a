"""A session's messages and event log in the SQLite database (`SessionLog`)."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

import orjson

from agentvm.adapters.local.sqlite_database import SqliteDatabase
from agentvm.domain.message_text import searchable_text
from agentvm.domain.models import Checkpoint, LoggedEvent, StoredMessage


class SqliteSessionLog(SqliteDatabase):
    """`SessionLog` on SQLite: a checkpoint is one job (one savepoint of a group commit)."""

    async def commit(self, checkpoint: Checkpoint) -> None:
        tenant, sid = checkpoint.tenant_id, checkpoint.session_id
        texts = [searchable_text(m.body) for m in checkpoint.messages]

        def job(c: sqlite3.Connection) -> None:
            for m, text in zip(checkpoint.messages, texts, strict=True):
                cur = c.execute(
                    "INSERT OR IGNORE INTO messages (tenant_id, session_id, message_id, turn_id, body, "
                    "created_at) VALUES (?,?,?,?,?,?)",
                    (tenant, sid, m.message_id, m.turn_id, orjson.dumps(m.body).decode(),
                     int(m.body.get("timestamp", 0))))
                if text and cur.rowcount == 1:  # indexed once, when inserted (a replay is ignored)
                    c.execute("INSERT INTO message_search (rowid, text, tenant_id) VALUES (?,?,?)",
                              (cur.lastrowid, text, tenant))
            if checkpoint.events:
                c.executemany(
                    "INSERT OR IGNORE INTO events (tenant_id, session_id, seq, type, payload, created_at) "
                    "VALUES (?,?,?,?,?,?)",
                    [(tenant, sid, e.seq, e.type, e.payload, e.created_at) for e in checkpoint.events])
            for t in checkpoint.turns:
                c.execute(
                    "INSERT OR REPLACE INTO turns (tenant_id, turn_id, session_id, image_id, container_id, "
                    "user_message_id, status, tier, model, input_tokens, output_tokens, cache_read_tokens, "
                    "cache_write_tokens, list_cost, billed_cost, error_code, error_message, created_at, "
                    "started_at, ended_at, agent, task, options, key_id, first_token_ms) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (t.tenant_id, t.turn_id, t.session_id, t.image_id, t.container_id, t.user_message_id,
                     str(t.status), t.tier, t.model, t.usage.input_tokens, t.usage.output_tokens,
                     t.usage.cache_read_tokens, t.usage.cache_write_tokens, t.list_cost, t.billed_cost,
                     t.error_code, t.error_message, t.created_at, t.started_at, t.ended_at, t.agent, t.task,
                     orjson.dumps(t.options).decode() if t.options else None, t.key_id, t.first_token_ms))
            if checkpoint.messages:
                latest = max(int(m.body.get("timestamp", 0)) for m in checkpoint.messages)
                c.execute("UPDATE sessions SET updated_at=MAX(updated_at, ?) WHERE tenant_id=? AND session_id=?",
                          (latest, tenant, sid))
        await self._run(job)

    async def list_messages(self, tenant_id: str, session_id: str) -> list[StoredMessage]:
        def job(c: sqlite3.Connection) -> list[StoredMessage]:
            rows = c.execute("SELECT message_id, turn_id, body FROM messages WHERE tenant_id=? AND "
                             "session_id=? ORDER BY pos", (tenant_id, session_id)).fetchall()
            return [StoredMessage(session_id, r[0], orjson.loads(r[2]), r[1]) for r in rows]
        return await self._run(job)

    async def read_events(self, tenant_id: str, session_id: str, after_seq: int,
                          limit: int = 10_000) -> list[LoggedEvent]:
        def job(c: sqlite3.Connection) -> list[LoggedEvent]:
            rows = c.execute("SELECT seq, type, payload, created_at FROM events WHERE tenant_id=? AND "
                             "session_id=? AND seq>? ORDER BY seq LIMIT ?",
                             (tenant_id, session_id, after_seq, limit)).fetchall()
            return [LoggedEvent(*r) for r in rows]
        return await self._run(job)

    async def last_seq(self, tenant_id: str, session_id: str) -> int:
        def job(c: sqlite3.Connection) -> int:
            row = c.execute("SELECT MAX(seq) FROM events WHERE tenant_id=? AND session_id=?",
                            (tenant_id, session_id)).fetchone()
            return int(row[0] or 0)
        return await self._run(job)

    async def reserve_seqs(self, tenant_id: str, session_id: str, block: int) -> tuple[int, int]:
        def job(c: sqlite3.Connection) -> tuple[int, int]:
            row = c.execute("SELECT seq_reserved FROM sessions WHERE tenant_id=? AND session_id=?",
                            (tenant_id, session_id)).fetchone()
            logged = c.execute("SELECT MAX(seq) FROM events WHERE tenant_id=? AND session_id=?",
                               (tenant_id, session_id)).fetchone()[0] or 0
            ceiling = max(int(row[0]) if row else 0, int(logged))
            c.execute("UPDATE sessions SET seq_reserved=? WHERE tenant_id=? AND session_id=?",
                      (ceiling + block, tenant_id, session_id))
            return ceiling + 1, ceiling + block
        return await self._run(job)

    async def prune_events(self, older_than_ms: int) -> int:
        def job(c: sqlite3.Connection) -> int:
            # The newest event of each session is kept so that seq never restarts below it.
            return c.execute(
                "DELETE FROM events WHERE created_at < ? AND seq < (SELECT MAX(e2.seq) FROM events e2 "
                "WHERE e2.tenant_id=events.tenant_id AND e2.session_id=events.session_id)",
                (older_than_ms,)).rowcount
        return await self._run(job)


if TYPE_CHECKING:
    from agentvm.ports import SessionLog

    def _implements_port(repo: SqliteSessionLog) -> SessionLog:  # mypy checks the port's signatures
        return repo
