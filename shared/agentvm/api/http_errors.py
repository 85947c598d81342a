"""The HTTP API's one error shape, `{"error": {"code", "message", "field"?}}`, for every answer that
is not a success: request validation (400, the field named by its JSON path, `messages[0].content`),
Starlette's own answers (an unknown path 404, a wrong method 405 with its `Allow` header, a body it
cannot read 400) and the application's errors (`AgentVMError`).

Validation messages are said in plain words ("text: must not be empty"): pydantic's own texts carry
its internals (`Value error, …`, a union member's tag such as `constrained-str` in the location, a
link to errors.pydantic.dev), which a person cannot act on."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from agentvm.api.plain_errors import json_path, plain_message
from agentvm.api.request_gate import error_response
from agentvm.errors import AgentVMError

# codes of Starlette's own answers; any other status keeps the class of AgentVMError's codes
HTTP_CODES: Mapping[int, str] = {400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                                 405: "method_not_allowed", 409: "conflict", 413: "payload_too_large",
                                 415: "unsupported_media_type", 429: "rate_limited", 503: "not_configured"}


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if field:
        error["field"] = field
    return {"error": error}


def install_error_handlers(app: FastAPI, routes: Callable[[], Sequence[BaseRoute]]) -> None:
    """Answer every error of `app` in the one shape. `routes`: every route of `app` with its methods
    (routers included by FastAPI are not plain routes of `app.router`), for a 405's `Allow`."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        field, message = validation_problem(exc.errors(), getattr(exc, "body", None))
        return JSONResponse(error_body("invalid_request", f"{field}: {message}" if field else message, field),
                            status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        code = HTTP_CODES.get(status, "internal_error" if status >= 500 else "invalid_request")
        field: str | None = None
        headers = exc.headers
        if status == 404 and exc.detail == "Not Found":  # Starlette's router: no route has this path
            message = f"no such route: {request.url.path[:200]}"
        elif status == 405:
            # Starlette's Allow names only the first route of the path: every route's methods are allowed
            allowed = ", ".join(_allowed_methods(request.scope, routes()))
            headers = {**(exc.headers or {}), "allow": allowed}
            headers.pop("Allow", None)
            message = f"{request.method} is not allowed on {request.url.path[:200]}; allowed: {allowed}"
        elif status == 400:  # FastAPI's answer to a body it cannot read (not UTF-8: not JSON either)
            message, field = "body: cannot be read as JSON text", "body"
        else:
            message = str(exc.detail) if isinstance(exc.detail, str) and exc.detail else f"HTTP {status}"
        return JSONResponse(error_body(code, message, field), status_code=status, headers=headers)

    @app.exception_handler(AgentVMError)
    async def _agentvm_error(_request: Request, exc: AgentVMError) -> JSONResponse:
        return error_response(exc)


def _allowed_methods(scope: Scope, routes: Sequence[BaseRoute]) -> list[str]:
    methods: set[str] = set()
    for route in routes:
        route_methods = getattr(route, "methods", None)
        if route_methods and route.matches({**scope, "method": next(iter(route_methods))})[0] is Match.FULL:
            methods |= set(route_methods)
    return sorted(methods)


def validation_problem(errors: Sequence[Any], body: Any) -> tuple[str, str]:
    """The problem of a validation to report: its field's JSON path ('' for the whole body) and what is
    wrong with it, in plain words."""
    if not errors:
        return "", "the request is not valid"
    if errors[0].get("type") == "json_invalid":  # its location is a character position, not a field
        return "body", "is not valid JSON"
    # a union's members each add an error: the deepest is the member the input was meant for
    paths = [json_path(error.get("loc", ()), body) for error in errors]
    best = max(range(len(errors)), key=lambda i: (paths[i].count(".") + paths[i].count("["), -i))
    return paths[best], plain_message(errors[best])
