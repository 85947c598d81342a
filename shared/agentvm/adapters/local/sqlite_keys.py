"""The KeyStore port on the local SQLite database (schema version 7: `api_keys`). Only the salted
hash of each secret is stored; the database file is readable by its owner only (0600)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.domain.models import ApiKey
from agentvm.errors import Conflict

_COLS = "key_id, tenant_id, salt, secret_hash, scopes, created_at, expires_at, revoked_at, name"


class SqliteKeys:
    """`KeyStore` over an open `SqliteStore` (it neither opens nor closes the store)."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    async def put_key(self, key: ApiKey) -> None:
        def job(c: sqlite3.Connection) -> None:
            try:
                c.execute(f"INSERT INTO api_keys ({_COLS}) VALUES (?,?,?,?,?,?,?,?,?)",
                          (key.key_id, key.tenant_id, key.salt, key.secret_hash,
                           orjson.dumps(list(key.scopes)).decode(), key.created_at, key.expires_at,
                           key.revoked_at, key.name))
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"API key already exists: {key.key_id}", field="key_id") from exc
        await self.store.run(job)

    async def get_key(self, key_id: str) -> ApiKey | None:
        def job(c: sqlite3.Connection) -> ApiKey | None:
            row = c.execute(f"SELECT {_COLS} FROM api_keys WHERE key_id=?", (key_id,)).fetchone()
            return _key(row) if row else None
        return await self.store.run(job)

    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        def job(c: sqlite3.Connection) -> list[ApiKey]:
            rows = c.execute(f"SELECT {_COLS} FROM api_keys WHERE tenant_id=? ORDER BY created_at DESC, key_id DESC",
                             (tenant_id,)).fetchall()
            return [_key(r) for r in rows]
        return await self.store.run(job)

    async def revoke_key(self, tenant_id: str, key_id: str, at_ms: int) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            cur = c.execute("UPDATE api_keys SET revoked_at=COALESCE(revoked_at, ?) WHERE key_id=? AND tenant_id=?",
                            (at_ms, key_id, tenant_id))
            return cur.rowcount > 0
        return await self.store.run(job)


def usable_keys(db_path: Path, now_ms: int) -> int:
    """How many keys of a database could authenticate now (0 without a database or before schema 7);
    read directly, before the server opens the store, to refuse a public address without keys."""
    if not db_path.exists():
        return 0
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as conn:
        try:
            row = conn.execute("SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NULL AND "
                               "(expires_at IS NULL OR expires_at > ?)", (now_ms,)).fetchone()
        except sqlite3.OperationalError:  # an older schema: no key table yet
            return 0
    return int(row[0])


def _key(r: tuple[Any, ...]) -> ApiKey:
    return ApiKey(key_id=r[0], tenant_id=r[1], salt=r[2], secret_hash=r[3], scopes=tuple(orjson.loads(r[4])),
                  created_at=r[5], expires_at=r[6], revoked_at=r[7], name=r[8])


if TYPE_CHECKING:
    from agentvm.ports import KeyStore

    def _implements_key_store(keys: SqliteKeys) -> KeyStore:  # mypy checks the port's signatures
        return keys
