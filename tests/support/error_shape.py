"""The error-shape check over every route of an OpenAPI document (issue 19, item 6): an unknown path
answers 404, a wrong method on each route 405 (with `Allow`), a bad body on each route that takes
one 400 naming the field, all in `{"error": {"code", "message", "field"?}}` and in plain words."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

T = TypeVar("T")

# what a message must never show: pydantic's internals
INTERNALS = re.compile(r"constrained-str|Value error|pydantic|errors\.pydantic\.dev|function-after|tagged-union"
                       r"|Input should|\{'type'|detail")
METHODS = ("get", "post", "put", "patch", "delete")


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    body: Any


# (method, path, JSON body or None) → the answer
Call = Callable[[str, str, Any], Awaitable[Answer]]


@dataclass
class Checked:
    """What was checked, to assert the check covered every route (and counted each)."""

    wrong_methods: list[str] = field(default_factory=list)
    bad_bodies: list[str] = field(default_factory=list)
    missing_fields: list[str] = field(default_factory=list)


def without_loop(check: Coroutine[Any, Any, T]) -> T:
    """Run `check` over a `call` that awaits nothing (a Lambda handler, which runs its own loop)."""
    try:
        check.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    check.close()
    raise AssertionError("the check awaited something: use an event loop")


def assert_shape(answer: Answer, status: int, code: str, where: str) -> dict[str, Any]:
    assert answer.status == status, f"{where}: {answer.status} {answer.body}"
    assert isinstance(answer.body, dict) and set(answer.body) == {"error"}, f"{where}: {answer.body}"
    error = answer.body["error"]
    assert set(error) <= {"code", "message", "field"} and error["code"] == code, f"{where}: {error}"
    assert isinstance(error["message"], str) and error["message"], f"{where}: {error}"
    assert not INTERNALS.search(error["message"]), f"{where}: internals in {error['message']!r}"
    return dict(error)


def _template(path: str) -> re.Pattern[str]:
    return re.compile("".join("[^/]+" if part.startswith("{") else re.escape(part)
                              for part in re.split(r"(\{[^}]+\})", path)))


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x1", path)


def json_body_schema(operation: Mapping[str, Any], doc: Mapping[str, Any]) -> dict[str, Any] | None:
    content = operation.get("requestBody", {}).get("content", {})
    schema = content.get("application/json", {}).get("schema")
    if schema is None:
        return None
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return dict(schema)


def http_call(http: Any) -> Call:
    """`call` for `check_every_route` over an httpx.AsyncClient (a JSON body when one is given)."""
    async def call(method: str, path: str, body: Any) -> Answer:
        res = await http.request(method, path, json=body) if body is not None else await http.request(method, path)
        return Answer(res.status_code, res.headers, res.json())

    return call


async def check_every_route(doc: Mapping[str, Any], call: Call) -> Checked:
    checked = Checked()
    unknown = await call("get", "/v1/no-such-route", None)
    error = assert_shape(unknown, 404, "not_found", "unknown path")
    assert error["message"] == "no such route: /v1/no-such-route"
    for path, operations in doc["paths"].items():
        url = concrete(path)
        # every method a route of this concrete path serves (GET /v1/sessions/x1 serves /v1/sessions/import)
        allowed = {m for other, ops in doc["paths"].items() if _template(other).fullmatch(url) for m in ops
                   if m in METHODS}
        wrong = next(m for m in METHODS if m not in allowed) if allowed != set(METHODS) else None
        if wrong is not None:
            where = f"{wrong.upper()} {path}"
            answer = await call(wrong, url, {} if wrong in ("post", "put", "patch") else None)
            error = assert_shape(answer, 405, "method_not_allowed", where)
            allow = {m.strip().lower() for m in answer.headers.get("allow", "").split(",") if m.strip()}
            assert allowed <= allow, f"{where}: Allow {answer.headers.get('allow')!r}, routes {allowed}"
            assert error["message"].startswith(f"{wrong.upper()} is not allowed on {url}; allowed: "), where
            checked.wrong_methods.append(where)
        for method, operation in operations.items():
            schema = json_body_schema(operation, doc)
            if method not in METHODS or schema is None:
                continue
            where = f"{method.upper()} {path}"
            query = "&".join(f"{p['name']}=x1" for p in operation.get("parameters", [])
                             if p.get("in") == "query" and p.get("required"))
            target = f"{url}?{query}" if query else url
            if schema.get("type", "object") == "object":
                error = assert_shape(await call(method, target, [1, 2]), 400, "invalid_request", where)
                assert error.get("field"), f"{where}: {error}"
                if error["field"] == "body":  # FastAPI's validation (a route may read its body itself)
                    assert error["message"] == "body: must be a JSON object", f"{where}: {error}"
                checked.bad_bodies.append(where)
            required = [name for name in schema.get("required", [])]
            if required:
                error = assert_shape(await call(method, target, {}), 400, "invalid_request", where)
                assert error["field"] in required, f"{where}: {error}, required {required}"
                assert error["message"] == f"{error['field']}: is required", f"{where}: {error}"
                checked.missing_fields.append(where)
    return checked
