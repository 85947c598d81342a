"""The FastAPI application: health and the management API (`/v1/resources`; more in later issues).

Errors have one shape everywhere: `{"error": {"code", "message", "field"?}}`, request validation,
unknown routes and wrong methods included (api/http_errors.py). Every request passes the gate first
(api/request_gate.py): its API key, then its body's size, before anything reads the body."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# before FastAPI's first import: its OpenAPI document models are built on first use (a cold-start saving)
import agentvm.api.fastapi_first  # noqa: F401

# isort: split
from fastapi import APIRouter, FastAPI, Request

from agentvm import __version__
from agentvm.api.http_errors import install_error_handlers
from agentvm.api.request_gate import BodyLimit, RequestGate, resolved_once
from agentvm.api.route_groups import BuildRoutes, RouteGroups
from agentvm.domain.models import Principal
from agentvm.errors import AgentVMError, PayloadTooLarge
from agentvm.observability import tracing

if TYPE_CHECKING:
    from agentvm.ports import Store
    from agentvm.services.agent_models import AgentModels
    from agentvm.services.billing import BillingService
    from agentvm.services.chat import ChatService
    from agentvm.services.config import ConfigService
    from agentvm.services.keys import Caller, KeyService
    from agentvm.services.metrics import TurnMetrics
    from agentvm.services.resources import ResourceService
    from agentvm.services.token_gateway import TokenGateway
    from agentvm.services.use_cases import UseCases


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
    services: Callable[[], UseCases] | None = None
    # the SSE chat API (/api/v1): the services with a feed of session events, and a cheap store read
    # for its health check
    chat: Callable[[], ChatService] | None = None
    probe: Callable[[], Awaitable[object]] | None = None
    # the largest session archive /v1/sessions/import accepts (None: AVM_ARCHIVE_MAX_BYTES), and
    # where it is spooled while it arrives (None: the system's temporary directory)
    archive_max_bytes: int | None = None
    spool_dir: Path | None = None
    # the largest body of any other request (None: AVM_HTTP_MAX_BODY_BYTES)
    max_body_bytes: int | None = None
    # origins whose browser pages may call this API (None: AVM_CORS_ORIGINS; empty: none)
    cors_origins: Sequence[str] | None = None
    # /v1/auth/keys: the key store's service, and who manages keys (a tenant, admin or not)
    keys: Callable[[], KeyService] | None = None
    key_caller: Callable[[Request], Awaitable[Caller]] | None = None
    # /v1/budgets and /v1/usage (with `key_caller`: who changes budgets)
    billing: Callable[[], BillingService] | None = None
    # observability (docs/observability.md): this process's turn metrics (/v1/metrics; /metrics with
    # `admin_for`), and the store whose turn log /v1/logs reads
    metrics: Callable[[], TurnMetrics] | None = None
    turn_log: Callable[[], Store] | None = None
    # the web console's files (docs/console.md), served under /console/ without a key (None: no console)
    console_dir: Path | None = None
    console_auth: str = "keys"  # "open": the console signs in without a key (avm serve's open mode)
    # fields /health adds (avm serve: whether it runs open, and the tool sandbox when it does not
    # isolate, docs/security.md)
    health_extra: Callable[[], dict[str, Any]] | None = None
    # what is wrong now (avm serve: storage failures); any → /health says "degraded" and lists them
    health_problems: Callable[[], Awaitable[list[str]]] | None = None
    # the token API (docs/token-api.md): OpenAI- and Anthropic-compatible routes over the model
    # catalog, and their caller (a key from `Authorization: Bearer` or `x-api-key`)
    token_gateway: Callable[[], TokenGateway] | None = None
    token_caller: Callable[[Request], Awaitable[Principal]] | None = None
    token_max_body_bytes: int | None = None  # None: AVM_TOKEN_API_MAX_BODY_BYTES
    # `model: "agent/<imageId>"` on the token API: a turn of the caller's image (None: not served)
    agent_models: Callable[[], AgentModels] | None = None


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


HEALTH_ANSWER: dict[str, Any] = {"description": "Always 200: `status` says whether anything is wrong", "content": {
    "application/json": {"schema": {"type": "object", "required": ["status", "version"], "properties": {
        "status": {"type": "string", "enum": ["ok", "degraded"]}, "version": {"type": "string"},
        "problems": {"type": "array", "items": {"type": "string"}, "description": "what is wrong, when degraded"}},
        "additionalProperties": True}}}}


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


def _limit(value: int | None, setting: str) -> Callable[[], int]:
    """A body limit: `value`, or (None) the setting of the environment, read once when first needed."""
    known: list[int] = [] if value is None else [value]

    def limit() -> int:
        if not known:
            from agentvm.config import Settings

            known.append(int(getattr(Settings(), setting)))
        return known[0]

    return limit


def _body_too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"body: larger than this server's limit of {limit} bytes (AVM_HTTP_MAX_BODY_BYTES)",
                           field="body")


# the token API's routes that take a request body (docs/token-api.md)
# the session archive's import (api/archive_http.py IMPORT_PATH): its own body limit
ARCHIVE_IMPORT_PATH = "/v1/sessions/import"
TOKEN_PATHS = ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens")
# the latency-bound token routes, called by the gate itself (docs/benchmarks.md, token API overhead)
DIRECT_PATHS = ("/v1/chat/completions", "/v1/responses", "/v1/messages")


def _token_body_too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"body: larger than this server's limit of {limit} bytes for the token API "
                           "(AVM_TOKEN_API_MAX_BODY_BYTES)", field="body")


def _public_paths(app: FastAPI) -> set[str]:
    """What needs no API key: the health checks and the API's description."""
    paths = {"/health", app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url}
    return {path for path in paths if path}


def create_app(*, lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
               api: HttpApi | None = None) -> FastAPI:
    # FastAPI's own HTTP request and WebSocket spans, on agentvm's provider when OTEL_* turn tracing on
    app = FastAPI(title="AgentVM", version=__version__, lifespan=lifespan, telemetry=tracing.fastapi_telemetry(),
                  description="AgentVM management API. The AgentX WebSocket protocol is served on /ws.")

    groups = RouteGroups(app)  # the routers, built when a request first needs them (api/route_groups.py)
    install_error_handlers(app, lambda: [*app.routes, *groups.routes])

    body_limit = _limit(api.max_body_bytes if api else None, "http_max_body_bytes")
    archive_limit = _limit(api.archive_max_bytes if api else None, "archive_max_bytes")
    principal_for: Callable[[Request], Awaitable[Principal]] | None = None
    callers: list[Callable[[Request], Awaitable[Any]]] = []
    limits: dict[str, BodyLimit] = {}  # by route path; any other route: `body_limit`
    direct: tuple[str, ...] = ()  # routes the gate calls itself (request_gate.py, point 3)

    # its answer's schema declared rather than read from the annotation: a route without a validated
    # parameter or answer is built without pydantic (built at start-up, unlike the route groups)
    @app.get("/health", tags=["ops"], response_model=None, responses={200: HEALTH_ANSWER})
    async def health() -> dict[str, Any]:
        answer: dict[str, Any] = {"status": "ok", "version": __version__}
        if api is not None and api.health_extra is not None:
            answer.update(api.health_extra())
        if api is not None and api.health_problems is not None and (problems := await api.health_problems()):
            answer["status"] = "degraded"
            answer["problems"] = [*answer.get("problems", []), *problems]
        return answer

    if api is not None:
        # every caller dependency runs once per request: first in the gate, before the body is read
        principal_for = resolved_once(api.principal_for)
        admin_for = None if api.admin_for is None else resolved_once(api.admin_for)
        key_caller = None if api.key_caller is None else resolved_once(api.key_caller)
        callers = [c for c in (principal_for, admin_for, key_caller) if c is not None]
        _add_groups(groups, api, principal_for, admin_for, key_caller, archive_limit)
        if api.token_gateway is not None and api.token_caller is not None:
            token_limit = BodyLimit(_limit(api.token_max_body_bytes, "token_api_max_body_bytes"), _token_body_too_large)
            for path in TOKEN_PATHS:
                limits[path] = token_limit
            if not tracing.enabled():  # FastAPI's own request spans come from the layers skipped
                direct = DIRECT_PATHS
        if api.services is not None:
            limits[ARCHIVE_IMPORT_PATH] = BodyLimit(archive_limit, _archive_too_large)
    app.openapi = _with_every_route(app, groups)  # type: ignore[method-assign]
    app.add_middleware(RequestGate, routes=lambda: groups.routes, public=_public_paths(app), callers=callers,
                       default_caller=principal_for,
                       default_limit=BodyLimit(body_limit, _body_too_large),
                       limits=limits, direct=direct)
    app.add_middleware(BuildRoutes, groups=groups)  # outside the gate: it authenticates by the routes
    origins = list(api.cors_origins) if api is not None and api.cors_origins is not None else _env_origins()
    if origins:  # added last, so outermost: a preflight (no key) is answered before the gate asks for one
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=CORS_METHODS,
                           allow_headers=CORS_HEADERS, expose_headers=CORS_EXPOSED, max_age=600)
    return app


def _with_every_route(app: FastAPI, groups: RouteGroups) -> Callable[[], dict[str, Any]]:
    """The app's OpenAPI document: of every route (each group built), its errors declared."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            groups.build_all()
            _declare_errors(generate())  # generate() keeps the document in app.openapi_schema
        return app.openapi_schema or {}

    return openapi


def _add_groups(groups: RouteGroups, api: HttpApi, principal_for: Callable[[Request], Awaitable[Principal]],
                admin_for: Callable[[Request], Awaitable[Principal]] | None,
                key_caller: Callable[[Request], Awaitable[Caller]] | None, archive_limit: Callable[[], int]) -> None:
    """Each router of `api`, with the paths it serves (built on first use: api/route_groups.py)."""
    token_gateway, token_caller, services = api.token_gateway, api.token_caller, api.services
    if token_gateway is not None and token_caller is not None:
        # each route reads its caller itself (no gate caller): its errors are in its vendor's shape.
        # First: the router tries its routes in order, and these are the latency-bound ones
        def token_api() -> list[APIRouter]:
            from agentvm.api.anthropic_http import anthropic_router
            from agentvm.api.openai_http import openai_router
            from agentvm.api.openai_responses import responses_router

            return [openai_router(token_gateway, token_caller, api.agent_models),
                    responses_router(token_gateway, token_caller),
                    anthropic_router(token_gateway, token_caller, api.agent_models)]

        groups.add(("/v1/models", "/v1/chat/completions", "/v1/responses", "/v1/messages"), token_api)

    def resources() -> list[APIRouter]:
        from agentvm.api.resources_http import resources_router

        return [resources_router(api.resources, principal_for)]

    groups.add(("/v1/resources",), resources)
    if services is not None:  # a session host's (avm serve, chat_stream); http_api never loads them
        def sessions() -> list[APIRouter]:
            from agentvm.api.archive_http import IMPORT_PATH, archive_router
            from agentvm.api.images_http import images_router
            from agentvm.api.search_http import search_router
            from agentvm.api.sessions_http import sessions_router

            if IMPORT_PATH != ARCHIVE_IMPORT_PATH:
                raise ValueError(f"the archive import's body limit is set on {ARCHIVE_IMPORT_PATH}, not {IMPORT_PATH}")
            # fixed paths (/v1/sessions/search, /v1/sessions/import) before /v1/sessions/{id}
            return [images_router(services, principal_for), search_router(services, principal_for),
                    archive_router(services, principal_for, archive_limit, api.spool_dir),
                    sessions_router(services, principal_for)]

        groups.add(("/v1/definitions", "/v1/images", "/v1/sessions", "/v1/turns"), sessions)
    if api.config is not None:
        config = api.config

        def config_api() -> list[APIRouter]:
            from agentvm.api.config_http import config_router

            return [config_router(config, admin_for or principal_for)]

        groups.add(("/v1/config",), config_api)
    if api.keys is not None and key_caller is not None:
        keys, keys_caller = api.keys, key_caller

        def keys_api() -> list[APIRouter]:
            from agentvm.api.keys_http import keys_router

            return [keys_router(keys, keys_caller)]

        groups.add(("/v1/auth",), keys_api)
    if api.billing is not None and key_caller is not None:
        billing, billing_caller = api.billing, key_caller

        def billing_api() -> list[APIRouter]:
            from agentvm.api.billing_http import billing_router

            return [billing_router(billing, billing_caller)]

        groups.add(("/v1/budgets", "/v1/usage"), billing_api)
    if api.chat is not None:
        chat, probe = api.chat, api.probe
        if probe is None:
            raise ValueError("the chat API needs a store probe for its health check")

        def chat_api() -> list[APIRouter]:
            from agentvm.api.chat_sse import chat_router

            return [chat_router(chat, principal_for, probe=probe)]

        groups.add(("/api/v1",), chat_api)
    if api.metrics is not None or api.turn_log is not None:
        def ops_api() -> list[APIRouter]:
            from agentvm.api.ops_http import ops_router

            return [ops_router(principal_for, metrics=api.metrics, admin_for=admin_for, turn_log=api.turn_log)]

        groups.add(("/v1/metrics", "/v1/logs", "/metrics"), ops_api)
    if api.console_dir is not None:
        console_dir = api.console_dir

        def console() -> list[APIRouter]:
            from agentvm.api.console_http import console_router

            return [console_router(console_dir, auth=api.console_auth)]

        groups.add(("/", "/console"), console)


def _archive_too_large(limit: int) -> AgentVMError:
    from agentvm.services.session_archive import too_large

    return too_large(limit)


CORS_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]
CORS_HEADERS = ["authorization", "content-type", "last-event-id", "x-request-id",
                "x-agentvm-session-id"]  # the token API's agent models: the session to continue
# answer headers a page may read: the token API's cost, call, and an agent model's session and turn
CORS_EXPOSED = ["retry-after", "x-request-id", "x-agentvm-cost-usd", "x-agentvm-call-id", "x-agentvm-session-id",
                "x-agentvm-turn-id"]


def _env_origins() -> list[str]:
    # Settings is built only when the variable is set: http_api creates its app at
    # import, on the Lambda cold path, and most deployments allow no origin
    from agentvm.config import Settings, cors_origin_list

    return cors_origin_list(Settings().cors_origins) if os.environ.get("AVM_CORS_ORIGINS") else []

