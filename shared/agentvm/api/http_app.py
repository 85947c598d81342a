"""The FastAPI application: health and the management API (`/v1/resources`; more in later issues).

Errors have one shape everywhere: `{"error": {"code", "message", "field"?}}`, request validation
included (400 naming the field, not FastAPI's 422 list)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentvm import __version__
from agentvm.api.config_http import config_router
from agentvm.api.images_http import images_router
from agentvm.api.resources_http import resources_router
from agentvm.api.search_http import search_router
from agentvm.api.sessions_http import sessions_router
from agentvm.domain.models import Principal
from agentvm.errors import AgentVMError
from agentvm.services.bundle import Services
from agentvm.services.config import ConfigService
from agentvm.services.resources import ResourceService

if TYPE_CHECKING:
    from agentvm.ports import Store
    from agentvm.services.billing import BillingService
    from agentvm.services.chat import ChatService
    from agentvm.services.keys import Caller, KeyService
    from agentvm.services.metrics import TurnMetrics


@dataclass(slots=True)
class HttpApi:
    """What the management API runs on: the services (built by a composition root, maybe lazily)
    and how a request's caller is found."""

    resources: Callable[[], ResourceService]
    principal_for: Callable[[Request], Awaitable[Principal]]
    config: Callable[[], ConfigService] | None = None  # None: this deployment serves no /v1/config
    # who may read and change the configuration (the deployment's, not a tenant's): admin keys
    admin_for: Callable[[Request], Awaitable[Principal]] | None = None
    # the services over a session host (avm serve): /v1/definitions, /v1/images and /v1/sessions
    services: Callable[[], Services] | None = None
    # the SSE chat API (/api/v1): the services with a feed of session events, and a cheap store read
    # for its health check
    chat: Callable[[], ChatService] | None = None
    probe: Callable[[], Awaitable[object]] | None = None
    # the largest session archive /v1/sessions/import accepts (None: AVM_ARCHIVE_MAX_BYTES)
    archive_max_bytes: int | None = None
    # /v1/auth/keys: the key store's service, and who manages keys (a tenant, admin or not)
    keys: Callable[[], KeyService] | None = None
    key_caller: Callable[[Request], Awaitable[Caller]] | None = None
    # /v1/budgets and /v1/usage (with `key_caller`: who changes budgets)
    billing: Callable[[], BillingService] | None = None
    # observability (docs/observability.md): this process's turn metrics (/v1/metrics; /metrics with
    # `admin_for`), and the store whose turn log /v1/logs reads
    metrics: Callable[[], TurnMetrics] | None = None
    turn_log: Callable[[], Store] | None = None


# Every error answer, request validation included: declared for each operation of the OpenAPI
# document (FastAPI's default 422 is never sent: the handler below answers 400).
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "message"], "properties": {
            "code": {"type": "string", "description": "stable and machine-readable: invalid_request, not_found, …"},
            "message": {"type": "string", "description": "for people; names the field when one is wrong"},
            "field": {"type": "string", "description": "the invalid field or parameter, when there is one"}}}}}
ERROR_STATUSES = {400: "Invalid request (a field is named)", 401: "No or an unknown API key",
                  403: "The key may not do this", 404: "Not found", 409: "Conflict with the current state",
                  413: "Request body too large", 429: "Budget or rate limit reached",
                  502: "The LLM provider failed", 503: "Not configured, or no capacity now"}


def _declare_errors(doc: dict[str, Any]) -> None:
    doc.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    for schema in ("HTTPValidationError", "ValidationError"):
        doc["components"]["schemas"].pop(schema, None)
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path, operations in doc.get("paths", {}).items():
        if path.endswith("/health"):
            continue  # always 200: the answer says what is wrong
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status, description in ERROR_STATUSES.items():
                responses.setdefault(str(status), {"description": description, **ref})


def create_app(*, lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
               api: HttpApi | None = None) -> FastAPI:
    app = FastAPI(title="AgentVM", version=__version__, lifespan=lifespan,
                  description="AgentVM management API. The AgentX WebSocket protocol is served on /ws.")

    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _declare_errors(generate())  # generate() keeps the document in app.openapi_schema
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path")]
        if first.get("type") == "json_invalid":  # its location is a character position, not a field
            loc = ["body"]
        field = ".".join(loc)
        message = f"{field}: {first.get('msg')}" if field else str(first.get("msg"))
        body: dict[str, Any] = {"error": {"code": "invalid_request", "message": message}}
        if field:
            body["error"]["field"] = field
        return JSONResponse(body, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _unreadable(request: Request, exc: StarletteHTTPException) -> Response:
        """FastAPI's 400 for a body it cannot read (not UTF-8: not JSON either) in the one error shape;
        Starlette's own answers (an unknown path 404, a wrong method 405) stay as they are."""
        if exc.status_code != 400:
            return await http_exception_handler(request, exc)
        return JSONResponse({"error": {"code": "invalid_request", "message": "body: cannot be read as JSON text",
                                       "field": "body"}}, status_code=400)

    @app.exception_handler(AgentVMError)
    async def _agentvm_error(_request: Request, exc: AgentVMError) -> JSONResponse:
        body: dict[str, Any] = {"error": {"code": exc.code, "message": exc.message}}
        if exc.field:
            body["error"]["field"] = exc.field
        return JSONResponse(body, status_code=exc.http_status)

    @app.get("/health", tags=["ops"])
    async def health() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    if api is not None:
        app.include_router(resources_router(api.resources, api.principal_for))
        if api.services is not None:
            app.include_router(images_router(api.services, api.principal_for))
            # fixed paths (/v1/sessions/search, /v1/sessions/import) before /v1/sessions/{id}
            app.include_router(search_router(api.services, api.principal_for))
            from agentvm.api.archive_http import archive_router

            app.include_router(archive_router(api.services, api.principal_for, api.archive_max_bytes))
            app.include_router(sessions_router(api.services, api.principal_for))
        if api.config is not None:
            app.include_router(config_router(api.config, api.admin_for or api.principal_for))
        if api.keys is not None and api.key_caller is not None:
            from agentvm.api.keys_http import keys_router

            app.include_router(keys_router(api.keys, api.key_caller))
        if api.billing is not None and api.key_caller is not None:
            from agentvm.api.billing_http import billing_router

            app.include_router(billing_router(api.billing, api.key_caller))
        if api.chat is not None:
            from agentvm.api.chat_sse import chat_router

            probe = api.probe
            if probe is None:
                raise ValueError("the chat API needs a store probe for its health check")
            app.include_router(chat_router(api.chat, api.principal_for, probe=probe))
        if api.metrics is not None or api.turn_log is not None:
            from agentvm.api.ops_http import ops_router

            app.include_router(ops_router(api.principal_for, metrics=api.metrics, admin_for=api.admin_for,
                                          turn_log=api.turn_log))
    return app

