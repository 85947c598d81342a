"""A damaged database is found at start-up, not by users (issue 15, point 7).

Before: a page of garbage in the middle of the file passed start-up, `/health` said ok and every
authenticated request got a plain-text 500; a damaged header stopped start-up with a traceback.
Now `avm serve` runs `PRAGMA quick_check` before it listens and stops with one line naming the file
and what to do (exit code 2); damage met at run time answers 503 `storage_unavailable` in the JSON
error shape (HTTP) or as an error response (WebSocket), and `/health` reports it."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentvm.adapters.local import sqlite_integrity
from agentvm.adapters.local.sqlite_integrity import check_database
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.errors import StorageUnavailable
from tests.support.servers import REPO, in_process
from tests.support.stock_client import StockClient

GARBAGE = bytes(range(256)) * 16  # one 4 KiB page; its first byte (0) is no b-tree page type
ADVICE = ("stop AgentVM, move {db} aside together with its -wal and -shm files, and restore it from a backup (or "
          "start with an empty data directory; `sqlite3 {db} .recover` may save what is still readable)")


def make_database(data: Path, rows: int = 3000) -> Path:
    """A real AgentVM database with `rows` messages (about 2 MB), its WAL checkpointed into the file."""
    db = data / "agentvm.db"

    async def migrate() -> None:
        store = SqliteStore(db)
        await store.open()
        await store.close()

    asyncio.run(migrate())
    with sqlite3.connect(db) as conn:
        conn.executemany("INSERT INTO messages (tenant_id, session_id, message_id, body, created_at) "
                         "VALUES ('t', 's', ?, ?, 1)", ((f"m{i}", '{"text": "' + "x" * 600 + '"}')
                                                        for i in range(rows)))
    conn.close()
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0
    return db


def write_page(db: Path, page: int, data: bytes = GARBAGE) -> None:
    with open(db, "r+b") as f:
        f.seek((page - 1) * 4096)
        f.write(data)


def serve(data: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AVM_", "LLM_", "ANTHROPIC_"))}
    return subprocess.run([sys.executable, "-m", "avm.cli", "serve", "--port", "0", "--data-dir", str(data)],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env={**clean, **env})


def test_a_damaged_page_stops_avm_serve_with_one_line(tmp_path: Path) -> None:
    db = make_database(tmp_path / "data")
    pages = db.stat().st_size // 4096
    assert pages > 400
    write_page(db, pages // 2)
    out = serve(tmp_path / "data")
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith(f"avm: the database {db} is damaged (Page "), out.stderr
    assert out.stderr.endswith(f"): {ADVICE.format(db=db)}\n"), out.stderr


@pytest.mark.parametrize("auth", ["open", "keys"])
def test_a_damaged_header_stops_avm_serve_with_one_line(tmp_path: Path, auth: str) -> None:
    db = make_database(tmp_path / "data", rows=10)
    write_page(db, 1, b"this is not an SQLite header" * 4)
    out = serve(tmp_path / "data", AVM_AUTH=auth)  # with keys, before the key count reads the file
    assert (out.returncode, out.stderr) == (
        2, f"avm: the database {db} is damaged (file is not a database): {ADVICE.format(db=db)}\n")


def test_a_sound_database_passes_and_a_missing_one_is_not_created(tmp_path: Path) -> None:
    db = make_database(tmp_path / "data", rows=100)
    assert check_database(db, budget_s=30) is True
    missing = tmp_path / "none" / "agentvm.db"
    assert check_database(missing, budget_s=30) is True and not missing.exists()
    write_page(db, 3)
    assert check_database(db, budget_s=0) is True  # AVM_DB_CHECK_S=0: no check
    with pytest.raises(StorageUnavailable, match=r"is damaged \(Page 3: "):
        check_database(db, budget_s=30)


def test_the_check_is_bounded_in_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      caplog: pytest.LogCaptureFixture) -> None:
    db = make_database(tmp_path / "data")
    write_page(db, db.stat().st_size // 4096 - 1)  # damage the check would only reach at the end
    monkeypatch.setattr(sqlite_integrity, "_PROGRESS_STEPS", 1)
    with caplog.at_level(logging.WARNING, logger="agentvm.adapters.local.sqlite_integrity"):
        assert check_database(db, budget_s=1e-9) is False
    [record] = [r for r in caplog.records if r.name == "agentvm.adapters.local.sqlite_integrity"]
    assert record.getMessage().startswith(f"the integrity check of {db} did not finish in 1e-09 s (AVM_DB_CHECK_S)")


async def test_damage_at_run_time_answers_503_and_health_reports_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with in_process(data) as srv, httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        image = (await http.post("/v1/images", json={"containerId": "c-db"})).json()
        assert (await http.post(f"/v1/sessions/{image['sessionId']}/messages",
                                json={"content": "hello"})).status_code == 202
        for _ in range(200):
            if len((await http.get(f"/v1/sessions/{image['sessionId']}/messages")).json()["items"]) >= 2:
                break
            await asyncio.sleep(0.02)
    db = data / "agentvm.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        [root] = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'").fetchone()
    conn.close()

    async with in_process(data) as srv, httpx.AsyncClient(base_url=srv.http, timeout=10) as http, \
            StockClient(srv.url) as ws:
        assert (await http.get("/health")).json()["status"] == "ok"
        write_page(db, root)  # the messages table's root page, while the server runs
        await srv.runtime.store.run(lambda c: c.execute("PRAGMA shrink_memory"))  # as memory pressure would

        res = await http.get(f"/v1/sessions/{image['sessionId']}/messages")
        assert res.status_code == 503, res.text
        assert res.headers["content-type"] == "application/json"
        assert res.json() == {"error": {"code": "storage_unavailable", "message": (
            "The database cannot be read or written (database disk image is malformed); the operator has to "
            "repair or restore it (see /health).")}}

        health = (await http.get("/health")).json()
        assert health["status"] == "degraded"
        [problem] = health["problems"]
        assert problem.startswith("storage: the database is damaged (database disk image is malformed, last seen ")
        assert problem.endswith("stop AgentVM and restore the database file from a backup (docs/reliability.md)")
        assert str(db) not in problem  # /health answers anyone: the log names the file
        chat = (await http.get("/api/v1/health")).json()
        assert (chat["status"], chat["store"]) == ("degraded", "error: StorageUnavailable")

        # a WebSocket request is answered with the error, not left hanging
        answer = await ws.request("message_send_request", {"imageId": image["imageId"], "content": "still there?"},
                                  timeout=15)
        assert answer["data"]["errorCode"] == "storage_unavailable", answer
        assert answer["data"]["error"].startswith("The database cannot be read or written (database disk image")


async def test_a_turn_whose_configuration_cannot_be_read_fails_with_the_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with in_process(data):
        pass  # the database, migrated and closed
    db = data / "agentvm.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        [root] = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'config_values'").fetchone()
    conn.close()
    async with in_process(data) as srv, StockClient(srv.url) as ws:
        image = await ws.new_image("c-cfg")
        write_page(db, root)  # each turn reads the runtime configuration first
        await srv.runtime.store.run(lambda c: c.execute("PRAGMA shrink_memory"))
        events = await ws.turn(image["imageId"], "hello", timeout=15)  # answered, not hung
        errors = [e["data"] for e in events if e["type"] == "error_occurred"]
        assert [e["code"] for e in errors] == ["storage_unavailable"], events
        assert [e["data"]["status"] for e in events if e["type"] == "turn_response"] == ["failed"]
