"""The container tier of `avm serve`: sandboxes hosted in this process.

`start` is where the cloud would start the container's task; here it marks the container's sandbox
active (and counts the dispatch, which tests and metrics read). The sandbox itself is the container's
workspace with its tools (`WorkspaceTools`): the scheduler resumes the escalated turn in this process
with the tools from `for_image`.
"""

from __future__ import annotations

import logging
import time

from agentvm.domain.models import Image
from agentvm.ports import ToolProvider, ToolRunner

log = logging.getLogger(__name__)


class LocalContainerTier:
    def __init__(self, tools: ToolProvider) -> None:
        self.tools = tools
        self.dispatches = 0  # turns handed to the container tier
        self.active: dict[tuple[str, str], float] = {}  # (tenant, container) → last use (monotonic)

    async def start(self, tenant_id: str, container_id: str, session_id: str) -> None:
        self.dispatches += 1
        key = (tenant_id, container_id)
        if key not in self.active:
            log.info("container sandbox started", extra={"container_id": container_id, "session_id": session_id})
        self.active[key] = time.monotonic()

    async def for_image(self, image: Image) -> ToolRunner:
        self.active[(image.tenant_id, image.container_id)] = time.monotonic()
        return await self.tools.for_image(image)
