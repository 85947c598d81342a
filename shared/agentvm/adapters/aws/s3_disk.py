"""The container tier's `Disk`: a container's S3 workspace prefix synced into a local directory.

`mount` pulls `workspaces/{tenant}/{container}/` into `workspace_dir(base, tenant, container)` (the
directory the tools use, created with mode 0o700), `sync` pushes what changed, `unmount` pushes and
forgets the container. One `S3Workspace` is kept per mounted container: its manifest is what keeps
pushes incremental and lets them delete only objects it knows of (s3_workspace.py). The S3 client
comes from `client_source` on first mount (the runtime's `S3BlobStore.s3`, so the client is shared).
Operations on one container run one at a time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from agentvm.adapters.aws.s3_workspace import DEFAULT_CONCURRENCY, DEFAULT_MAX_FILE_BYTES, S3Workspace
from agentvm.sandbox.workspace import workspace_dir

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

log = logging.getLogger(__name__)


class S3Disk:
    """`Disk` over the bucket's workspace prefixes, mounted under `base`."""

    def __init__(self, bucket: str, base: Path, client_source: Callable[[], Awaitable[S3Client]], *,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, concurrency: int = DEFAULT_CONCURRENCY) -> None:
        self.bucket = bucket
        self.base = base
        self._client_source = client_source
        self._max_file_bytes = max_file_bytes
        self._concurrency = concurrency
        self._mounted: dict[tuple[str, str], S3Workspace] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def mount(self, tenant_id: str, container_id: str) -> Path:
        key = (tenant_id, container_id)
        path = workspace_dir(self.base, tenant_id, container_id)
        async with self._lock(key):
            if key in self._mounted:
                return path
            # for_container first: it refuses ids that are no plain key segment before any mkdir
            ws = S3Workspace.for_container(self.bucket, tenant_id, container_id, await self._client_source(),
                                           max_file_bytes=self._max_file_bytes, concurrency=self._concurrency)
            await asyncio.to_thread(path.mkdir, mode=0o700, parents=True, exist_ok=True)
            files = await ws.pull(path)
            self._mounted[key] = ws
        log.info("workspace mounted", extra={"tenant_id": tenant_id, "container_id": container_id, "files": files})
        return path

    async def sync(self, tenant_id: str, container_id: str) -> None:
        key = (tenant_id, container_id)
        async with self._lock(key):
            ws = self._mounted.get(key)
            if ws is not None:
                await ws.push(workspace_dir(self.base, tenant_id, container_id))

    async def unmount(self, tenant_id: str, container_id: str) -> None:
        key = (tenant_id, container_id)
        async with self._lock(key):
            ws = self._mounted.get(key)
            if ws is None:
                return
            await ws.push(workspace_dir(self.base, tenant_id, container_id))
            del self._mounted[key]  # only once pushed: after a failure, sync or unmount again

    def _lock(self, key: tuple[str, str]) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock


if TYPE_CHECKING:
    from agentvm.ports import Disk

    def _implements_disk(disk: S3Disk) -> Disk:  # mypy checks the port's signatures
        return disk
