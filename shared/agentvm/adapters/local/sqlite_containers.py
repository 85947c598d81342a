"""Containers in the SQLite database (`ContainerRepository`)."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from agentvm.adapters.local.sqlite_database import SqliteDatabase
from agentvm.domain.models import Container


class SqliteContainers(SqliteDatabase):
    """`ContainerRepository` on SQLite."""

    async def create_container(self, container: Container) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            cur = c.execute(
                "INSERT OR IGNORE INTO containers (tenant_id, container_id, created_at, updated_at) "
                "VALUES (?, ?, ?, ?)",
                (container.tenant_id, container.container_id, container.created_at, container.updated_at))
            return cur.rowcount == 1
        return await self._run(job)

    async def get_container(self, tenant_id: str, container_id: str) -> Container | None:
        def job(c: sqlite3.Connection) -> Container | None:
            row = c.execute("SELECT tenant_id, container_id, created_at, updated_at FROM containers "
                            "WHERE tenant_id=? AND container_id=?", (tenant_id, container_id)).fetchone()
            return Container(*row) if row else None
        return await self._run(job)

    async def list_containers(self, tenant_id: str) -> list[Container]:
        def job(c: sqlite3.Connection) -> list[Container]:
            rows = c.execute("SELECT tenant_id, container_id, created_at, updated_at FROM containers "
                             "WHERE tenant_id=? ORDER BY created_at, container_id", (tenant_id,)).fetchall()
            return [Container(*r) for r in rows]
        return await self._run(job)


if TYPE_CHECKING:
    from agentvm.ports import ContainerRepository

    def _implements_port(repo: SqliteContainers) -> ContainerRepository:  # mypy checks the port's signatures
        return repo
