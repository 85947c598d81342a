"""Tenant isolation on `avm serve`, route by route and command by command.

Tenant A makes one of everything (a container, images, sessions, a turn, prompt/tool/knowledge/agent
resources, keys with a budget, an exported archive). Tenant B (an admin key) and tenant C (a user
key) then call every HTTP route, and B sends every WebSocket command, with A's ids, and the same
call with ids that exist nowhere: the two answers must be the same (status, error code, message but
for the id itself), their answers must hold none of A's ids, and A's data must be unchanged
afterwards (docs/tenancy.md: "another tenant's id answers exactly like an id that does not exist").
Requests without a valid key (none, malformed, unknown, wrong secret, revoked, expired, in the URL)
are refused on every route that has a tenant, and on the WebSocket.

The tables below name how to call each route and command. A route or command the tables do not
cover fails `test_the_tables_cover_every_route_and_command`: a new route needs a row here (or a
place in the allow-lists, with the reason)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import string
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, APIWebSocketRoute
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from agentvm import ids as new_id
from agentvm.adapters.local.sqlite_keys import SqliteKeys
from agentvm.auth.api_keys import OPERATOR_ONLY, new_key
from agentvm.config import Settings
from agentvm.drivers.scripted import ScriptedDriver
from agentvm.ids import now_ms
from agentvm.protocol.commands import COMMANDS
from avm.app import build_runtime
from tests.support.servers import InProcess, in_process
from tests.support.stock_client import StockClient

JSON = dict[str, Any]
Route = tuple[str, str]  # (method, path template)


# ---- ids ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ids:
    """One tenant's ids and names, or ghosts: ids of the same kinds that exist nowhere."""

    tenant: str
    container: str
    image: str  # made over the WebSocket, with a turn
    session: str  # its primary session
    session2: str  # a second session of it
    image2: str  # built over HTTP from the agent resource
    agent: str
    turn: str
    message: str
    prompt: str  # resource ids
    tool: str
    knowledge: str
    agent_def: str
    prompt_name: str  # resource names
    tool_name: str
    knowledge_name: str
    agent_name: str
    key: str  # API key ids: a user key with a budget
    admin_key: str  # and the admin key every call of A's is made with
    word: str  # a word only this tenant's messages hold

    def values(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def ghost() -> Ids:
    tag = secrets.token_hex(4)
    letters = "".join(secrets.choice(string.ascii_lowercase) for _ in range(10))
    return Ids(tenant=f"tenant-ghost-{tag}", container=f"ghost-box-{tag}", image=new_id.image_id(),
               session=new_id.session_id(), session2=new_id.session_id(), image2=new_id.image_id(),
               agent=new_id.agent_id(), turn=new_id.turn_id(), message=new_id.message_id(),
               prompt=new_id.resource_id(), tool=new_id.resource_id(), knowledge=new_id.resource_id(),
               agent_def=new_id.resource_id(), prompt_name=f"ghost-prompt-{tag}", tool_name=f"ghost-tool-{tag}",
               knowledge_name=f"ghost-kb-{tag}", agent_name=f"ghost-agent-{tag}", key=f"avmk_{secrets.token_hex(6)}",
               admin_key=f"avmk_{secrets.token_hex(6)}", word=f"quokka{letters}")


@dataclass(frozen=True)
class Own:
    """B's own things, for calls that mix them with A's ids (B's image with A's session)."""

    container: str
    image: str
    session: str
    archive: bytes


# ---- the HTTP table -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Req:
    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] | None = None

    def carries(self) -> str:
        """Where the ids it sends are (the archive body holds B's own ids only)."""
        return json.dumps([self.path, self.params, self.json, self.headers])


Build = Callable[[Ids, Own], Req]


@dataclass(frozen=True)
class Late:
    """A call that makes something of B's under one of A's names (a container, a resource name):
    run after every other call, so that it cannot change what they find."""

    build: Build


def this_month() -> str:
    return time.strftime("%Y-%m", time.gmtime())


def get(path: str, **params: Any) -> Req:
    return Req("GET", path, params=params or None)


ARCHIVE_HEADERS = {"content-type": "application/json"}

# (method, path) → the calls to make, each with A's ids and with ghosts
TABLE: dict[Route, list[Build | Late]] = {
    # definitions and images
    ("GET", "/v1/definitions"): [lambda t, me: get("/v1/definitions")],
    ("GET", "/v1/definitions/{name}"): [lambda t, me: get(f"/v1/definitions/{t.agent_name}")],
    ("POST", "/v1/images"): [
        lambda t, me: Req("POST", "/v1/images", json={"containerId": me.container,
                                                      "agent": f"resource://agents/{t.agent_name}"}),
        lambda t, me: Req("POST", "/v1/images", json={"containerId": me.container, "config": {
            "systemPrompt": f"resource://prompts/{t.prompt_name}@^1"}}),
        lambda t, me: Req("POST", "/v1/images", json={"containerId": me.container, "config": {
            "tools": [f"resource://tools/{t.tool_name}"]}}),
        Late(lambda t, me: Req("POST", "/v1/images", json={"containerId": t.container, "config": {"name": "B's"}})),
    ],
    ("GET", "/v1/images"): [lambda t, me: get("/v1/images"),
                            lambda t, me: get("/v1/images", containerId=t.container)],
    ("GET", "/v1/images/{image_id}"): [lambda t, me: get(f"/v1/images/{t.image}"),
                                       lambda t, me: get(f"/v1/images/{t.image2}")],
    ("DELETE", "/v1/images/{image_id}"): [lambda t, me: Req("DELETE", f"/v1/images/{t.image}"),
                                          lambda t, me: Req("DELETE", f"/v1/images/{t.image2}")],
    # sessions
    ("GET", "/v1/images/{image_id}/sessions"): [lambda t, me: get(f"/v1/images/{t.image}/sessions")],
    ("POST", "/v1/images/{image_id}/sessions"): [
        lambda t, me: Req("POST", f"/v1/images/{t.image}/sessions", json={"title": "B's"})],
    ("GET", "/v1/sessions"): [lambda t, me: get("/v1/sessions"), lambda t, me: get("/v1/sessions", imageId=t.image)],
    ("GET", "/v1/sessions/search"): [lambda t, me: get("/v1/sessions/search", q=t.word)],
    ("POST", "/v1/sessions/import"): [
        Late(lambda t, me: Req("POST", "/v1/sessions/import", params={"containerId": t.container},
                               content=me.archive, headers=ARCHIVE_HEADERS))],
    ("GET", "/v1/sessions/{session_id}/export"): [lambda t, me: get(f"/v1/sessions/{t.session}/export"),
                                                  lambda t, me: get(f"/v1/sessions/{t.session2}/export")],
    ("GET", "/v1/sessions/{session_id}"): [lambda t, me: get(f"/v1/sessions/{t.session}"),
                                           lambda t, me: get(f"/v1/sessions/{t.session2}")],
    ("DELETE", "/v1/sessions/{session_id}"): [lambda t, me: Req("DELETE", f"/v1/sessions/{t.session}"),
                                              lambda t, me: Req("DELETE", f"/v1/sessions/{t.session2}")],
    ("GET", "/v1/sessions/{session_id}/messages"): [lambda t, me: get(f"/v1/sessions/{t.session}/messages"),
                                                    lambda t, me: get(f"/v1/sessions/{t.session2}/messages")],
    ("POST", "/v1/sessions/{session_id}/messages"): [
        lambda t, me: Req("POST", f"/v1/sessions/{t.session}/messages", json={"content": "hello"}),
        lambda t, me: Req("POST", f"/v1/sessions/{t.session2}/messages", json={"content": "hello"})],
    ("GET", "/v1/sessions/{session_id}/turns"): [lambda t, me: get(f"/v1/sessions/{t.session}/turns")],
    ("GET", "/v1/turns"): [lambda t, me: get("/v1/turns")],
    # resources
    ("POST", "/v1/resources"): [
        lambda t, me: Req("POST", "/v1/resources", json={
            "kind": "agent", "name": "b-agent", "version": "1.0.0",
            "content": {"knowledge": [f"resource://knowledge/{t.knowledge_name}@^1"]},
            "dependencies": [f"resource://knowledge/{t.knowledge_name}@^1"]}),
        # names are per tenant: A's name is free for B (a conflict would tell B that A has it)
        Late(lambda t, me: Req("POST", "/v1/resources", json={"kind": "prompt", "name": t.prompt_name,
                                                              "version": "1.0.0", "content": {"text": "B's"}})),
    ],
    ("GET", "/v1/resources"): [lambda t, me: get("/v1/resources"),
                               lambda t, me: get("/v1/resources", name=t.prompt_name),
                               lambda t, me: get("/v1/resources", q=t.knowledge_name, kind="knowledge")],
    ("GET", "/v1/resources/resolve"): [
        lambda t, me: get("/v1/resources/resolve", uri=f"resource://prompts/{t.prompt_name}"),
        lambda t, me: get("/v1/resources/resolve", uri=f"resource://knowledge/{t.knowledge_name}@1.0.0"),
        lambda t, me: get("/v1/resources/resolve", uri=f"resource://agents/{t.agent_name}@^1")],
    ("GET", "/v1/resources/{resource_id}"): [lambda t, me: get(f"/v1/resources/{t.prompt}"),
                                             lambda t, me: get(f"/v1/resources/{t.tool}"),
                                             lambda t, me: get(f"/v1/resources/{t.knowledge}", version="1.0.0"),
                                             lambda t, me: get(f"/v1/resources/{t.agent_def}")],
    ("PUT", "/v1/resources/{resource_id}"): [
        lambda t, me: Req("PUT", f"/v1/resources/{t.prompt}", json={"version": "9.0.0", "content": {"text": "B"}})],
    ("DELETE", "/v1/resources/{resource_id}"): [
        lambda t, me: Req("DELETE", f"/v1/resources/{t.knowledge}"),
        lambda t, me: Req("DELETE", f"/v1/resources/{t.prompt}", params={"force": "true"})],
    # keys
    ("GET", "/v1/auth/keys"): [lambda t, me: get("/v1/auth/keys")],
    ("POST", "/v1/auth/keys"): [lambda t, me: Req("POST", "/v1/auth/keys", json={"name": "B's"})],
    ("DELETE", "/v1/auth/keys/{key_id}"): [lambda t, me: Req("DELETE", f"/v1/auth/keys/{t.key}"),
                                           lambda t, me: Req("DELETE", f"/v1/auth/keys/{t.admin_key}")],
    # the SSE chat API
    ("POST", "/api/v1/chat/completions"): [
        lambda t, me: Req("POST", "/api/v1/chat/completions", json={"session_id": t.session, "message": "hi"}),
        lambda t, me: Req("POST", "/api/v1/chat/completions", json={"agent_type": t.agent_name, "message": "hi"}),
        lambda t, me: Req("POST", "/api/v1/chat/completions", json={
            "agent_type": f"resource://agents/{t.agent_name}", "message": "hi"}),
        lambda t, me: Req("POST", "/api/v1/chat/completions", json={"session_id": t.session, "message": "hi"},
                          headers={"Last-Event-ID": "0"})],
    ("GET", "/api/v1/chat/stream"): [lambda t, me: get("/api/v1/chat/stream", session_id=t.session)],
    ("GET", "/api/v1/chat/history"): [lambda t, me: get("/api/v1/chat/history", session_id=t.session),
                                      lambda t, me: get("/api/v1/chat/history", session_id=t.session2)],
    ("GET", "/api/v1/agents"): [lambda t, me: get("/api/v1/agents")],
    ("GET", "/api/v1/agents/{agent_id}"): [lambda t, me: get(f"/api/v1/agents/{t.agent_name}")],
    ("POST", "/api/v1/agents/{agent_id}/execute"): [
        lambda t, me: Req("POST", f"/api/v1/agents/{t.agent_name}/execute", json={"task": "hi"}),
        lambda t, me: Req("POST", "/api/v1/agents/chat_basic/execute", json={"task": "hi", "session_id": t.session})],
    # observability, usage and budgets (issue 7; optional below until they land)
    ("GET", "/v1/metrics"): [lambda t, me: get("/v1/metrics")],
    ("GET", "/v1/logs"): [lambda t, me: get("/v1/logs"), lambda t, me: get("/v1/logs", containerId=t.container),
                          lambda t, me: get("/v1/logs", turnId=t.turn)],
    # (unknown parameters naming A's things are sent too: a filter added later must not reach A's)
    ("GET", "/v1/usage"): [
        lambda t, me: get("/v1/usage", groupBy="tenant,container,model,day,key,kind"),
        lambda t, me: get("/v1/usage", containerId=t.container, imageId=t.image, sessionId=t.session,
                          tenantId=t.tenant)],
    ("GET", "/v1/usage/export"): [
        lambda t, me: get("/v1/usage/export", period=this_month()),
        lambda t, me: get("/v1/usage/export", period=this_month(), format="jsonl", containerId=t.container,
                          tenantId=t.tenant)],
    ("GET", "/v1/budgets"): [lambda t, me: get("/v1/budgets"), lambda t, me: get("/v1/budgets", tenantId=t.tenant)],
    ("PUT", "/v1/budgets"): [
        lambda t, me: Req("PUT", "/v1/budgets", json={"keyId": t.key, "monthlyBudget": "5.00"}),
        lambda t, me: Req("PUT", "/v1/budgets", json={"monthlyBudget": "7.00"})],  # B's own
    ("DELETE", "/v1/budgets"): [lambda t, me: Req("DELETE", "/v1/budgets", params={"keyId": t.key})],
}

# routes with no tenant and no key: what they answer is the same for everyone
TENANTLESS: dict[Route, str] = {
    ("GET", "/health"): "liveness: the version only",
    ("GET", "/api/v1/health"): "liveness of the chat API and its store: the version and ok/degraded only",
    ("GET", "/"): "a redirect to the web console",
    ("GET", "/console"): "a redirect to the web console",
    ("GET", "/console/{path:path}"): "the web console's static files: no tenant's data (docs/console.md)",
}
# what each of them answers without a key: (the path asked, the status)
TENANTLESS_ANSWERS: dict[Route, tuple[str, int]] = {
    ("GET", "/"): ("/", 307), ("GET", "/console"): ("/console", 307),
    ("GET", "/console/{path:path}"): ("/console/js/app.js", 200),
}

# the deployment's, not a tenant's (docs/configuration.md, docs/tenancy.md): only an operator key
# (`avm keys create --scope operator`); a tenant's user or admin key is refused (403), so no tenant
# changes what every tenant runs with (defaults.markup) or reads another's key ids in the audit.
DEPLOYMENT: dict[Route, Req] = {
    ("GET", "/v1/config"): get("/v1/config"),
    ("GET", "/v1/config/audit"): get("/v1/config/audit"),
    ("GET", "/v1/config/{key}"): get("/v1/config/llm.maxTokens"),
    ("PUT", "/v1/config/{key}"): Req("PUT", "/v1/config/llm.maxTokens", json={"value": 1000}),
    ("DELETE", "/v1/config/{key}"): Req("DELETE", "/v1/config/llm.maxTokens"),
    ("GET", "/metrics"): get("/metrics"),  # Prometheus: every tenant aggregated, no ids
}

# the token API (docs/token-api.md): a call is the caller's tenant's (its bill), with no ids of anything
# stored to isolate; its refusals are in its vendor's shape (checked in test_requests_without_a_valid_key…)
CHAT = {"model": "scripted/echo", "messages": [{"role": "user", "content": "hi"}]}
TOKEN_API: dict[Route, Req] = {
    ("GET", "/v1/models"): get("/v1/models"),
    ("GET", "/v1/models/{model_id}"): get("/v1/models/scripted/echo"),
    ("GET", "/v1/models/{model_id:path}"): get("/v1/models/scripted/echo"),
    ("POST", "/v1/chat/completions"): Req("POST", "/v1/chat/completions", json=CHAT),
    ("POST", "/v1/responses"): Req("POST", "/v1/responses", json={"model": "scripted/echo", "input": "hi"}),
    ("POST", "/v1/messages"): Req("POST", "/v1/messages", json={**CHAT, "max_tokens": 5}),
    ("POST", "/v1/messages/count_tokens"): Req("POST", "/v1/messages/count_tokens", json=CHAT),
}
OPENAI_REFUSAL = ("invalid_request_error", "invalid_api_key")

# being added by other work: covered once present, and never required
OPTIONAL: frozenset[Route] = frozenset({
    ("GET", "/v1/metrics"), ("GET", "/v1/logs"), ("GET", "/v1/usage"), ("GET", "/v1/usage/export"),
    ("GET", "/v1/budgets"), ("PUT", "/v1/budgets"), ("DELETE", "/v1/budgets"), ("GET", "/metrics")})

HTTP_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})


def http_routes(app: FastAPI) -> set[Route]:
    """Every (method, path) the app serves: its OpenAPI paths, and the APIRoutes found by walking
    `app.routes` (FastAPI ≥ 0.16x keeps included routers as nested entries there), so that a route
    hidden from the schema is found too."""
    found = {(method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops
             if method.upper() in HTTP_METHODS}

    def walk(routes: list[Any], prefix: str) -> Iterator[Route]:
        for route in routes:
            if isinstance(route, APIRoute):
                yield from ((m, prefix + route.path) for m in route.methods or () if m in HTTP_METHODS)
            nested = getattr(route, "original_router", None)
            if nested is not None:
                context = getattr(route, "include_context", None)
                yield from walk(list(nested.routes), prefix + str(getattr(context, "prefix", "")))

    return found | set(walk(list(app.routes), ""))


def phase(method: str, call: Build | Late) -> int:
    if isinstance(call, Late):
        return 3
    return {"GET": 0, "DELETE": 2}.get(method, 1)


# ---- the WebSocket table ---------------------------------------------------------------------------

WsBuild = Callable[[Ids, Own], JSON]


@dataclass(frozen=True)
class WsLate:
    build: WsBuild


# command → the request data to send (requestId added), each with A's ids and with ghosts; in order
WS_TABLE: dict[str, list[WsBuild | WsLate]] = {
    "container_list": [lambda t, me: {}],
    "container_get": [lambda t, me: {"containerId": t.container}],
    "image_list": [lambda t, me: {}, lambda t, me: {"containerId": t.container}],
    "image_get": [lambda t, me: {"imageId": t.image}, lambda t, me: {"imageId": t.image2}],
    "image_messages": [lambda t, me: {"imageId": t.image},
                       lambda t, me: {"imageId": t.image, "sessionId": t.session2},
                       lambda t, me: {"imageId": me.image, "sessionId": t.session}],
    "agent_get": [lambda t, me: {"agentId": t.agent}],
    "agent_list": [lambda t, me: {"containerId": t.container}],
    "image_create": [
        lambda t, me: {"containerId": me.container, "config": {"systemPrompt": f"resource://prompts/{t.prompt_name}"}},
        lambda t, me: {"containerId": me.container, "config": {"tools": [f"resource://tools/{t.tool_name}"]}},
        lambda t, me: {"containerId": me.container, "config": {"agent": f"resource://agents/{t.agent_name}@^1"}},
        WsLate(lambda t, me: {"containerId": t.container, "config": {"name": "B's"}})],
    "image_run": [lambda t, me: {"imageId": t.image}],
    "image_stop": [lambda t, me: {"imageId": t.image}],
    "image_update": [lambda t, me: {"imageId": t.image, "updates": {"name": "B's now"}}],
    "message_send": [lambda t, me: {"imageId": t.image, "content": "hello"},
                     lambda t, me: {"agentId": t.agent, "content": "hello"},
                     lambda t, me: {"imageId": t.image, "sessionId": t.session2, "content": "hello"},
                     lambda t, me: {"imageId": me.image, "sessionId": t.session, "content": "hello"}],
    "agent_interrupt": [lambda t, me: {"imageId": t.image}, lambda t, me: {"agentId": t.agent},
                        lambda t, me: {"imageId": me.image, "sessionId": t.session}],
    "image_delete": [lambda t, me: {"imageId": t.image}, lambda t, me: {"imageId": t.image2}],
    "agent_destroy": [lambda t, me: {"agentId": t.agent}],
    "agent_destroy_all": [lambda t, me: {"containerId": t.container}],
    "container_create": [WsLate(lambda t, me: {"containerId": t.container})],
}


# ---- comparing answers ------------------------------------------------------------------------------

def carried(where: str, ids: Ids) -> dict[str, str]:
    """The ids of `ids` that a request sends."""
    return {name: value for name, value in ids.values().items() if value in where}


def masked(text: str, used: dict[str, str]) -> str:
    for name, value in sorted(used.items(), key=lambda kv: -len(kv[1])):
        text = text.replace(value, "{" + name + "}")
    return text


def skeleton(value: Any) -> Any:
    """The shape of a successful answer: keys, list lengths, booleans and nulls; not the values of
    new ids, times and counts, which differ between two calls anyway."""
    if isinstance(value, dict):
        return {k: skeleton(v) for k, v in value.items()}
    if isinstance(value, list):
        return [skeleton(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    return type(value).__name__


def outcome(res: httpx.Response, used: dict[str, str]) -> tuple[int, Any]:
    if not res.is_success:
        return res.status_code, masked(res.text, used)
    if res.headers.get("content-type", "").startswith("application/json"):
        return res.status_code, skeleton(res.json())
    return res.status_code, res.headers.get("content-type")


def leaks(text: str, a: Ids, used: dict[str, str]) -> list[str]:
    """A's ids and names in an answer to B, but for those B sent itself."""
    return [name for name, value in a.values().items() if name not in used and value in text]


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def send(http: httpx.AsyncClient, req: Req, headers: dict[str, str]) -> httpx.Response:
    return await http.request(req.method, req.path, params=req.params, json=req.json, content=req.content,
                              headers={**headers, **(req.headers or {})})


# ---- two tenants --------------------------------------------------------------------------------------

@dataclass
class World:
    srv: InProcess
    http: httpx.AsyncClient
    a: Ids
    b: Own
    a_ws: StockClient
    a_admin: str
    b_admin: str
    b_user: str
    revoked: str  # A's, revoked
    expired: str  # A's, expired
    others: list[tuple[str, str, Own]]  # the other tenants: who, their key, their own things

    def routes(self) -> set[Route]:
        return http_routes(self.srv.runtime.app)

    async def a_view(self) -> JSON:
        """What A sees of its things over HTTP (to show that B changed none of them)."""
        a = self.a
        out: JSON = {}
        for path in ("/v1/images", f"/v1/images/{a.image}", f"/v1/images/{a.image2}", f"/v1/images/{a.image}/sessions",
                     f"/v1/sessions/{a.session}/messages", f"/v1/sessions/{a.session2}",
                     f"/v1/sessions/{a.session}/turns", "/v1/turns", "/v1/resources", f"/v1/resources/{a.prompt}",
                     f"/v1/resources/{a.knowledge}", "/v1/auth/keys",
                     *(["/v1/budgets"] if ("GET", "/v1/budgets") in self.routes() else [])):
            res = await self.http.get(path, headers=bearer(self.a_admin))
            assert res.status_code == 200, (path, res.text)
            out[path] = res.json()
        return out


async def mint(keys: SqliteKeys, tenant: str, scope: str, *, expired: bool = False) -> tuple[str, str]:
    """A key put straight into the key store, as `avm keys create` does; `expired`: made a minute
    ago for 30 s."""
    made = now_ms() - 60_000 if expired else None
    key, token = new_key(tenant, [scope], name=f"{tenant} {scope}", now_ms=made,
                         expires_at=None if made is None else made + 30_000)
    await keys.put_key(key)
    return key.key_id, token


async def created(res: Any) -> JSON:
    response: httpx.Response = await res
    assert response.status_code == 201, response.text
    return dict(response.json())


@contextlib.asynccontextmanager
async def two_tenants(tmp_path: Path) -> AsyncIterator[World]:
    async with in_process(tmp_path / "data", driver=ScriptedDriver(), auth="keys", auth_timeout_s=0.5) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        keys = SqliteKeys(srv.runtime.store)
        a_key, a_admin = await mint(keys, "tenant-a", "admin")
        _, expired = await mint(keys, "tenant-a", "admin", expired=True)
        _, b_admin = await mint(keys, "tenant-b", "admin")
        _, b_user = await mint(keys, "tenant-b", "user")
        ah = bearer(a_admin)

        # A: resources (not published: only A may read them), an agent built of them
        prompt = await created(http.post("/v1/resources", headers=ah, json={
            "kind": "prompt", "name": "acme-prompt", "version": "1.0.0", "content": {"text": "zebracorn voice"}}))
        tool = await created(http.post("/v1/resources", headers=ah, json={
            "kind": "tool", "name": "acme-tool", "version": "1.0.0", "content": {"type": "builtin", "name": "bash"}}))
        kb = await created(http.post("/v1/resources", headers=ah, json={
            "kind": "knowledge", "name": "acme-kb", "version": "1.0.0",
            "content": {"documents": [{"id": "d1", "text": "The zebracorn handbook."}]}}))
        refs = ["resource://prompts/acme-prompt@^1", "resource://tools/acme-tool", "resource://knowledge/acme-kb@^1"]
        agent_def = await created(http.post("/v1/resources", headers=ah, json={
            "kind": "agent", "name": "acme-agent", "version": "1.0.0", "dependencies": refs,
            "content": {"systemPrompt": refs[0], "tools": [refs[1]], "knowledge": [refs[2]]}}))

        async with StockClient(f"{srv.url}?token={a_admin}") as a_ws:
            # A: a container and an image over the WebSocket, a turn, its agent
            image = await a_ws.new_image("acme-box", name="Acme zebracorn", systemPrompt="Mind the zebracorn.")
            await a_ws.turn(image["imageId"], "the zebracorn plan")
            run = await a_ws.request("image_run_request", {"imageId": image["imageId"]})
            # over HTTP: an image of the agent resource, a second session, the turn log, keys, an archive
            image2 = await created(http.post("/v1/images", headers=ah, json={
                "containerId": "acme-box", "agent": "resource://agents/acme-agent"}))
            session2 = await created(http.post(f"/v1/images/{image['imageId']}/sessions", headers=ah,
                                               json={"title": "zebracorn again"}))
            sid = image["sessionId"]
            messages = (await http.get(f"/v1/sessions/{sid}/messages", headers=ah)).json()["items"]
            turns = (await http.get(f"/v1/sessions/{sid}/turns", headers=ah)).json()["items"]
            app_key = await created(http.post("/v1/auth/keys", headers=ah, json={"name": "acme app"}))
            gone = await created(http.post("/v1/auth/keys", headers=ah, json={"name": "acme old"}))
            assert (await http.delete(f"/v1/auth/keys/{gone['keyId']}", headers=ah)).status_code == 204
            assert (await http.get(f"/v1/sessions/{sid}/export", headers=ah)).status_code == 200
            if ("PUT", "/v1/budgets") in http_routes(srv.runtime.app):  # a budget of A's key
                budget = await http.put("/v1/budgets", headers=ah, json={"keyId": app_key["keyId"],
                                                                          "monthlyBudget": "3.00"})
                assert budget.status_code == 200, budget.text
            a = Ids(tenant="tenant-a", container="acme-box", image=image["imageId"], session=sid,
                    session2=session2["sessionId"], image2=image2["imageId"], agent=run["data"]["agentId"],
                    turn=turns[0]["turnId"], message=messages[0]["id"], prompt=prompt["resourceId"],
                    tool=tool["resourceId"], knowledge=kb["resourceId"], agent_def=agent_def["resourceId"],
                    prompt_name="acme-prompt", tool_name="acme-tool", knowledge_name="acme-kb",
                    agent_name="acme-agent", key=app_key["keyId"], admin_key=a_key, word="zebracorn")
            assert len(turns) == 1 and messages

            # B (an admin key) and C (a user key only): an image each, and its archive
            _, c_user = await mint(keys, "tenant-c", "user")
            b = await own_things(http, b_admin, "bob-box")
            c = await own_things(http, c_user, "carol-box")
            yield World(srv, http, a, b, a_ws, a_admin, b_admin, b_user, gone["token"], expired,
                        others=[("B (admin key)", b_admin, b), ("C (user key)", c_user, c)])


async def own_things(http: httpx.AsyncClient, token: str, container: str) -> Own:
    own = await created(http.post("/v1/images", headers=bearer(token), json={"containerId": container, "config": {}}))
    archive = await http.get(f"/v1/sessions/{own['sessionId']}/export", headers=bearer(token))
    assert archive.status_code == 200, archive.text
    return Own(container=container, image=own["imageId"], session=own["sessionId"], archive=archive.content)


# ---- the tests ------------------------------------------------------------------------------------------

def test_the_tables_cover_every_route_and_command(tmp_path: Path) -> None:
    rt = build_runtime(Settings(host="127.0.0.1", port=0, data_dir=tmp_path, auth="keys"))
    found = http_routes(rt.app)
    assert ("GET", "/v1/images/{image_id}") in found and ("GET", "/health") in found  # the walk works
    listed = set(TABLE) | set(TENANTLESS) | set(DEPLOYMENT) | set(TOKEN_API)
    assert not set(TABLE) & set(TENANTLESS) and not set(TABLE) & set(DEPLOYMENT)
    uncovered = found - listed
    assert not uncovered, f"routes with no row in TABLE (or TENANTLESS/DEPLOYMENT): {sorted(uncovered)}"
    missing = listed - found - OPTIONAL
    assert not missing, f"rows for routes that do not exist: {sorted(missing)}"
    # the WebSocket: every command of the protocol and of the router's dispatch table, on both paths
    assert set(WS_TABLE) == set(COMMANDS) == set(rt.router._handlers)
    assert {r.path for r in rt.app.routes if isinstance(r, APIWebSocketRoute)} == {"/ws", "/"}


async def test_every_http_route_answers_another_tenants_ids_like_missing_ones(tmp_path: Path) -> None:
    async with two_tenants(tmp_path) as w:
        routes = w.routes()
        before = await w.a_view()
        calls = sorted(((route, call) for route, row in TABLE.items() if route in routes for call in row),
                       key=lambda rc: phase(rc[0][0], rc[1]))
        for who, token, own in w.others:
            mine = (await w.http.get("/v1/images", headers=bearer(token))).json()["items"]
            assert [i["imageId"] for i in mine] == [own.image], who  # the key works, and sees its own
            nobody = ghost()
            for route, call in calls:
                build = call.build if isinstance(call, Late) else call
                theirs, missing = build(w.a, own), build(nobody, own)
                assert theirs.method == route[0]
                if theirs.method == "GET":  # the row reads something A has: A is answered
                    owner = await send(w.http, theirs, bearer(w.a_admin))
                    assert owner.is_success, (route, theirs, owner.text)
                got = await send(w.http, theirs, bearer(token))
                want = await send(w.http, missing, bearer(token))
                # answered by the route itself (no typo in the table: not Starlette's 404/405, not a 400)
                assert got.status_code not in (400, 405, 422) and "detail" not in got.text[:20], (who, route, got.text)
                used_a, used_ghost = carried(theirs.carries(), w.a), carried(missing.carries(), nobody)
                assert outcome(got, used_a) == outcome(want, used_ghost), (who, route, theirs, got.text, want.text)
                assert not leaks(got.text, w.a, used_a), (who, route, theirs, got.text)
        assert await w.a_view() == before  # nothing of A's changed
        if ("GET", "/v1/metrics") in routes:  # B ran no turn: none of A's is counted as B's
            metrics = (await w.http.get("/v1/metrics", headers=bearer(w.b_admin))).json()
            assert metrics["tenantId"] == "tenant-b" and metrics["turns"]["total"] == 0, metrics


async def test_requests_without_a_valid_key_are_refused(tmp_path: Path) -> None:
    async with two_tenants(tmp_path) as w:
        routes = w.routes()
        a_key_id = w.a_admin.split(".")[0]
        refused = {
            "no key": {},
            "malformed": bearer("not-a-key"),
            "unknown key": bearer("avmk_000000000000." + "x" * 43),
            "A's key id, another secret": bearer(f"{a_key_id}.{'y' * 43}"),
            "revoked": bearer(w.revoked),
            "expired": bearer(w.expired),
            "not a bearer": {"authorization": f"Basic {w.a_admin}"},
        }
        first: dict[Route, Req] = {route: _build(row[0])(w.a, w.b) for route, row in TABLE.items()}
        first.update(DEPLOYMENT)
        first.update(TOKEN_API)
        checked = 0
        for route in sorted(routes - set(TENANTLESS)):
            req = first[route]
            # a key in the URL is never read over HTTP (URLs end up in access logs)
            in_url = Req(req.method, req.path, {**(req.params or {}), "token": w.a_admin}, req.json, req.content,
                         req.headers)
            tries = [(why, req, headers) for why, headers in refused.items()] + [("key in the URL", in_url, {})]
            answers = await asyncio.gather(*(send(w.http, r, h) for _, r, h in tries))
            for (why, _, _), res in zip(tries, answers, strict=True):
                if route in TOKEN_API and route[1].startswith("/v1/messages"):  # Anthropic's shape
                    assert (res.status_code, res.json()["type"], res.json()["error"]["type"]) == (
                        401, "error", "authentication_error"), (route, why, res.text)
                elif route in TOKEN_API:  # OpenAI's
                    error = res.json()["error"]
                    assert (res.status_code, error["type"], error["code"]) == (401, *OPENAI_REFUSAL), (route, why)
                else:
                    assert (res.status_code, res.json()["error"]["code"]) == (401, "unauthorized"), (route, why,
                                                                                                    res.text)
            checked += 1
        assert checked == len(routes) - len(TENANTLESS)
        for route in TENANTLESS:
            path, status = TENANTLESS_ANSWERS.get(route, (route[1], 200))
            assert (await w.http.request(route[0], path)).status_code == status, route

        # the deployment's routes: a tenant's user or admin key is refused; an operator key is let in
        _, operator = await mint(SqliteKeys(w.srv.runtime.store), "ops", "operator")
        for route, req in DEPLOYMENT.items():
            if route in routes:
                for token in (w.b_user, w.b_admin, w.a_admin):
                    res = await send(w.http, req, bearer(token))
                    assert (res.status_code, res.json()["error"]["code"]) == (403, "forbidden"), (route, res.text)
                    assert res.json()["error"]["message"] == OPERATOR_ONLY
                res = await send(w.http, req, bearer(operator))
                assert res.status_code in (200, 204), (route, res.text)
        if ("GET", "/metrics") in routes:  # aggregated: no tenant's ids, not even its name
            res = await w.http.get("/metrics", headers=bearer(operator))
            assert res.status_code == 200 and not leaks(res.text, w.a, {}), res.text

        # the WebSocket: a bad key on the upgrade is accepted and closed at once with 1008 and the
        # reason (a browser can read that, not an HTTP refusal); a command sent meanwhile (a message
        # to A's image, with A's revoked or expired key too) gets nothing and changes nothing
        a_before = await w.a_view()
        bad_keys = {"not-a-key": "API key not valid", "avmk_000000000000." + "x" * 43: "API key not valid",
                    f"{a_key_id}.{'y' * 43}": "API key not valid", w.revoked: "API key revoked",
                    w.expired: "API key expired"}
        for token, reason in bad_keys.items():
            upgrades: list[tuple[str, dict[str, str] | None]] = [(f"{w.srv.url}?token={token}", None),
                                                                 (w.srv.url, bearer(token))]
            for url, extra in upgrades:
                async with connect(url, additional_headers=extra) as ws:
                    with contextlib.suppress(ConnectionClosed):  # the close may have arrived already
                        await ws.send(orjson.dumps({"type": "message_send_request", "data": {
                            "requestId": "r1", "imageId": w.a.image, "content": "sent with a refused key"}}).decode())
                    got = []
                    with pytest.raises(ConnectionClosed) as closed:
                        while True:
                            got.append(await asyncio.wait_for(ws.recv(), 5))
                assert got == [], (token, url)
                assert closed.value.rcvd is not None, (token, url)
                assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1008, reason), (token, url)
        assert await w.a_view() == a_before
        # ... and without one, anything but a good first `auth` frame closes it with 1008
        for frame in ({"type": "container_list_request", "data": {"requestId": "r1"}},
                      {"type": "auth", "headers": bearer(w.revoked)}, {"type": "auth", "headers": bearer(w.expired)},
                      {"type": "auth", "headers": {"authorization": "Bearer not-a-key"}}, None):
            async with connect(w.srv.url) as ws:
                if frame is not None:
                    await ws.send(orjson.dumps(frame).decode())
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 5)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008, frame


def _build(call: Build | Late) -> Build:
    return call.build if isinstance(call, Late) else call


async def settled(ws: StockClient) -> int:
    """How many events the client has, once every event queued for it before this call arrived
    (a round trip: a connection's frames are sent in order)."""
    await ws.request("container_list_request", {})
    return len(ws.events)


async def ws_outcome(ws: StockClient, command: str, data: JSON, used: dict[str, str]) -> tuple[Any, str]:
    """The answer to a command, comparable across ids (and its raw text, for the leak check)."""
    res = await ws.request(f"{command}_request", data)
    body = dict(res["data"])
    rid = body.pop("requestId")
    body.pop("__subscriptions", None)
    errors = [{"data": {k: v for k, v in e["data"].items() if k != "requestId"}, "context": e.get("context")}
              for e in ws.events if e.get("type") == "system_error" and e["data"].get("requestId") == rid]
    raw = json.dumps([res, errors])
    if body.get("error") is None:
        assert not errors, (command, errors)
        return ("ok", skeleton(body)), raw
    return ("error", masked(json.dumps(body, sort_keys=True), used),
            masked(json.dumps(errors, sort_keys=True), used)), raw


async def test_every_websocket_command_answers_another_tenants_ids_like_missing_ones(tmp_path: Path) -> None:
    async with two_tenants(tmp_path) as w, StockClient(f"{w.srv.url}?token={w.b_admin}") as b_ws:
        a = w.a
        a_seen = await settled(w.a_ws)
        # an `auth` frame on an open connection changes nothing: B stays B
        await b_ws.send_raw({"type": "auth", "headers": bearer(w.a_admin)})
        listed = await b_ws.request("container_list_request", {})
        assert listed["data"]["containerIds"] == [w.b.container]  # B's own, none of A's
        nobody = ghost()
        calls = [(command, call) for command, row in WS_TABLE.items() for call in row]
        calls.sort(key=lambda cc: isinstance(cc[1], WsLate))
        for command, call in calls:
            build = call.build if isinstance(call, WsLate) else call
            theirs, missing = build(a, w.b), build(nobody, w.b)
            used_a, used_ghost = carried(json.dumps(theirs), a), carried(json.dumps(missing), nobody)
            got, raw = await ws_outcome(b_ws, command, theirs, used_a)
            want, _ = await ws_outcome(b_ws, command, missing, used_ghost)
            assert got == want, (command, theirs, got, want)
            assert '"errorCode": "invalid_request"' not in raw, raw  # the table sends valid commands
            assert not leaks(raw, a, used_a), (command, raw)

        # subscribing to A's sessions: refused like a session that does not exist, with or without afterSeq
        for after in (None, 0, 1):
            for field in ("session", "session2"):
                answers = []
                for ids in (a, nobody):
                    sid = ids.values()[field]
                    frame: JSON = {"type": "subscribe", "sessionId": sid}
                    if after is not None:
                        frame["afterSeq"] = after
                    start = len(b_ws.events)
                    await b_ws.send_raw(frame)
                    error = await b_ws.wait_type("system_error", timeout=5, start=start)
                    answers.append(masked(json.dumps(error["data"]), {field: sid}))
                assert answers[0] == answers[1] and "Session not found" in answers[0], answers

        # nothing B did reached A's connection; A's next turn reaches none of B's
        assert await settled(w.a_ws) == a_seen + 1, w.a_ws.events[a_seen:]  # the round trip's answer only
        b_seen = await settled(b_ws)
        await w.a_ws.turn(a.image, "the zebracorn plan, again")
        assert await settled(b_ws) == b_seen + 1, b_ws.events[b_seen:]

        # and A's things are all there, as A left them
        got = (await w.a_ws.request("image_get_request", {"imageId": a.image}))["data"]["record"]
        assert (got["name"], got["agentId"]) == ("Acme zebracorn", a.agent)
        assert (await w.a_ws.request("agent_get_request", {"agentId": a.agent}))["data"]["exists"] is True
        assert (await w.a_ws.request("image_get_request", {"imageId": a.image2}))["data"]["record"] is not None
        history = (await w.a_ws.request("image_messages_request", {"imageId": a.image}))["data"]["messages"]
        assert len(history) == 4 and "B's" not in json.dumps(history)
        assert (await w.a_ws.request("container_list_request", {}))["data"]["containerIds"] == ["acme-box"]


# `model: "agent/<imageId>"` on the token API (docs/token-api.md, Agents as models): A's image, or B's own
# image with one of A's sessions (by the header, OpenAI's `user`, Anthropic's `metadata.user_id`)
SAY = [{"role": "user", "content": "hi"}]
AGENT_MODEL_CALLS: list[Build] = [
    lambda a, own: Req("POST", "/v1/chat/completions", json={"model": f"agent/{a.image}", "messages": SAY}),
    lambda a, own: Req("POST", "/v1/chat/completions", json={"model": f"agent/{a.image2}", "messages": SAY,
                                                             "stream": True}),
    lambda a, own: Req("POST", "/v1/messages", json={"model": f"agent/{a.image}", "max_tokens": 5, "messages": SAY}),
    lambda a, own: Req("POST", "/v1/chat/completions", json={"model": f"agent/{own.image}", "messages": SAY},
                       headers={"x-agentvm-session-id": a.session}),
    lambda a, own: Req("POST", "/v1/chat/completions", json={"model": f"agent/{own.image}", "messages": SAY,
                                                             "user": a.session2}),
    lambda a, own: Req("POST", "/v1/messages", json={"model": f"agent/{own.image}", "max_tokens": 5,
                                                     "messages": SAY, "metadata": {"user_id": a.session}}),
]


async def test_agent_models_answer_another_tenants_images_and_sessions_like_missing_ones(tmp_path: Path) -> None:
    async with two_tenants(tmp_path) as w:
        before = await w.a_view()
        for who, token, own in w.others:
            nobody = ghost()
            for i, build in enumerate(AGENT_MODEL_CALLS):
                theirs, missing = build(w.a, own), build(nobody, own)
                got = await send(w.http, theirs, bearer(token))
                want = await send(w.http, missing, bearer(token))
                assert got.status_code == 404, (who, i, got.text)
                used_a, used_ghost = carried(theirs.carries(), w.a), carried(missing.carries(), nobody)
                assert outcome(got, used_a) == outcome(want, used_ghost), (who, i, got.text, want.text)
                assert not leaks(got.text, w.a, used_a), (who, i, got.text)
        assert await w.a_view() == before  # no turn of A's, nothing stored on A's sessions
