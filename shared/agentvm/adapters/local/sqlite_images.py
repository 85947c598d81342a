"""Images and their sessions in the SQLite database (`ImageRepository`)."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

import orjson

from agentvm.adapters.local.sqlite_database import SqliteDatabase
from agentvm.domain.cursors import next_session_cursor, session_cursor
from agentvm.domain.models import Image, Session
from agentvm.errors import Conflict


class SqliteImages(SqliteDatabase):
    """`ImageRepository` on SQLite: deleting an image or a session deletes everything of it, in one job."""

    async def create_image(self, image: Image, session: Session) -> None:
        def job(c: sqlite3.Connection) -> None:
            c.execute(
                "INSERT INTO images (tenant_id, image_id, container_id, session_id, name, description, "
                "system_prompt, config, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (image.tenant_id, image.image_id, image.container_id, image.session_id, image.name,
                 image.description, image.system_prompt, orjson.dumps(image.config).decode(),
                 image.created_at, image.updated_at))
            _insert_session(c, session)
        await self._run(job)

    async def get_image(self, tenant_id: str, image_id: str) -> Image | None:
        def job(c: sqlite3.Connection) -> Image | None:
            row = c.execute(f"SELECT {_IMAGE_COLS} FROM images WHERE tenant_id=? AND image_id=?",
                            (tenant_id, image_id)).fetchone()
            return _image(row) if row else None
        return await self._run(job)

    async def list_images(self, tenant_id: str, container_id: str | None = None) -> list[Image]:
        def job(c: sqlite3.Connection) -> list[Image]:
            if container_id is None:
                rows = c.execute(f"SELECT {_IMAGE_COLS} FROM images WHERE tenant_id=? "
                                 "ORDER BY created_at DESC, image_id DESC", (tenant_id,)).fetchall()
            else:
                rows = c.execute(f"SELECT {_IMAGE_COLS} FROM images WHERE tenant_id=? AND container_id=? "
                                 "ORDER BY created_at DESC, image_id DESC", (tenant_id, container_id)).fetchall()
            return [_image(r) for r in rows]
        return await self._run(job)

    async def update_image(self, tenant_id: str, image_id: str, *, name: str | None,
                           description: str | None, updated_at: int) -> Image | None:
        def job(c: sqlite3.Connection) -> Image | None:
            c.execute("UPDATE images SET name=COALESCE(?, name), description=COALESCE(?, description), "
                      "updated_at=? WHERE tenant_id=? AND image_id=?",
                      (name, description, updated_at, tenant_id, image_id))
            row = c.execute(f"SELECT {_IMAGE_COLS} FROM images WHERE tenant_id=? AND image_id=?",
                            (tenant_id, image_id)).fetchone()
            return _image(row) if row else None
        return await self._run(job)

    async def delete_image(self, tenant_id: str, image_id: str) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            row = c.execute("SELECT session_id FROM images WHERE tenant_id=? AND image_id=?",
                            (tenant_id, image_id)).fetchone()
            if row is None:
                return False
            sids = {row[0]} | {r[0] for r in c.execute(
                "SELECT session_id FROM sessions WHERE tenant_id=? AND image_id=?", (tenant_id, image_id))}
            for sid in sids:
                _delete_session_rows(c, tenant_id, sid)
            c.execute("DELETE FROM agents WHERE tenant_id=? AND image_id=?", (tenant_id, image_id))
            c.execute("DELETE FROM images WHERE tenant_id=? AND image_id=?", (tenant_id, image_id))
            return True
        return await self._run(job)

    async def get_session(self, tenant_id: str, session_id: str) -> Session | None:
        def job(c: sqlite3.Connection) -> Session | None:
            row = c.execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE tenant_id=? AND session_id=?",
                            (tenant_id, session_id)).fetchone()
            return Session(*row) if row else None
        return await self._run(job)

    async def create_session(self, session: Session) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            if c.execute("SELECT 1 FROM images WHERE tenant_id=? AND image_id=? AND container_id=?",
                         (session.tenant_id, session.image_id, session.container_id)).fetchone() is None:
                return False
            try:
                _insert_session(c, session)
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"Session already exists: {session.session_id}") from exc
            return True
        return await self._run(job)

    async def list_sessions(self, tenant_id: str, image_id: str) -> list[Session]:
        def job(c: sqlite3.Connection) -> list[Session]:
            rows = c.execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE tenant_id=? AND image_id=? "
                             "ORDER BY created_at, session_id", (tenant_id, image_id)).fetchall()
            return [Session(*r) for r in rows]
        return await self._run(job)

    async def list_tenant_sessions(self, tenant_id: str, *, image_id: str | None = None, limit: int = 50,
                                   cursor: str | None = None) -> tuple[list[Session], str | None]:
        before = session_cursor(cursor)

        def job(c: sqlite3.Connection) -> list[Session]:
            sql = f"SELECT {_SESSION_COLS} FROM sessions WHERE tenant_id=?"
            args: list[Any] = [tenant_id]
            if image_id is not None:
                sql += " AND image_id=?"
                args.append(image_id)
            if before is not None:
                sql += " AND (created_at<? OR (created_at=? AND session_id<?))"
                args += [before[0], before[0], before[1]]
            sql += " ORDER BY created_at DESC, session_id DESC LIMIT ?"
            return [Session(*r) for r in c.execute(sql, [*args, limit + 1]).fetchall()]
        sessions = await self._run(job)
        return sessions[:limit], (next_session_cursor(sessions[limit - 1]) if len(sessions) > limit else None)

    async def delete_session(self, tenant_id: str, session_id: str) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            found = c.execute("SELECT 1 FROM sessions WHERE tenant_id=? AND session_id=?",
                              (tenant_id, session_id)).fetchone() is not None
            _delete_session_rows(c, tenant_id, session_id)
            return found
        return await self._run(job)


_IMAGE_COLS = ("tenant_id, image_id, container_id, session_id, name, created_at, updated_at, description, "
               "system_prompt, config")

_SESSION_COLS = "tenant_id, session_id, image_id, container_id, created_at, updated_at, title"


def _image(row: tuple[Any, ...]) -> Image:
    return Image(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], orjson.loads(row[9]))


def _insert_session(c: sqlite3.Connection, session: Session) -> None:
    c.execute("INSERT INTO sessions (tenant_id, session_id, image_id, container_id, created_at, updated_at, "
              "title) VALUES (?,?,?,?,?,?,?)",
              (session.tenant_id, session.session_id, session.image_id, session.container_id,
               session.created_at, session.updated_at, session.title))


def _delete_session_rows(c: sqlite3.Connection, tenant_id: str, session_id: str) -> None:
    c.execute("DELETE FROM message_search WHERE rowid IN (SELECT pos FROM messages WHERE tenant_id=? AND "
              "session_id=?)", (tenant_id, session_id))
    for table in ("messages", "events", "turns", "sessions"):
        c.execute(f"DELETE FROM {table} WHERE tenant_id=? AND session_id=?", (tenant_id, session_id))


if TYPE_CHECKING:
    from agentvm.ports import ImageRepository

    def _implements_port(repo: SqliteImages) -> ImageRepository:  # mypy checks the port's signatures
        return repo
