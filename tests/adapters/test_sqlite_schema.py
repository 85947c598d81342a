"""The SQLite store's schema: versioned, migrated in place, a newer one refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agentvm.adapters.local.sqlite_schema import MIGRATIONS
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.domain.models import Container
from tests.adapters.store_records import res


async def test_sqlite_schema_is_versioned_and_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    s = SqliteStore(path)
    await s.open()
    assert await s.integrity_check() == "ok"
    await s.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.execute("PRAGMA user_version=99")
    with pytest.raises(RuntimeError, match="schema version 99 is newer"):
        await SqliteStore(path).open()


async def test_sqlite_migrates_an_existing_database_in_place(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:  # a database written by the first schema version
        conn.executescript(MIGRATIONS[0])
        conn.execute("INSERT INTO containers VALUES ('t1', 'c1', 1, 1)")
        conn.execute("PRAGMA user_version=1")
    s = SqliteStore(path)
    await s.open()
    try:
        assert await s.get_container("t1", "c1") == Container("t1", "c1", 1, 1)
        await s.create_resource(res("t1", "r1", "prompt", "p", "1.0.0"))
        assert [v.version for v in await s.find_resource("t1", "prompt", "p")] == ["1.0.0"]
        assert await s.integrity_check() == "ok"
    finally:
        await s.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == 12
