"""The web console's files (docs/console.md): served under /console/, with `/` leading there. The
files are static; the same ones work from any static host against a cloud deployment (the sign-in
form takes the stack's HTTP and WebSocket URLs).

The routes declare no caller, so the request gate lets a browser load the page before it has a key
(the page then sends its key on every API call); every other path still needs one."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.staticfiles import StaticFiles

CONSOLE_PATH = "/console/"

# The page loads only its own scripts and styles; it may call any API origin (a cloud deployment's
# URLs are typed in at sign-in), and it is never framed.
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self' http: https: ws: wss:; frame-ancestors 'none'; "
                                "base-uri 'none'; form-action 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def console_router(directory: Path, *, auth: str) -> APIRouter:
    """`auth`: "open" (no key needed: the page signs in by itself) or "keys". It travels as a header
    on the console's own files, so the page learns it without a request that can fail (a static host
    serving the same files has no such header: the page asks for a key)."""
    router = APIRouter(include_in_schema=False)
    files = StaticFiles(directory=directory)
    headers = {**SECURITY_HEADERS, "X-AgentVM-Auth": auth}

    @router.get("/")
    @router.get("/console")
    async def console_root() -> Response:
        return RedirectResponse(CONSOLE_PATH, status_code=307)

    @router.get("/console/{path:path}")
    async def console_file(path: str, request: Request) -> Response:
        response = await files.get_response(path or "index.html", request.scope)
        response.headers.update(headers)
        return response

    return router
