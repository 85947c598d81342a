"""Session archives over HTTP: `GET /v1/sessions/{id}/export` writes one session (image snapshot
with pins, messages, turn log, usage) as a portable JSON archive; `POST /v1/sessions/import` restores
one into a container of the caller, under new ids (services/session_archive.py, docs/sessions.md).

The import reads the raw body itself, up to `archive_max_bytes` (AVM_ARCHIVE_MAX_BYTES): a larger
archive is refused with a 413 naming the limit before more of it is read."""

# no `from __future__ import annotations`: FastAPI reads these annotations (Depends, Query) at run time

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from agentvm.domain.models import Principal
from agentvm.services.bundle import Services
from agentvm.services.session_archive import SessionArchive, encode_archive, parse_archive, too_large

JSON = dict[str, Any]

_IMPORT_BODY: JSON = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "description": "a session archive, as GET /v1/sessions/{id}/export wrote it"}}}}}


def _env_limit() -> int:
    from agentvm.config import Settings

    return Settings().archive_max_bytes


async def read_limited(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it is known to be larger than `limit`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large(limit)
    return bytes(body)


def archive_router(services: Callable[[], Services], principal_for: Callable[[Request], Awaitable[Principal]],
                   max_bytes: int | Callable[[], int] | None = None) -> APIRouter:
    """`max_bytes`: the import limit (a value, or where to read it); None: `archive_max_bytes` of the
    environment's settings, read once."""
    router = APIRouter(prefix="/v1", tags=["sessions"])
    Caller = Annotated[Principal, Depends(principal_for)]
    known: list[int] = []

    def limit() -> int:
        if isinstance(max_bytes, int):
            return max_bytes
        if max_bytes is not None:
            return max_bytes()
        if not known:
            known.append(_env_limit())
        return known[0]

    def archives() -> SessionArchive:
        s = services()
        return SessionArchive(s.deps, s.images, s.session_center)

    @router.post("/sessions/import", status_code=201, openapi_extra=_IMPORT_BODY,
                 summary="Restore a session archive into a container: a new image and session, new ids")
    async def import_session(request: Request, p: Caller,
                             container_id: Annotated[str, Query(alias="containerId",
                                                                description="the caller's container to restore into "
                                                                            "(created if needed)")]) -> JSON:
        max_len = limit()
        archive = parse_archive(await read_limited(request, max_len), max_bytes=max_len)
        return (await archives().import_(p, container_id, archive)).to_wire()

    @router.get("/sessions/{session_id}/export",
                summary="The session as a portable archive: image snapshot, messages, turns, usage")
    async def export_session(session_id: str, p: Caller) -> Response:
        archive = await archives().export(p, session_id)
        return Response(encode_archive(archive), media_type="application/json", headers={
            "content-disposition": f'attachment; filename="{session_id}.session.json"'})

    return router
