"""The resource center in the SQLite database (`ResourceRepository`)."""

from __future__ import annotations

import base64
import binascii
import sqlite3
from typing import TYPE_CHECKING, Any

import orjson

from agentvm.adapters.local.sqlite_database import SqliteDatabase
from agentvm.domain.models import ResourceVersion
from agentvm.errors import Conflict, InvalidRequest, NotFound


class SqliteResources(SqliteDatabase):
    """`ResourceRepository` on SQLite."""

    async def create_resource(self, first: ResourceVersion) -> None:
        t, rid, kind, name = first.tenant_id, first.resource_id, first.kind, first.name

        def job(c: sqlite3.Connection) -> None:
            if c.execute("SELECT 1 FROM resources WHERE tenant_id=? AND (resource_id=? OR (kind=? AND name=?))",
                         (t, rid, kind, name)).fetchone():
                raise Conflict(f"Resource already exists: {kind}/{name}")
            if first.published:
                _check_publishable(c, t, kind, name)
            c.execute("INSERT INTO resources (tenant_id, resource_id, kind, name, published) VALUES (?,?,?,?,?)",
                      (t, rid, kind, name, first.published))
            _insert_version(c, first)
        await self._run(job)

    async def add_resource_version(self, version: ResourceVersion) -> None:
        t, rid = version.tenant_id, version.resource_id

        def job(c: sqlite3.Connection) -> None:
            row = c.execute("SELECT kind, name FROM resources WHERE tenant_id=? AND resource_id=?",
                            (t, rid)).fetchone()
            if row is None:
                raise NotFound(f"Resource not found: {version.kind}/{version.name}")
            kind, name = row
            if c.execute("SELECT 1 FROM resource_versions WHERE tenant_id=? AND resource_id=? AND version=?",
                         (t, rid, version.version)).fetchone():
                raise Conflict(f"Version {version.version} of {kind}/{name} already exists")
            if version.published:
                _check_publishable(c, t, kind, name)
            c.execute("UPDATE resources SET published=? WHERE tenant_id=? AND resource_id=?",
                      (version.published, t, rid))
            _insert_version(c, version)
        await self._run(job)

    async def resource_versions(self, tenant_id: str, resource_id: str) -> list[ResourceVersion]:
        def job(c: sqlite3.Connection) -> list[ResourceVersion]:
            # own first; a published one of another tenant otherwise
            row = c.execute("SELECT tenant_id FROM resources WHERE resource_id=? AND (tenant_id=? OR published=1) "
                            "ORDER BY tenant_id<>?, tenant_id LIMIT 1", (resource_id, tenant_id, tenant_id)).fetchone()
            return _versions_of(c, row[0], resource_id) if row else []
        return await self._run(job)

    async def find_resource(self, tenant_id: str, kind: str, name: str) -> list[ResourceVersion]:
        def job(c: sqlite3.Connection) -> list[ResourceVersion]:
            row = c.execute("SELECT tenant_id, resource_id FROM resources WHERE kind=? AND name=? AND "
                            "(tenant_id=? OR published=1) ORDER BY tenant_id<>? LIMIT 1",
                            (kind, name, tenant_id, tenant_id)).fetchone()
            return _versions_of(c, row[0], row[1]) if row else []
        return await self._run(job)

    async def list_resources(self, tenant_id: str, *, kind: str | None = None, name: str | None = None,
                             tag: str | None = None, query: str | None = None, limit: int = 50,
                             cursor: str | None = None) -> tuple[list[ResourceVersion], str | None]:
        after = _decode_cursor(cursor)
        limit = max(limit, 1)
        where: list[str] = ["(r.tenant_id=? OR r.published=1)"]
        args: list[str | int] = [tenant_id]
        if kind is not None:
            where.append("r.kind=?")
            args.append(kind)
        if name:
            where.append("substr(r.name, 1, ?)=?")  # an exact prefix (LIKE folds case and has wildcards)
            args += [len(name), name]
        if after is not None:
            where.append("(r.kind, r.name, r.tenant_id) > (?, ?, ?)")
            args += after
        sql = f"{_LATEST_VERSIONS} WHERE {' AND '.join(where)} ORDER BY r.kind, r.name, r.tenant_id"

        def job(c: sqlite3.Connection) -> list[ResourceVersion]:
            found: list[ResourceVersion] = []
            for row in c.execute(sql, args):  # rows are read lazily: stop one past the page
                v = _resource_version(row)
                if _matches(v, tag, query):
                    found.append(v)
                    if len(found) > limit:
                        break
            return found
        found = await self._run(job)
        page = found[:limit]
        return page, _encode_cursor(page[-1]) if len(found) > limit else None

    async def delete_resource(self, tenant_id: str, resource_id: str) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            c.execute("DELETE FROM resource_versions WHERE tenant_id=? AND resource_id=?", (tenant_id, resource_id))
            return c.execute("DELETE FROM resources WHERE tenant_id=? AND resource_id=?",
                             (tenant_id, resource_id)).rowcount == 1
        return await self._run(job)


_RESOURCE_COLS = ("r.tenant_id, r.resource_id, r.kind, r.name, v.version, v.version_key, v.content, v.content_hash, "
                  "v.dependencies, v.description, v.tags, r.published, v.created_at")

_RESOURCE_JOIN = ("FROM resources r JOIN resource_versions v ON v.tenant_id=r.tenant_id AND "
                  "v.resource_id=r.resource_id")

_LATEST_VERSIONS = (
    f"SELECT {_RESOURCE_COLS} {_RESOURCE_JOIN} AND v.version=(SELECT l.version FROM resource_versions l "
    "WHERE l.tenant_id=r.tenant_id AND l.resource_id=r.resource_id ORDER BY l.version_key DESC, l.version DESC "
    "LIMIT 1)")


def _insert_version(c: sqlite3.Connection, v: ResourceVersion) -> None:
    c.execute("INSERT INTO resource_versions (tenant_id, resource_id, version, version_key, content, content_hash, "
              "dependencies, description, tags, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
              (v.tenant_id, v.resource_id, v.version, v.version_key, orjson.dumps(v.content).decode(),
               v.content_hash, orjson.dumps(v.dependencies).decode(), v.description, orjson.dumps(v.tags).decode(),
               v.created_at))


def _check_publishable(c: sqlite3.Connection, tenant_id: str, kind: str, name: str) -> None:
    if c.execute("SELECT 1 FROM resources WHERE kind=? AND name=? AND published=1 AND tenant_id<>?",
                 (kind, name, tenant_id)).fetchone():
        raise Conflict(f"Another tenant already published {kind}/{name}")


def _versions_of(c: sqlite3.Connection, owner: str, resource_id: str) -> list[ResourceVersion]:
    rows = c.execute(f"SELECT {_RESOURCE_COLS} {_RESOURCE_JOIN} WHERE r.tenant_id=? AND r.resource_id=? "
                     "ORDER BY v.version_key DESC, v.version DESC", (owner, resource_id)).fetchall()
    return [_resource_version(r) for r in rows]


def _resource_version(r: tuple[Any, ...]) -> ResourceVersion:
    return ResourceVersion(
        tenant_id=r[0], resource_id=r[1], kind=r[2], name=r[3], version=r[4], version_key=r[5],
        content=orjson.loads(r[6]), content_hash=r[7], dependencies=tuple(orjson.loads(r[8])), description=r[9],
        tags=tuple(orjson.loads(r[10])), published=bool(r[11]), created_at=r[12])


def _matches(v: ResourceVersion, tag: str | None, query: str | None) -> bool:
    if tag is not None and tag not in v.tags:
        return False
    if not query:
        return True
    q = query.casefold()
    return any(q in text.casefold() for text in (v.name, v.description, *v.tags))


def _encode_cursor(last: ResourceVersion) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([last.kind, last.name, last.tenant_id])).decode()


def _decode_cursor(cursor: str | None) -> list[str] | None:
    if cursor is None:
        return None
    try:
        key = orjson.loads(base64.b64decode(cursor, altchars=b"-_", validate=True))
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest("Invalid cursor", field="cursor") from exc
    if not (isinstance(key, list) and len(key) == 3 and all(isinstance(k, str) for k in key)):
        raise InvalidRequest("Invalid cursor", field="cursor")
    return key


if TYPE_CHECKING:
    from agentvm.ports import ResourceRepository

    def _implements_port(repo: SqliteResources) -> ResourceRepository:  # mypy checks the port's signatures
        return repo
