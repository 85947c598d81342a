"""One access model for `avm`: every command talks to a running server (`--url`, `--token`,
$AVM_URL, $AVM_TOKEN) and reads a local database only when `--data-dir` is given. Without either,
a command says so in one line with the fix and exits 2, and creates no file (no ~/.agentvm)."""

from __future__ import annotations

import asyncio
import csv
import io
import socket
import time
from pathlib import Path

import httpx
import orjson
import pytest

from agentvm.drivers.scripted import ScriptedDriver
from avm.cli import main
from tests.api.test_sessions_http import finished_turns
from tests.support.servers import in_process

# (argv, can the command read a database instead)
EVERY_COMMAND: list[tuple[list[str], bool]] = [
    (["usage", "show", "--period", "2026-11"], True),
    (["usage", "export", "--period", "2026-11"], True),
    (["keys", "list"], True),
    (["keys", "create", "--name", "x"], True),
    (["keys", "revoke", "avmk_x"], True),
    (["budgets", "list"], True),
    (["budgets", "set", "--monthly", "5"], True),
    (["budgets", "delete"], True),
    (["sessions", "list"], False),
    (["sessions", "show", "sess_x"], False),
    (["sessions", "search", "word"], False),
    (["sessions", "export", "sess_x"], False),
    (["config", "get"], False),
]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty $HOME and working directory, and no AgentVM variable but those a test sets."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home)
    for name in ("AVM_URL", "AVM_TOKEN", "AVM_DATA_DIR", "AVM_TABLE_NAME"):
        monkeypatch.delenv(name, raising=False)
    return home


def avm(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    # the command's own lines (log handlers left by other tests may write to stderr too)
    return code, out, [line for line in err.splitlines() if line.startswith(("avm", "(more"))]


def token_of(out: str) -> str:
    return out.split("token (shown once, keep it secret): ")[1].split()[0]


@pytest.mark.parametrize(("argv", "local"), EVERY_COMMAND, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_without_a_server_or_data_dir_one_line_with_the_fix_and_no_file(
        argv: list[str], local: bool, home: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as held:  # bound and never listening: refused, and no other test can take the port
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        monkeypatch.setenv("AVM_URL", f"http://127.0.0.1:{port}")
        code, out, err = avm(capsys, *argv)
    assert (code, out) == (2, "")
    [line] = err
    command = argv[0]
    assert line.startswith(f"avm {command}: cannot reach http://127.0.0.1:{port} (")
    fix = "start `avm serve`, or pass --url URL (or set AVM_URL)"
    assert line.endswith(fix + ("; to read a stopped server's database, pass its --data-dir DIR" if local else ""))
    assert list(home.rglob("*")) == []


@pytest.mark.parametrize("argv", [["usage", "show", "--tenant", "acme", "--period", "2026-11"],
                                  ["keys", "list", "--tenant", "acme"], ["budgets", "list", "--tenant", "acme"]])
def test_a_data_dir_without_a_database_is_not_created_by_a_read(argv: list[str], home: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    data = home / "not-yet"
    code, out, err = avm(capsys, *argv, "--data-dir", str(data))
    assert (code, out) == (2, "")
    assert err == [f"avm: --data-dir {data}: no database there (agentvm.db); give the directory avm serve was "
                   "started with (its --data-dir, default ~/.agentvm)"]
    assert not data.exists()
    without_tenant = [a for a in argv if a not in ("--tenant", "acme")]
    code, _, err = avm(capsys, *without_tenant, "--data-dir", str(data))
    assert code == 2 and err == [f"avm: {' '.join(argv[:2])}: --tenant: required with --data-dir or --table "
                                 "(which tenant)"]
    assert list(home.rglob("*")) == []


async def test_keys_budgets_and_usage_against_a_server(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = home / "data"
    code, out, _ = await asyncio.to_thread(avm, capsys, "keys", "create", "--tenant", "acme", "--scope", "admin",
                                           "--name", "ops", "--data-dir", str(data))
    assert code == 0
    admin = token_of(out)
    code, out, _ = await asyncio.to_thread(avm, capsys, "keys", "create", "--tenant", "bob", "--data-dir", str(data))
    bob = token_of(out)
    period = time.strftime("%Y-%m", time.gmtime())
    async with in_process(data, driver=ScriptedDriver(), auth="keys") as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10, headers={"authorization": f"Bearer {admin}"}) as http:
        image = (await http.post("/v1/images", json={"containerId": "c-u"})).json()
        await http.post(f"/v1/sessions/{image['sessionId']}/messages", json={"content": "count me"})
        await finished_turns(http, image["sessionId"], 1)

        def as_acme(*argv: str) -> tuple[int, str, list[str]]:
            return avm(capsys, *argv, "--url", srv.http, "--token", admin)

        code, out, err = await asyncio.to_thread(as_acme, "keys", "create", "--name", "ci")
        assert (code, err) == (0, []) and "tenant: acme  scopes: user" in out
        ci_key = out.split("key id: ")[1].split()[0]
        code, out, _ = await asyncio.to_thread(as_acme, "keys", "list")
        assert code == 0 and sorted(line.split()[-1] for line in out.splitlines()) == ["ci", "ops"]
        assert ci_key in out and "bob" not in out
        code, out, _ = await asyncio.to_thread(as_acme, "keys", "revoke", ci_key)
        assert (code, out) == (0, f"revoked {ci_key}\n")

        code, out, _ = await asyncio.to_thread(as_acme, "budgets", "set", "--monthly", "25.00", "--rpm", "60")
        assert (code, out) == (0, "tenant: 25.00 USD/month, 60 turns/min\nrunning servers apply it within 30 s\n")
        code, out, _ = await asyncio.to_thread(as_acme, "budgets", "list")
        lines = out.splitlines()
        assert code == 0 and lines[0].startswith(f"your tenant  {period}: spent ")
        assert lines[1].startswith("tenant: 25.00 USD/month, 60 turns/min  spent ")
        code, out, _ = await asyncio.to_thread(as_acme, "budgets", "delete")
        assert (code, out) == (0, "deleted the budget of your tenant\n")

        # the server's usage is the same report as the database's, read with --data-dir and --tenant
        code, over_http, _ = await asyncio.to_thread(as_acme, "usage", "show", "--period", period)
        assert code == 0
        code, direct, _ = await asyncio.to_thread(avm, capsys, "usage", "show", "--period", period, "--tenant",
                                                  "acme", "--data-dir", str(data))
        assert code == 0 and orjson.loads(over_http) == orjson.loads(direct)
        assert orjson.loads(over_http)["total"]["calls"] == 1
        code, text, _ = await asyncio.to_thread(as_acme, "usage", "export", "--period", period)
        rows = list(csv.DictReader(io.StringIO(text)))
        assert code == 0 and len(rows) >= 1 and {r["BillingAccountId"] for r in rows} == {"acme"}
        out_file = home / "mine.csv"
        code, out, _ = await asyncio.to_thread(as_acme, "usage", "export", "--period", period, "--out", str(out_file))
        assert (code, out) == (0, f"wrote {out_file} ({len(rows)} rows, focus, {period}, your tenant)\n")

        # a server answers for its caller's tenant: --tenant there is refused, not ignored
        code, _, err = await asyncio.to_thread(as_acme, "usage", "show", "--period", period, "--tenant", "bob")
        assert code == 2 and err == ["avm: usage show: --tenant: a server answers for the tenant of your key "
                                     "(--token); another tenant's: --data-dir DIR (avm serve's database) or "
                                     "--table TABLE"]
        # the server's refusals, one line each
        code, _, err = await asyncio.to_thread(avm, capsys, "keys", "create", "--url", srv.http, "--token", bob)
        assert code == 1 and err == ["avm keys: Only an admin key may create keys (check --token or $AVM_TOKEN)"]
        code, _, err = await asyncio.to_thread(avm, capsys, "budgets", "list", "--url", srv.http)
        assert code == 1 and len(err) == 1 and err[0].startswith("avm budgets: ") and "--token" in err[0]
    names = await asyncio.to_thread(lambda: sorted(p.name for p in home.iterdir()))
    assert names == ["data", "mine.csv"]  # nothing else, no ~/.agentvm


async def test_avm_sessions_list_show_and_search(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = home / "data"
    tokens = {}
    for tenant in ("acme", "bob"):
        code, out, _ = await asyncio.to_thread(avm, capsys, "keys", "create", "--tenant", tenant, "--data-dir",
                                               str(data))
        tokens[tenant] = token_of(out)
    async with in_process(data, driver=ScriptedDriver(), auth="keys") as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10,
                              headers={"authorization": f"Bearer {tokens['acme']}"}) as http:
        first = (await http.post("/v1/images", json={"containerId": "c-s"})).json()
        await asyncio.sleep(0.003)  # distinct creation times: equal ones are ordered by the (random) id
        second = (await http.post(f"/v1/images/{first['imageId']}/sessions", json={"title": "rambutan talk"})).json()
        await http.post(f"/v1/sessions/{second['sessionId']}/messages", json={"content": "a ripe rambutan"})
        [turn] = await finished_turns(http, second["sessionId"], 1)

        def sessions(*argv: str, who: str = "acme") -> tuple[int, str, list[str]]:
            return avm(capsys, "sessions", "--url", srv.http, "--token", tokens[who], *argv)

        code, out, err = await asyncio.to_thread(sessions, "list")
        assert (code, err) == (0, [])
        assert [line.split()[0] for line in out.splitlines()] == [second["sessionId"], first["sessionId"]]
        assert out.splitlines()[0].endswith(f"{first['imageId']}  c-s  rambutan talk")
        code, out, err = await asyncio.to_thread(sessions, "list", "--limit", "1")
        assert code == 0 and out.split()[0] == second["sessionId"] and len(out.splitlines()) == 1
        [more] = err
        assert more.startswith("(more: --cursor ") and more.endswith(", or --all)")
        cursor = more.split("--cursor ")[1].split(",")[0]
        code, out, err = await asyncio.to_thread(sessions, "list", "--limit", "1", "--cursor", cursor)
        assert (code, out.split()[0], err) == (0, first["sessionId"], [])
        code, out, _ = await asyncio.to_thread(sessions, "list", "--limit", "1", "--all", "--json")
        listed = orjson.loads(out)
        assert [s["sessionId"] for s in listed["items"]] == [second["sessionId"], first["sessionId"]]
        assert listed["nextCursor"] is None
        code, out, _ = await asyncio.to_thread(sessions, "list", "--image", first["imageId"], "--json")
        assert len(orjson.loads(out)["items"]) == 2
        code, out, err = await asyncio.to_thread(sessions, "list", who="bob")  # another tenant's: never listed
        assert (code, out, err) == (0, "(no sessions)\n", [])

        code, out, err = await asyncio.to_thread(sessions, "show", second["sessionId"])
        assert (code, err) == (0, [])
        lines = out.splitlines()
        assert lines[0] == f"session   {second['sessionId']}"
        assert lines[2:4] == ["container c-s", "title     rambutan talk"]
        assert lines[-3].startswith("turns     1  billed ") and lines[-2:] == [
            "you: a ripe rambutan", "assistant: You said: a ripe rambutan"]
        code, out, _ = await asyncio.to_thread(sessions, "show", second["sessionId"], "--json")
        shown = orjson.loads(out)
        assert [t["turnId"] for t in shown["turns"]] == [turn["turnId"]] and len(shown["messages"]) == 2
        code, out, err = await asyncio.to_thread(sessions, "show", second["sessionId"], who="bob")
        assert (code, out, err) == (1, "", [f"avm sessions: Session not found: {second['sessionId']}"])

        code, out, err = await asyncio.to_thread(sessions, "search", "rambutans")  # stemmed
        assert code == 0 and err == []
        assert [line.split()[0] for line in out.splitlines()] == [second["sessionId"]] * 2
        assert "a ripe rambutan" in out and "<mark>" not in out
        code, out, _ = await asyncio.to_thread(sessions, "search", "rambutan", who="bob")
        assert (code, out) == (0, "(no matches)\n")
        code, _, err = await asyncio.to_thread(sessions, "list", "--limit", "0")
        assert (code, err) == (2, ["avm sessions list: --limit: must be 1 to 200, not 0"])
