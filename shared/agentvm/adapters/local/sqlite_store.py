"""The Store port on SQLite: a façade over the database's repositories, every query scoped by tenant.

The connection, its worker thread and the group commit are in `sqlite_database`; each repository is
a module of its own (`sqlite_containers`, `sqlite_images`, `sqlite_agents`, `sqlite_session_log`,
`sqlite_turns`, `sqlite_search`, `sqlite_resources`), all on that one connection and thread.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from agentvm.adapters.local.sqlite_agents import SqliteAgents
from agentvm.adapters.local.sqlite_containers import SqliteContainers
from agentvm.adapters.local.sqlite_images import SqliteImages
from agentvm.adapters.local.sqlite_resources import SqliteResources
from agentvm.adapters.local.sqlite_search import SqliteSearch
from agentvm.adapters.local.sqlite_session_log import SqliteSessionLog
from agentvm.adapters.local.sqlite_turns import SqliteTurns
from agentvm.domain.models import Agent, Image
from agentvm.errors import StorageUnavailable


class SqliteStore(SqliteContainers, SqliteImages, SqliteAgents, SqliteSessionLog, SqliteTurns, SqliteSearch,
                  SqliteResources):
    """`Store` on SQLite: every repository on one `SqliteDatabase` (one connection, one thread)."""

    async def get_image_and_agent(self, tenant_id: str, image_id: str) -> tuple[Image | None, Agent | None]:
        image = await self.get_image(tenant_id, image_id)
        return (image, await self.get_agent_for_image(tenant_id, image_id)) if image is not None else (None, None)

    async def probe(self) -> None:
        """A cheap read for health checks; `StorageUnavailable` while a storage failure stands."""
        await self.last_seq("health", "health")
        if problems := self.health.problems():
            raise StorageUnavailable(problems[0])

    async def problems(self) -> list[str]:
        """What /health says about the storage: a probe read, then the failures seen (`StorageHealth`)."""
        try:
            await asyncio.wait_for(self.last_seq("health", "health"), 5)
        except StorageUnavailable:
            pass  # recorded in self.health
        except TimeoutError:
            return ["storage: a read took more than 5 s", *self.health.problems()]
        return self.health.problems()


if TYPE_CHECKING:
    from agentvm.ports import Store

    def _implements_store(store: SqliteStore) -> Store:  # mypy checks the port's signatures
        return store
