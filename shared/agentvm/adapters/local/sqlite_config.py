"""The ConfigStore port on the local SQLite database (schema version 3: `config_values`, `config_audit`).

Statements run on the `SqliteStore`'s worker thread through `SqliteStore.run`, so the configuration
shares the store's one connection and its group commit: `set_value` writes the value (or deletes it)
and appends the audit row in one job, which is one savepoint, so both land or neither does.

Values are stored in clear, secrets included (the `secret` column only records the flag): locally
the database file is readable by its owner only (0600, like its -wal and -shm files), the same
protection as an API key kept in the owner's environment. The audit trail holds what the caller
gives it, which masks secret values (`ConfigChange`).

The audit trail is ordered by `at` (epoch ms), then by insertion for changes within one ms.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.domain.models import ConfigChange


class SqliteConfigStore:
    """`ConfigStore` over an open `SqliteStore` (it neither opens nor closes the store)."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    async def runtime_values(self) -> dict[str, str]:
        def job(c: sqlite3.Connection) -> dict[str, str]:
            rows = c.execute("SELECT key, value FROM config_values ORDER BY key").fetchall()
            return {str(key): str(value) for key, value in rows}
        return await self.store.run(job)

    async def set_value(self, key: str, value_json: str | None, *, secret: bool, change: ConfigChange) -> None:
        def job(c: sqlite3.Connection) -> None:
            _write_value(c, key, value_json, secret=secret, at=change.at)
            c.execute("INSERT INTO config_audit (key, old, new, actor, at) VALUES (?, ?, ?, ?, ?)",
                      (change.key, change.old, change.new, change.actor, change.at))
        await self.store.run(job)

    async def changes(self, limit: int = 100) -> list[ConfigChange]:
        """The newest `limit` changes, newest first (none for a limit below 1)."""
        if limit < 1:
            return []

        def job(c: sqlite3.Connection) -> list[ConfigChange]:
            rows = c.execute("SELECT key, old, new, actor, at FROM config_audit ORDER BY at DESC, id DESC LIMIT ?",
                             (limit,)).fetchall()
            return [ConfigChange(*row) for row in rows]
        return await self.store.run(job)


def _write_value(c: sqlite3.Connection, key: str, value_json: str | None, *, secret: bool, at: int) -> None:
    if value_json is None:
        c.execute("DELETE FROM config_values WHERE key=?", (key,))
        return
    c.execute("INSERT INTO config_values (key, value, secret, updated_at) VALUES (?, ?, ?, ?) "
              "ON CONFLICT (key) DO UPDATE SET value=excluded.value, secret=excluded.secret, "
              "updated_at=excluded.updated_at",
              (key, value_json, int(secret), at))


if TYPE_CHECKING:
    from agentvm.ports import ConfigStore

    def _implements_config_store(store: SqliteConfigStore) -> ConfigStore:  # mypy checks the signatures
        return store
