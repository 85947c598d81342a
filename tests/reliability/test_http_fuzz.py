"""HTTP fuzzing (the reliability issue): schemathesis generates requests from `avm serve`'s OpenAPI
document, valid ones and invalid ones, for every operation, and sends them to the ASGI app in-process
(the scripted driver), twice: in open local mode (no keys), and with keys required, every request
carrying a key with the admin and operator scopes (together they reach every route): no response
is a 5xx, every status is one the operation declares (the error statuses are declared centrally:
agentvm/api/http_app.py), its content type is a declared one, and its body matches the schema
declared for that status (an SSE stream: each event). Each operation is also fuzzed with ids that
exist (an image, its session with a finished turn, a resource, a key), to reach past the 404s.

Nothing is excluded: the SSE endpoints stream turns of the scripted driver, which end at once, and a
stream that would not end is cut by the request timeout. Not the pytest integration of schemathesis
(`schemathesis.pytest.from_fixture`): its loader sets `request.node._nodeid`, which pytest 9 no
longer has; each operation gets a hypothesis run of its own here, and every failing one is reported.

Deterministic; FUZZ_SCALE=<n> multiplies the examples per operation (20 in `make test`)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from agentvm.adapters.local.sqlite_keys import SqliteKeys
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.auth.api_keys import new_key
from agentvm.config import Settings
from agentvm.drivers.scripted import ScriptedDriver
from avm.app import build_runtime

SCALE = max(1, int(os.environ.get("FUZZ_SCALE", "1")))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# a turn started by a fuzzed request (the SSE chat API, execute) ends at once with the scripted
# driver; a stream that would not end (a resumed turn that never finishes) is cut by the timeout
REQUEST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Target:
    schema: schemathesis.BaseSchema
    headers: dict[str, str]  # on every request


async def _operator_token(data_dir: Path) -> str:
    """An admin and operator key in the database, written before the server starts (as `avm keys create`)."""
    store = SqliteStore(data_dir / "agentvm.db")
    await store.open()
    try:
        key, token = new_key("fuzz-tenant", ("admin", "operator"), name="fuzz")
        await SqliteKeys(store).put_key(key)
    finally:
        await store.close()
    return token


@pytest.fixture(scope="module", params=["open", "keys"])
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    data_dir: Path = tmp_path_factory.mktemp(f"http-fuzz-{request.param}") / "d"
    headers = {}
    if request.param == "keys":
        data_dir.mkdir(parents=True)
        headers = {"Authorization": f"Bearer {asyncio.run(_operator_token(data_dir))}"}
    rt = build_runtime(Settings(data_dir=data_dir, auth=request.param), driver=ScriptedDriver())
    schema = schemathesis.openapi.from_asgi("/openapi.json", rt.app)  # starts the app's lifespan
    try:
        yield Target(schema, headers)
    finally:
        asgi.shutdown_lifespans()


def seed(app: object, headers: dict[str, str]) -> dict[str, str]:
    """Objects that exist (an image with its session and a finished turn, a resource, a key), by the
    names of the parameters that take their ids."""
    with asgi.get_client(app) as http:
        http.headers.update(headers)
        image = http.post("/v1/images", json={"containerId": "fuzz"}).json()
        resource = http.post("/v1/resources", json={"kind": "prompt", "name": f"fuzz-{next(SEEDS)}",
                                                    "version": "1.0.0", "content": {"text": "hi"}}).json()
        key = http.post("/v1/auth/keys", json={"name": "fuzz"}).json()
        sent = http.post(f"/v1/sessions/{image['sessionId']}/messages", json={"content": "hello"})
        assert sent.status_code == 202, sent.text
    return {"image_id": image["imageId"], "session_id": image["sessionId"], "resource_id": resource["resourceId"],
            "key_id": key["keyId"], "key": "llm.model", "name": "chat_basic", "agent_id": "chat_basic"}


SEEDS = itertools.count()
QUERY_SEEDED = {"GET /api/v1/chat/history": ["session_id"], "GET /api/v1/chat/stream": ["session_id"]}

FUZZ = settings(max_examples=20 * SCALE, derandomize=True, deadline=None, database=None, print_blob=False,
                suppress_health_check=list(HealthCheck))


def test_no_server_error_and_every_response_as_declared(target: Target) -> None:
    failures: list[str] = []
    tried = 0
    for result in target.schema.get_all_operations():
        operation = result.ok()
        known = seed(target.schema.app, target.headers)  # afresh for each operation: an earlier one may have
        # deleted them
        names = re.findall(r"{(\w+)}", operation.path)
        fixed = {name: known[name] for name in names if name in known}
        query = {name: known[name] for name in QUERY_SEEDED.get(operation.label, ())}
        strategy = st.one_of(
            *(operation.as_strategy(generation_mode=mode) for mode in GenerationMode),
            # the same with ids that exist: the operations' deeper paths, not only their 404s
            *(operation.as_strategy(generation_mode=mode, path_parameters=fixed or None, query=query or None)
              for mode in GenerationMode if fixed or query))

        @FUZZ
        @given(case=strategy)
        def fuzz(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=CHECKS, timeout=REQUEST_TIMEOUT_S, headers=target.headers)

        try:
            fuzz()
        except (Exception, FailureGroup) as exc:  # a FailureGroup is a BaseExceptionGroup
            failures.append(f"{operation.label}: {exc}")
        tried += 1
    assert tried >= 40
    assert not failures, "\n\n".join(failures)


HUGE = "9" * 30
CURSOR = base64.urlsafe_b64encode(f"{HUGE}#turn_x".encode()).decode().rstrip("=")


@pytest.mark.parametrize(("path", "headers", "field"), [
    (f"/v1/turns?since={HUGE}", {}, "since"),
    (f"/v1/turns?until={HUGE}", {}, "until"),
    (f"/v1/turns?cursor={CURSOR}", {}, "cursor"),
    (f"/v1/usage?until={HUGE}", {}, "until"),
    (f"/v1/logs?since={HUGE}", {}, "since"),
    (f"/v1/logs?cursor={CURSOR}", {}, "cursor"),
    ("/api/v1/chat/stream?session_id=sess_x", {"Last-Event-ID": HUGE}, "Last-Event-ID"),
    (f"/api/v1/chat/stream?session_id=sess_x&last_event_id={HUGE}", {}, "Last-Event-ID"),
    ("/v1/usage?period=9999-12", {}, "period"),
    ("/v1/usage/export?period=9999-12-31", {}, "period"),
])
def test_what_the_fuzzing_found_is_refused_not_a_crash(target: Target, path: str, headers: dict[str, str],
                                                       field: str) -> None:
    """Each was a 500 (an integer past SQLite's 64 bits; a year past 9999), or a 200 whose stream broke
    off (a resumed SSE turn, an export)."""
    with asgi.get_client(target.schema.app) as http:
        got = http.get(path, headers={**target.headers, **headers})
    assert got.status_code == 400, got.text
    assert got.json()["error"]["field"] == field, got.text
