"""Agents (activation records) in the SQLite database (`AgentRepository`)."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from agentvm.adapters.local.sqlite_database import SqliteDatabase
from agentvm.domain.models import Agent


class SqliteAgents(SqliteDatabase):
    """`AgentRepository` on SQLite."""

    async def put_agent(self, agent: Agent) -> Agent:
        def job(c: sqlite3.Connection) -> Agent:
            c.execute("INSERT OR IGNORE INTO agents (tenant_id, agent_id, image_id, container_id, name, "
                      "created_at) VALUES (?,?,?,?,?,?)",
                      (agent.tenant_id, agent.agent_id, agent.image_id, agent.container_id, agent.name,
                       agent.created_at))
            row = c.execute(f"SELECT {_AGENT_COLS} FROM agents WHERE tenant_id=? AND image_id=?",
                            (agent.tenant_id, agent.image_id)).fetchone()
            return Agent(*row)
        return await self._run(job)

    async def get_agent(self, tenant_id: str, agent_id: str) -> Agent | None:
        def job(c: sqlite3.Connection) -> Agent | None:
            row = c.execute(f"SELECT {_AGENT_COLS} FROM agents WHERE tenant_id=? AND agent_id=?",
                            (tenant_id, agent_id)).fetchone()
            return Agent(*row) if row else None
        return await self._run(job)

    async def get_agent_for_image(self, tenant_id: str, image_id: str) -> Agent | None:
        def job(c: sqlite3.Connection) -> Agent | None:
            row = c.execute(f"SELECT {_AGENT_COLS} FROM agents WHERE tenant_id=? AND image_id=?",
                            (tenant_id, image_id)).fetchone()
            return Agent(*row) if row else None
        return await self._run(job)

    async def list_agents(self, tenant_id: str, container_id: str | None = None) -> list[Agent]:
        def job(c: sqlite3.Connection) -> list[Agent]:
            if container_id is None:
                rows = c.execute(f"SELECT {_AGENT_COLS} FROM agents WHERE tenant_id=? "
                                 "ORDER BY created_at, agent_id", (tenant_id,)).fetchall()
            else:
                rows = c.execute(f"SELECT {_AGENT_COLS} FROM agents WHERE tenant_id=? AND container_id=? "
                                 "ORDER BY created_at, agent_id", (tenant_id, container_id)).fetchall()
            return [Agent(*r) for r in rows]
        return await self._run(job)

    async def delete_agent(self, tenant_id: str, agent_id: str) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            return c.execute("DELETE FROM agents WHERE tenant_id=? AND agent_id=?",
                             (tenant_id, agent_id)).rowcount == 1
        return await self._run(job)


_AGENT_COLS = "tenant_id, agent_id, image_id, container_id, name, created_at"


if TYPE_CHECKING:
    from agentvm.ports import AgentRepository

    def _implements_port(repo: SqliteAgents) -> AgentRepository:  # mypy checks the port's signatures
        return repo
