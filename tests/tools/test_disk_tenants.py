"""One tenant's disk does not stop the others (issue 15, point 4), on `avm serve` with API keys: tenant A
fills its workspace quota, or the server's disk falls under its reserve; tenant B's chat turns still
complete, A's tool results name the limit, and /health reports a disk under the reserve."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from agentvm.adapters.local.sqlite_keys import SqliteKeys
from agentvm.auth.api_keys import new_key
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from tests.support.servers import InProcess, in_process
from tests.support.stock_client import StockClient

SCRIPT = """
rules:
  - match: "^fill"
    responses:
      - tool_calls: [{id: toolu_fill, name: bash, input: {command: "head -c 5M /dev/zero > projects/fill"}}]
      - tool_calls: [{id: toolu_more, name: write_file, input: {path: projects/more.txt, content: "more"}}]
      - text: ["Full."]
"""
MIB = 1 << 20


async def _token(srv: InProcess, tenant: str) -> str:
    key, token = new_key(tenant, ["admin"], name=f"{tenant} admin")
    await SqliteKeys(srv.runtime.store).put_key(key)
    return token


@asynccontextmanager
async def _two_tenants(tmp_path: Path, free_bytes: Callable[[], int] | None = None
                       ) -> AsyncIterator[tuple[InProcess, StockClient, StockClient]]:
    async with in_process(tmp_path / "data", driver=ScriptedDriver(parse_script(SCRIPT)), auth="keys",
                          workspace_quota_bytes=MIB, free_bytes=free_bytes) as srv:
        a_token, b_token = await _token(srv, "tenant-a"), await _token(srv, "tenant-b")
        async with StockClient(f"{srv.url}?token={a_token}") as a, StockClient(f"{srv.url}?token={b_token}") as b:
            yield srv, a, b


def _results(events: list[dict[str, Any]]) -> dict[str, tuple[str, bool]]:
    return {e["data"]["toolCallId"]: (e["data"]["result"], e["data"]["isError"]) for e in events
            if e["type"] == "tool_result"}


def _status(events: list[dict[str, Any]]) -> str:
    [done] = [e for e in events if e["type"] == "turn_response"]
    return str(done["data"]["status"])


async def _health(srv: InProcess) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=srv.http) as http:
        res = await http.get("/health")
    assert res.status_code == 200
    return dict(res.json())


async def test_a_tenant_filling_its_quota_leaves_the_others_working(tmp_path: Path) -> None:
    async with _two_tenants(tmp_path) as (srv, a, b):
        a_image = await a.new_image("a-box", tools=["bash", "write_file"])
        b_image = await b.new_image("b-box")
        a_turn = await a.turn(a_image["imageId"], "fill the disk", timeout=30)
        results = _results(a_turn)
        fill, fill_error = results["toolu_fill"]
        assert fill_error is True
        assert fill.startswith("killed\n[killed: the workspace quota of 1 MiB was reached; remove files to make room]")
        more, more_error = results["toolu_more"]
        assert more_error is True
        assert more.startswith("write_file: refused: the workspace quota of 1 MiB would be exceeded (")
        assert _status(a_turn) == "completed"
        # A's workspace holds what the quota left, nothing more
        workspace = tmp_path / "data" / "tenants" / "tenant-a" / "containers" / "a-box" / "workspace"
        assert (workspace / "projects" / "fill").stat().st_size <= MIB
        assert not (workspace / "projects" / "more.txt").exists()
        # B's chat turn completes; the server is healthy (the disk itself is not full)
        b_turn = await b.turn(b_image["imageId"], "hello there")
        assert _status(b_turn) == "completed"
        assert [e["data"]["text"] for e in b_turn if e["type"] == "text_delta"]
        assert (await _health(srv))["status"] == "ok"


async def test_under_the_disk_reserve_tools_are_refused_chat_goes_on_and_health_is_degraded(tmp_path: Path) -> None:
    free = {"bytes": 10 << 30}
    async with _two_tenants(tmp_path, free_bytes=lambda: free["bytes"]) as (srv, a, b):
        a_image = await a.new_image("a-box", tools=["bash", "write_file"])
        b_image = await b.new_image("b-box")
        assert (await _health(srv))["status"] == "ok"
        free["bytes"] = 100 * MIB  # under the default reserve of 512 MiB
        why = "the server's disk is nearly full: 100 MiB free, under the reserve of 512 MiB kept for its database"
        health = await _health(srv)
        assert (health["status"], health["problems"]) == ("degraded", [f"disk: {why}"])
        a_turn = await a.turn(a_image["imageId"], "fill the disk", timeout=30)
        assert _results(a_turn) == {
            "toolu_fill": (f"bash: refused: {why}; tools that write are paused until space is freed", True),
            "toolu_more": (f"write_file: refused: {why}", True)}
        assert _status(a_turn) == "completed"
        b_turn = await b.turn(b_image["imageId"], "hello there")
        assert _status(b_turn) == "completed"
        free["bytes"] = 10 << 30
        assert (await _health(srv))["status"] == "ok"
