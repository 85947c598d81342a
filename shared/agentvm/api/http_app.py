"""The FastAPI application: health and, in later issues, the management and SSE APIs."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentvm import __version__
from agentvm.errors import AgentVMError


def create_app(*, lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None) -> FastAPI:
    app = FastAPI(title="AgentVM", version=__version__, lifespan=lifespan,
                  description="AgentVM management API. The AgentX WebSocket protocol is served on /ws.")

    @app.exception_handler(AgentVMError)
    async def _agentvm_error(_request: Request, exc: AgentVMError) -> JSONResponse:
        body: dict[str, Any] = {"error": {"code": exc.code, "message": exc.message}}
        if exc.field:
            body["error"]["field"] = exc.field
        return JSONResponse(body, status_code=exc.http_status)

    @app.get("/health", tags=["ops"])
    async def health() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    return app

