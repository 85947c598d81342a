"""Turns in the SQLite database (`TurnLog`)."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

import orjson

from agentvm.adapters.local.sqlite_database import SqliteDatabase
from agentvm.domain.cursors import next_turn_cursor, turn_cursor
from agentvm.domain.models import Turn, TurnStatus, Usage


class SqliteTurns(SqliteDatabase):
    """`TurnLog` on SQLite."""

    async def get_turn(self, tenant_id: str, turn_id: str) -> Turn | None:
        def job(c: sqlite3.Connection) -> Turn | None:
            row = c.execute(f"SELECT {_TURN_COLS} FROM turns WHERE tenant_id=? AND turn_id=?",
                            (tenant_id, turn_id)).fetchone()
            return _turn(row) if row else None
        return await self._run(job)

    async def list_turns(self, tenant_id: str, session_id: str) -> list[Turn]:
        def job(c: sqlite3.Connection) -> list[Turn]:
            rows = c.execute(f"SELECT {_TURN_COLS} FROM turns WHERE tenant_id=? AND session_id=? "
                             "ORDER BY created_at, turn_id", (tenant_id, session_id)).fetchall()
            return [_turn(r) for r in rows]
        return await self._run(job)

    async def list_tenant_turns(self, tenant_id: str, *, since_ms: int | None = None, until_ms: int | None = None,
                                limit: int = 50, cursor: str | None = None) -> tuple[list[Turn], str | None]:
        before = turn_cursor(cursor)

        def job(c: sqlite3.Connection) -> list[Turn]:
            sql = (f"SELECT {_TURN_COLS} FROM turns WHERE tenant_id=? AND status NOT IN ('queued', 'running') "
                   "AND created_at>=? AND created_at<?")
            args: list[Any] = [tenant_id, since_ms or 0, until_ms if until_ms is not None else 1 << 62]
            if before is not None:
                sql += " AND (created_at<? OR (created_at=? AND turn_id<?))"
                args += [before[0], before[0], before[1]]
            sql += " ORDER BY created_at DESC, turn_id DESC LIMIT ?"
            return [_turn(r) for r in c.execute(sql, [*args, limit + 1]).fetchall()]
        turns = await self._run(job)
        return turns[:limit], (next_turn_cursor(turns[limit - 1]) if len(turns) > limit else None)

    async def list_unfinished_turns(self) -> list[Turn]:
        def job(c: sqlite3.Connection) -> list[Turn]:
            rows = c.execute(f"SELECT {_TURN_COLS} FROM turns WHERE status IN ('queued', 'running') "
                             "ORDER BY created_at").fetchall()
            return [_turn(r) for r in rows]
        return await self._run(job)


_TURN_COLS = ("tenant_id, turn_id, session_id, image_id, container_id, user_message_id, status, created_at, "
              "tier, model, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, list_cost, "
              "billed_cost, error_code, error_message, started_at, ended_at, agent, task, options, key_id, "
              "first_token_ms")


def _turn(r: tuple[Any, ...]) -> Turn:
    return Turn(
        tenant_id=r[0], turn_id=r[1], session_id=r[2], image_id=r[3], container_id=r[4],
        user_message_id=r[5], status=TurnStatus(r[6]), created_at=r[7], tier=r[8], model=r[9],
        usage=Usage(r[10], r[11], r[12], r[13]), list_cost=r[14], billed_cost=r[15], error_code=r[16],
        error_message=r[17], started_at=r[18], ended_at=r[19], agent=r[20], task=r[21],
        options=orjson.loads(r[22]) if r[22] else {}, key_id=r[23], first_token_ms=r[24])


if TYPE_CHECKING:
    from agentvm.ports import TurnLog

    def _implements_port(repo: SqliteTurns) -> TurnLog:  # mypy checks the port's signatures
        return repo
