"""`avm doctor` (the post-deploy smoke test, docs/deploy.md) run as a process against a real `avm serve`:
every step passes (with an API key, and in the open local mode), a bad key fails the auth step, a
server that is down fails the health step, and usage mistakes are one line with exit code 2."""

from __future__ import annotations

import http.server
import json
import re
import threading
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from agentvm import __version__
from tests.support.servers import avm, create_key, free_port, serve

pytestmark = pytest.mark.e2e

ID = r"[a-z0-9_]+"


def assert_lines(out: str, patterns: list[str]) -> list[re.Match[str]]:
    lines = out.splitlines()
    assert len(lines) == len(patterns), out
    matches = []
    for line, pattern in zip(lines, patterns, strict=True):
        match = re.fullmatch(pattern, line)
        assert match, f"{line!r} does not match {pattern!r}"
        matches.append(match)
    return matches


def passing(http: str, model: str, key_line: str, image_model: str | None = None) -> list[str]:
    turn = (rf"turn ({ID}) completed: 17 characters from {re.escape(model)}, \d+ ms, (\d+\.\d{{8}}) USD billed")
    return [
        rf"PASS  health          {re.escape(http)}/health: ok, version {re.escape(__version__)}",
        rf"PASS  auth            {re.escape(key_line)}",
        rf"PASS  image           image ({ID}) in container avm-doctor, model {re.escape(image_model or model)}",
        rf"PASS  websocket turn  {turn}",
        rf"PASS  sse turn        {turn}",
        r"PASS  usage           2 records of 2 turns: \d+ input and \d+ output tokens, (\d+\.\d{8}) USD billed "
        r"\(provider scripted\)",
        rf"PASS  cleanup         deleted image ({ID}) \(the usage records stay: they are the bill\)",
        r"avm doctor: all 7 steps passed; the test turns cost (\d+\.\d{8}) USD billed",
    ]


def test_every_step_passes_with_a_key_and_cleans_up(tmp_path: Path) -> None:
    data = tmp_path / "data"
    token = create_key(data, "smoke")
    with serve(data, env={"AVM_AUTH": "keys"}) as srv:
        done = avm("doctor", "--url", srv.http, "--token", token)
        assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
        m = assert_lines(done.stdout, passing(srv.http, "claude-haiku-4-5", "/v1/usage answered with this key"))
        image, ws_turn, ws_cost, sse_turn, sse_cost, usage_cost, deleted, total = (
            m[2][1], m[3][1], m[3][2], m[4][1], m[4][2], m[5][1], m[6][1], m[7][1])
        assert deleted == image and ws_turn != sse_turn
        # the turns are priced as haiku (the scripted driver answers in the image's model): nonzero, and
        # the ledger's records add up to what the two turns reported
        assert Decimal(ws_cost) > 0 and Decimal(sse_cost) > 0
        assert Decimal(usage_cost) == Decimal(total) == Decimal(ws_cost) + Decimal(sse_cost)

        auth = {"authorization": f"Bearer {token}"}
        assert httpx.get(f"{srv.http}/v1/images/{image}", headers=auth, timeout=5).status_code == 404
        export = httpx.get(f"{srv.http}/v1/usage/export", params={"period": _today(), "format": "jsonl"},
                           headers=auth, timeout=5)
        records = [json.loads(line) for line in export.text.splitlines()]
        assert sorted(r["turnId"] for r in records) == sorted([ws_turn, sse_turn])
        assert {(r["tenantId"], r["containerId"], r["imageId"], r["kind"]) for r in records} == \
            {("smoke", "avm-doctor", image, "llm")}


def test_open_mode_on_the_websocket_url_with_the_servers_model(tmp_path: Path) -> None:
    with serve(tmp_path / "data") as srv:
        done = avm("doctor", "--url", srv.url, "--model", "default")
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
    m = assert_lines(done.stdout, passing(srv.http, "scripted", "/v1/usage answered without a key (open mode)",
                                          image_model="of the server's default"))
    assert m[7][1] == "0.00000000"  # the scripted model has no price


def test_a_bad_key_fails_the_auth_step(tmp_path: Path) -> None:
    data = tmp_path / "data"
    create_key(data, "smoke")
    with serve(data, env={"AVM_AUTH": "keys"}) as srv:
        bad = avm("doctor", "--url", srv.http, "--token", "avmk_000000000000.nope")
        missing = avm("doctor", "--url", srv.http)
    skipped = ["SKIP  image           needs an accepted API key",
               "SKIP  websocket turn  needs an image",
               "SKIP  sse turn        needs an image",
               "SKIP  usage           needs a turn that completed",
               "SKIP  cleanup         needs an image to delete",
               "avm doctor: 1 of 7 steps failed (auth), 5 skipped"]
    health = f"PASS  health          {srv.http}/health: ok, version {__version__}"
    assert (bad.returncode, bad.stderr) == (1, "")
    assert bad.stdout.splitlines() == [
        health,
        "FAIL  auth            the API key was refused: HTTP 401 unauthorized: API key not valid — fix: --token must "
        "be an active API key of this deployment (avm keys create --tenant T, with --data-dir DIR, or --table "
        "<TableName> for a stack)",
        *skipped]
    assert (missing.returncode, missing.stderr) == (1, "")
    assert missing.stdout.splitlines() == [
        health,
        "FAIL  auth            the API key was refused: HTTP 401 unauthorized: API key required: send the header "
        "`Authorization: Bearer <key>` — fix: this server requires an API key: pass --token or set $AVM_TOKEN "
        "(avm keys create --tenant T --data-dir DIR)",
        *skipped]


def test_failed_turns_fail_their_steps_and_the_image_is_still_deleted(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("rules:\n  - match: OK\n    responses:\n"
                      "      - error: {code: authentication_error, message: invalid x-api-key}\n")
    with serve(tmp_path / "data", "--script", str(script)) as srv:
        done = avm("doctor", "--url", srv.http)
        images = httpx.get(f"{srv.http}/v1/images", timeout=5).json()["items"]
    assert (done.returncode, done.stderr) == (1, "")
    turn_failed = ("the turn failed (authentication_error): invalid x-api-key — fix: the LLM key: see "
                   "docs/deploy.md, 'Store the LLM key'")
    m = assert_lines(done.stdout, [
        rf"PASS  health          {re.escape(srv.http)}/health: ok, version {re.escape(__version__)}",
        r"PASS  auth            /v1/usage answered without a key \(open mode\)",
        rf"PASS  image           image ({ID}) in container avm-doctor, model claude-haiku-4-5",
        rf"FAIL  websocket turn  {re.escape(turn_failed)}",
        rf"FAIL  sse turn        {re.escape(turn_failed)}",
        r"SKIP  usage           needs a turn that completed",
        rf"PASS  cleanup         deleted image ({ID}) \(the usage records stay: they are the bill\)",
        r"avm doctor: 2 of 7 steps failed \(websocket turn, sse turn\), 1 skipped",
    ])
    assert m[6][1] == m[2][1] and images == []


def test_a_server_that_is_down_fails_the_health_step() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = avm("doctor", env_extra={"AVM_URL": url})  # the URL from the environment, as for `avm chat`
    assert (done.returncode, done.stderr) == (1, "")
    assert done.stdout.splitlines() == [
        f"FAIL  health          cannot reach {url}: All connection attempts failed — fix: is the server running and "
        "is the URL right? (a stack: the outputs of `aws cloudformation describe-stacks`)",
        "SKIP  auth            needs a server that answers",
        "SKIP  image           needs an accepted API key",
        "SKIP  websocket turn  needs an image",
        "SKIP  sse turn        needs an image",
        "SKIP  usage           needs a turn that completed",
        "SKIP  cleanup         needs an image to delete",
        "avm doctor: 1 of 7 steps failed (health), 6 skipped",
    ]


def test_a_server_that_is_not_agentvm_fails_with_one_line() -> None:
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>it works</html>"
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        done = avm("doctor", "--url", url)
    finally:
        server.shutdown()
        server.server_close()
    assert (done.returncode, done.stderr) == (1, "")
    assert done.stdout.splitlines()[:2] == [
        "FAIL  health          unexpected answer (JSONDecodeError: Expecting value: line 1 column 1 (char 0)) — fix: "
        "do the URLs lead to an AgentVM server of this version?",
        "SKIP  auth            needs a server that answers",
    ]


@pytest.mark.parametrize(("argv", "line"), [
    ((), "avm doctor: --url: required (avm serve: http://127.0.0.1:8080; a stack: its HttpApiUrl output), or set "
         "$AVM_URL"),
    (("--url", "127.0.0.1:8080"), "avm doctor: --url: must be a URL starting with http://, https://, ws:// "
                                  "or wss:// and naming a host, not '127.0.0.1:8080'"),
    (("--url", "https://api.example.com", "--ws-url", "https://ws.example.com"),
     "avm doctor: --ws-url: must be a URL starting with ws:// or wss:// and naming a host, not "
     "'https://ws.example.com'"),
    (("--url", "https://api.example.com", "--stream-url", "wss://x.example.com"),
     "avm doctor: --stream-url: must be a URL starting with http:// or https:// and naming a host, not "
     "'wss://x.example.com'"),
    (("--url", "http://127.0.0.1:8080", "--timeout", "0"),
     "avm doctor: --timeout: must be a positive number of seconds"),
])
def test_usage_mistakes_are_one_line_and_exit_2(argv: tuple[str, ...], line: str) -> None:
    done = avm("doctor", *argv)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")


def _today() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%d")
