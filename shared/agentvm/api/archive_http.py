"""Session archives over HTTP: `GET /v1/sessions/{id}/export` writes one session (image snapshot
with pins, messages, turn log, usage) as a portable JSON archive; `POST /v1/sessions/import` restores
one into a container of the caller, under new ids (services/session_archive.py, docs/sessions.md).

The import's body is spooled to an unnamed temporary file as it arrives (never held in memory by
this layer) and parsed from a memory map of that file. Its size limit, `archive_max_bytes`
(AVM_ARCHIVE_MAX_BYTES), is enforced in front of the route, after the caller's key
(api/request_gate.py): a larger archive gets a 413 naming the limit before more of it is read."""

# no `from __future__ import annotations`: FastAPI reads these annotations (Depends, Query) at run time

import asyncio
import contextlib
import mmap
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import IO, Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from agentvm.domain.models import Principal
from agentvm.services.session_archive import SessionArchive, encode_archive, parse_archive, too_large
from agentvm.services.use_cases import UseCases

JSON = dict[str, Any]

IMPORT_PATH = "/v1/sessions/import"
_WRITE_BYTES = 1 << 20  # written to the spool file in pieces of this size (one thread hop each)

_IMPORT_BODY: JSON = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "description": "a session archive, as GET /v1/sessions/{id}/export wrote it"}}}}}


@contextlib.asynccontextmanager
async def spooled(request: Request, spool_dir: Path | None, limit: int) -> AsyncIterator[IO[bytes]]:
    """The request body in an unnamed temporary file (gone when closed, or when the process dies),
    positioned at its start; ArchiveTooLarge past `limit` (the gate cuts earlier; this is the route's
    own guarantee)."""
    with tempfile.TemporaryFile(dir=spool_dir) as file:
        size, pending = 0, bytearray()
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            pending += chunk
            if len(pending) >= _WRITE_BYTES:
                await asyncio.to_thread(file.write, pending)
                pending = bytearray()
        await asyncio.to_thread(file.write, pending)
        file.seek(0)
        yield file


def parse_spooled(file: IO[bytes], limit: int) -> JSON:
    """The archive in `file`, parsed from a memory map: the file's pages, not a copy on the heap."""
    size = file.seek(0, 2)
    if size == 0:
        return parse_archive(b"", max_bytes=limit)
    with mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
        return parse_archive(view, max_bytes=limit)


def archive_router(services: Callable[[], UseCases], principal_for: Callable[[Request], Awaitable[Principal]],
                   max_bytes: Callable[[], int], spool_dir: Path | None = None) -> APIRouter:
    """`max_bytes`: where the import limit is read; `spool_dir`: where an import is spooled (None:
    the system's temporary directory)."""
    router = APIRouter(prefix="/v1", tags=["sessions"])
    Caller = Annotated[Principal, Depends(principal_for)]

    def archives() -> SessionArchive:
        s = services()
        return SessionArchive(s.deps, s.images, s.image_sessions)

    @router.post(IMPORT_PATH.removeprefix("/v1"), status_code=201, openapi_extra=_IMPORT_BODY,
                 summary="Restore a session archive into a container: a new image and session, new ids")
    async def import_session(request: Request, p: Caller,
                             container_id: Annotated[str, Query(alias="containerId",
                                                                description="the caller's container to restore into "
                                                                            "(created if needed)")]) -> JSON:
        limit = max_bytes()
        async with spooled(request, spool_dir, limit) as file:
            archive = await asyncio.to_thread(parse_spooled, file, limit)
        return (await archives().import_(p, container_id, archive)).to_wire()

    @router.get("/sessions/{session_id}/export",
                summary="The session as a portable archive: image snapshot, messages, turns, usage")
    async def export_session(session_id: str, p: Caller,
                             include_secrets: Annotated[bool, Query(
                                 alias="includeSecrets",
                                 description="true: keep the image's secrets (MCP env values, headers, URL "
                                             "tokens) in the archive; by default they are <redacted>")] = False
                             ) -> Response:
        archive = await archives().export(p, session_id, include_secrets=include_secrets)
        return Response(encode_archive(archive), media_type="application/json", headers={
            "content-disposition": f'attachment; filename="{session_id}.session.json"'})

    return router
