"""Session archives leave the image's secrets out unless asked (issue 15, point 12): MCP servers' env
values, header values, URL query values and user information, credential flags in args, HTTP tools'
headers. `includeSecrets=true` (HTTP), `include_secrets=True` (Python), `--include-secrets` (CLI) keep
them. An image imported without them refuses messages with an error naming each field and how to
give the values; its MCP servers are never started with the placeholder."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from agentvm.domain.config_secrets import REDACTED_MARK, redact_config
from agentvm.services.session_archive import checksum_of
from agentvm.tools.mcp import McpPool, parse_mcp_servers, unconfined
from agentvm_client.management import ManagementClient
from avm import cli
from tests.api.test_sessions_http import finished_turns
from tests.support.scripts import RecordingDriver, reference_driver
from tests.support.servers import InProcess, in_process

JSON = dict[str, Any]

URL_TOKEN = "PLANTEDurltok3n"
HEADER_KEY = "PLANTEDheaderkey"
ENV_SECRET = "PLANTEDenvsecret"
ARG_SECRET = "PLANTEDargsecret"
USER_PASSWORD = "PLANTEDuserpass"
SERVERS: JSON = {
    "web": {"type": "http", "url": f"https://bot:{USER_PASSWORD}@mcp.example.com/mcp?token={URL_TOKEN}&v=2",
            "headers": {"Authorization": f"Bearer {HEADER_KEY}"}},
    "files": {"command": "files-server", "args": ["--root", "/w", f"--api-key={ARG_SECRET}"],
              "env": {"FILES_TOKEN": ENV_SECRET}},
}
REDACTED_SERVERS: JSON = {
    "web": {"type": "http", "url": "https://<redacted>@mcp.example.com/mcp?token=<redacted>&v=<redacted>",
            "headers": {"Authorization": "<redacted>"}},
    "files": {"command": "files-server", "args": ["--root", "/w", "--api-key=<redacted>"],
              "env": {"FILES_TOKEN": "<redacted>"}},
}
PLANTED = (URL_TOKEN, HEADER_KEY, ENV_SECRET, ARG_SECRET, USER_PASSWORD)
MISSING = (
    "MCP server 'web', MCP server 'files' of this image were imported without their secrets: "
    "mcpServers.web.url, mcpServers.web.headers.Authorization, mcpServers.files.args[2], "
    "mcpServers.files.env.FILES_TOKEN hold \"<redacted>\" (the session archive was exported without them). "
    "Images cannot be edited: import the session again from an archive exported with includeSecrets=true "
    "(avm sessions export --include-secrets), or create a new image with the full configuration (image_create)")


@pytest.fixture
async def srv(tmp_path: Path) -> AsyncIterator[InProcess]:
    async with in_process(tmp_path / "data", driver=RecordingDriver(reference_driver())) as server:
        yield server


async def session_with_secrets(http: httpx.AsyncClient) -> str:
    res = await http.post("/v1/images", json={"containerId": "c-sec", "config": {
        "name": "Secretive", "mcpServers": SERVERS}})
    assert res.status_code == 201, res.text
    return str(res.json()["sessionId"])


async def test_an_export_redacts_secrets_unless_asked(srv: InProcess) -> None:
    async with httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        sid = await session_with_secrets(http)
        res = await http.get(f"/v1/sessions/{sid}/export")
        assert res.status_code == 200, res.text
        for planted in PLANTED:
            assert planted not in res.text
        archive = res.json()
        assert archive["image"]["config"]["mcpServers"] == REDACTED_SERVERS
        assert archive["checksum"] == checksum_of(archive)  # of the redacted content

        full = await http.get(f"/v1/sessions/{sid}/export", params={"includeSecrets": "true"})
        assert full.status_code == 200, full.text
        assert full.json()["image"]["config"]["mcpServers"] == SERVERS
        assert full.json()["checksum"] == checksum_of(full.json())
        bad = await http.get(f"/v1/sessions/{sid}/export", params={"includeSecrets": "maybe"})
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["field"] == "includeSecrets"

    async with ManagementClient(srv.http) as client:
        assert (await client.sessions.export(sid))["image"]["config"]["mcpServers"] == REDACTED_SERVERS
        kept = await client.sessions.export(sid, include_secrets=True)
        assert kept["image"]["config"]["mcpServers"] == SERVERS


async def test_an_image_imported_without_secrets_refuses_messages_naming_them(srv: InProcess) -> None:
    async with httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        sid = await session_with_secrets(http)
        assert (await http.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"})).status_code == 202
        await finished_turns(http, sid, 1)
        redacted = (await http.get(f"/v1/sessions/{sid}/export")).content
        res = await http.post("/v1/sessions/import", params={"containerId": "c-elsewhere"}, content=redacted)
        assert res.status_code == 201, res.text
        imported = res.json()["sessionId"]

        sent = await http.post(f"/v1/sessions/{imported}/messages", json={"content": "go on"})
        assert sent.status_code == 409, sent.text
        assert sent.json() == {"error": {"code": "secrets_missing", "message": MISSING, "field": "imageId"}}
        assert len((await http.get(f"/v1/sessions/{imported}/turns")).json()["items"]) == 1  # nothing queued

        # with the secrets, the imported image runs like the original
        full = (await http.get(f"/v1/sessions/{sid}/export", params={"includeSecrets": "true"})).content
        res = await http.post("/v1/sessions/import", params={"containerId": "c-elsewhere"}, content=full)
        whole = res.json()["sessionId"]
        sent = await http.post(f"/v1/sessions/{whole}/messages", json={"content": "go on"})
        assert sent.status_code == 202, sent.text


async def test_a_redacted_mcp_server_is_never_started() -> None:
    """Behind message_send's refusal, the pool itself does not start a server whose config holds the
    placeholder (the turn gets only its other tools, and the reason)."""
    config, replaced = redact_config({"mcpServers": SERVERS})
    assert replaced == 6  # the URL's user information, token and v; the header, the arg, the env value
    servers = parse_mcp_servers(config["mcpServers"])
    pool = McpPool(start_timeout_s=5)
    try:
        tools = await pool.tools(("t1", "c1"), servers, cwd=Path("/"), env={}, launcher=unconfined)
    finally:
        await pool.close()
    assert sorted(tools.problems) == [
        'files: imported without its secrets: mcpServers.files.env.FILES_TOKEN, mcpServers.files.args[2] '
        'hold "<redacted>"',
        'web: imported without its secrets: mcpServers.web.headers.Authorization, mcpServers.web.url '
        'hold "<redacted>"',
    ]
    assert pool.running() == []


async def test_avm_sessions_export_include_secrets(srv: InProcess, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    async with httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        sid = await session_with_secrets(http)

    def export(*argv: str) -> JSON:
        path = tmp_path / "out.json"
        assert cli.main(["sessions", "--url", srv.url, "export", sid, "--out", str(path), *argv]) == 0
        capsys.readouterr()
        data: JSON = orjson.loads(path.read_bytes())
        data["_mode"] = stat.S_IMODE(path.stat().st_mode)
        path.unlink()
        return data

    plain = await asyncio.to_thread(export)
    assert plain["image"]["config"]["mcpServers"] == REDACTED_SERVERS
    full = await asyncio.to_thread(export, "--include-secrets")
    assert full["image"]["config"]["mcpServers"] == SERVERS
    assert full["_mode"] == 0o600  # a file holding secrets is the user's alone


def test_what_counts_as_a_secret() -> None:
    config: JSON = {"model": "m", "tools": ["bash"],
              "mcpServers": {"s": {"command": "srv", "args": ["--token", "t0ps3cret", "-v", "KEY=v",
                                                               "https://h/x?sig=abc#frag", "plain"],
                                   "env": {"EMPTY": "", "DEBUG": "1"}},
                             "r": {"type": "sse", "url": "http://h:8080/sse"}},
              "httpTools": [{"name": "w", "url": "https://a/b?q=1", "headers": {"x-api-key": "k"}}]}
    out, replaced = redact_config(config)
    assert out["mcpServers"]["s"] == {"command": "srv", "args": ["--token", REDACTED_MARK, "-v", "KEY=<redacted>",
                                                                 "https://h/x?sig=<redacted>#frag", "plain"],
                                      "env": {"EMPTY": "", "DEBUG": REDACTED_MARK}}
    assert out["mcpServers"]["r"] == {"type": "sse", "url": "http://h:8080/sse"}  # nothing secret: unchanged
    assert out["httpTools"] == [{"name": "w", "url": "https://a/b?q=<redacted>",
                                 "headers": {"x-api-key": "<redacted>"}}]
    assert (out["model"], out["tools"], replaced) == ("m", ["bash"], 6)
    assert config["mcpServers"]["s"]["env"]["DEBUG"] == "1"  # a copy: the image's own config is untouched
