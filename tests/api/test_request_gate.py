"""The HTTP API authenticates before it reads a body, and refuses bodies over its limits unread
(agentvm/api/request_gate.py, docs/tenancy.md, issue 15 points 2 and 9): every route answers an
unauthenticated request with a body 401, never 400/413; a declared `Content-Length` over the limit
is refused at once; a chunked body is cut at the limit; the 401 text names the header only."""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentvm.adapters.local.sqlite_keys import SqliteKeys
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.auth.api_keys import MISSING_TOKEN, new_key
from agentvm.drivers.scripted import ScriptedDriver
from tests.support.raw_http import upload, zeros
from tests.support.servers import InProcess, in_process

LIMIT = 64 * 1024
ARCHIVE_LIMIT = 256 * 1024
MISSING = {"error": {"code": "unauthorized",
                     "message": "API key required: send the header `Authorization: Bearer <key>`"}}
TOO_LARGE = {"error": {"code": "payload_too_large", "field": "body",
                       "message": f"body: larger than this server's limit of {LIMIT} bytes (AVM_HTTP_MAX_BODY_BYTES)"}}
ARCHIVE_TOO_LARGE = {"error": {"code": "archive_too_large", "field": "archive", "message": (
    f"archive: larger than this server's limit of {ARCHIVE_LIMIT} bytes (AVM_ARCHIVE_MAX_BYTES)")}}
PUBLIC = {"/health", "/api/v1/health"}


async def _keys(data: Path) -> dict[str, str]:
    store = SqliteStore(data / "agentvm.db")
    await store.open()
    tokens = {}
    try:
        for name, scopes in {"admin": ("admin", "operator"), "user": ("user",)}.items():
            key, tokens[name] = new_key("acme", scopes, name=name)
            await SqliteKeys(store).put_key(key)
    finally:
        await store.close()
    return tokens


@pytest.fixture
async def keyed(tmp_path: Path) -> AsyncIterator[tuple[InProcess, dict[str, str]]]:
    data = tmp_path / "data"
    data.mkdir()
    tokens = await _keys(data)
    async with in_process(data, driver=ScriptedDriver(), auth="keys", http_max_body_bytes=LIMIT,
                          archive_max_bytes=ARCHIVE_LIMIT) as srv:
        yield srv, {name: f"Bearer {token}" for name, token in tokens.items()}


def operations(srv: InProcess) -> list[tuple[str, str, bool]]:
    """Every operation of the OpenAPI document: method, path (parameters filled in), takes a body."""
    doc: dict[str, Any] = srv.runtime.app.openapi()
    found = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            found.append((method.upper(), re.sub(r"{\w+}", "x", path), "requestBody" in op))
    return found


TOKEN_API = ("/v1/models", "/v1/chat/completions", "/v1/responses", "/v1/messages")
_TOKEN_KEY = "API key required: send `Authorization: Bearer <key>` or `x-api-key: <key>`"
TOKEN_API_MISSING = [
    {"error": {"message": _TOKEN_KEY, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}},
    {"type": "error", "error": {"type": "authentication_error", "message": _TOKEN_KEY}}]


async def test_every_route_answers_401_before_it_reads_a_body(keyed: tuple[InProcess, dict[str, str]]) -> None:
    srv, auth = keyed
    ops = operations(srv)
    assert len(ops) >= 40 and sum(body for *_, body in ops) >= 10
    bad = b'{"not json'
    async with httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        for method, path, takes_body in ops:
            if path in PUBLIC:
                assert (await http.request(method, path)).status_code == 200
                continue
            for query in ({}, {"token": auth["admin"].removeprefix("Bearer ")}):  # HTTP reads no ?token=
                res = await http.request(method, path, params=query, content=bad)
                if path.startswith(TOKEN_API):  # its route reads the key before the body, in its vendor's shape
                    assert res.status_code == 401 and res.json() in TOKEN_API_MISSING, (method, path, query)
                    continue
                assert (res.status_code, res.json()) == (401, MISSING), (method, path, query)
            if takes_body:  # with a key, the same body is read, and refused for what it is
                res = await http.request(method, path, content=bad, headers={"authorization": auth["admin"]})
                assert res.status_code == 400 and res.json()["error"]["code"] == "invalid_request", (method, path)
        # a wrong key is refused the same way, before the body
        res = await http.post("/v1/images", content=bad, headers={"authorization": "Bearer avmk_0123456789ab.nope"})
        assert (res.status_code, res.json()["error"]) == (401, {"code": "unauthorized", "message": "API key not valid"})
        # what no route takes needs a key too; with one, it is a plain 404
        assert (await http.post("/v1/nowhere", content=bad)).json() == MISSING
        assert (await http.get("/v1/nowhere", headers={"authorization": auth["user"]})).status_code == 404
        assert (await http.get("/openapi.json")).status_code == 200
    assert "?token=" in MISSING_TOKEN  # the WebSocket upgrade still takes the key in its URL


async def test_a_declared_length_over_the_limit_is_refused_before_the_body(
        keyed: tuple[InProcess, dict[str, str]]) -> None:
    """Headers only, announcing 1 GiB: the answer comes without a byte of the body sent."""
    srv, auth = keyed
    huge = 1 << 30
    nobody = await upload(srv.port, "POST", "/v1/images", length=huge)
    assert (nobody.status, nobody.json(), nobody.headers["connection"]) == (401, MISSING, "close")
    user = {"authorization": auth["user"]}
    over = await upload(srv.port, "POST", "/v1/images", headers=user, length=huge)
    assert (over.status, over.json(), over.headers["connection"]) == (413, TOO_LARGE, "close")
    assert (await upload(srv.port, "POST", "/v1/images", headers=user, length=LIMIT + 1)).json() == TOO_LARGE
    archive = await upload(srv.port, "POST", "/v1/sessions/import?containerId=c1", headers=user, length=huge)
    assert (archive.status, archive.json()) == (413, ARCHIVE_TOO_LARGE)
    # an operator route refuses a user key before the body too
    config = await upload(srv.port, "PUT", "/v1/config/defaults.markup", headers=user, length=huge)
    assert config.status == 403 and config.json()["error"]["code"] == "forbidden"
    assert over.sent == nobody.sent == archive.sent == config.sent == 0


async def test_a_chunked_body_is_cut_at_the_limit(keyed: tuple[InProcess, dict[str, str]]) -> None:
    srv, auth = keyed
    user = {"authorization": auth["user"]}
    image = json.dumps({"containerId": "c1", "config": {"name": "padded"}}).encode()
    exact = image + b" " * (LIMIT - len(image))  # JSON may end in white space: exactly the limit is taken

    def pieces(body: bytes, size: int = 4096) -> list[bytes]:
        return [body[i:i + size] for i in range(0, len(body), size)]

    taken = await upload(srv.port, "POST", "/v1/images", pieces(exact), headers=user)
    assert taken.status == 201 and taken.json()["name"] == "padded"
    cut = await upload(srv.port, "POST", "/v1/images", pieces(exact + b" "), headers=user)
    assert (cut.status, cut.json(), cut.headers["connection"]) == (413, TOO_LARGE, "close")
    endless = await upload(srv.port, "POST", "/v1/images", zeros(1 << 30), headers=user)
    assert (endless.status, endless.json()) == (413, TOO_LARGE)
    assert endless.sent < 64 << 20  # cut near the limit, not read to the end
    archive = await upload(srv.port, "POST", "/v1/sessions/import?containerId=c1", zeros(1 << 30), headers=user)
    assert (archive.status, archive.json()) == (413, ARCHIVE_TOO_LARGE)
    # the server still answers on new connections, and nothing was imported
    async with httpx.AsyncClient(base_url=srv.http, headers=user, timeout=10) as http:
        assert [i["name"] for i in (await http.get("/v1/images")).json()["items"]] == ["padded"]


async def test_an_archive_import_is_spooled_to_disk_and_still_works(
        keyed: tuple[InProcess, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    srv, auth = keyed
    import agentvm.api.archive_http as archive_http

    spooled: list[Path | None] = []
    real = tempfile.TemporaryFile

    def recording(*args: Any, **kwargs: Any) -> Any:
        spooled.append(kwargs.get("dir"))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", recording)
    monkeypatch.setattr(archive_http, "_WRITE_BYTES", 4096)  # many writes to the spool file
    async with httpx.AsyncClient(base_url=srv.http, headers={"authorization": auth["user"]}, timeout=10) as http:
        image = (await http.post("/v1/images", json={"containerId": "c1", "config": {
            "name": "Kept", "systemPrompt": "x" * 60_000}})).json()
        raw = (await http.get(f"/v1/sessions/{image['sessionId']}/export")).content
        assert 60_000 < len(raw) < ARCHIVE_LIMIT
        async def chunked() -> AsyncIterator[bytes]:
            for i in range(0, len(raw), 8192):
                yield raw[i:i + 8192]

        done = await http.post("/v1/sessions/import", params={"containerId": "c2"}, content=chunked())
        assert done.status_code == 201, done.text
        imported = (await http.get(f"/v1/images/{done.json()['imageId']}")).json()
        assert (imported["name"], imported["containerId"]) == ("Kept", "c2")
    assert spooled == [srv.runtime.settings.data_dir]
