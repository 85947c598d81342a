"""Log lines never carry a credential, whoever writes them (issue 15, point 12): agentvm.logs redacts
query credentials, credential headers, URL user information and registered secret values, on every
handler; the HTTP client libraries are turned down to WARNING."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentvm import logs
from agentvm.domain.config_secrets import secret_values
from agentvm.logs import QUIET_LOGGERS, redact, register_secrets, setup_logging
from agentvm.tools.mcp import parse_mcp_servers


@pytest.mark.parametrize(("line", "want"), [
    ('HTTP Request: POST http://127.0.0.1:5/mcp?token=abc123&v=1 "HTTP/1.1 200 OK"',
     'HTTP Request: POST http://127.0.0.1:5/mcp?token=[redacted]&v=1 "HTTP/1.1 200 OK"'),
    ('127.0.0.1:5 - "WebSocket /ws?api_key=k1&x=2" [accepted]',
     '127.0.0.1:5 - "WebSocket /ws?api_key=[redacted]&x=2" [accepted]'),
    ("https://s3/o?X-Amz-Signature=abc&X-Amz-Credential=AK%2F1&X-Amz-Security-Token=zz",
     "https://s3/o?X-Amz-Signature=[redacted]&X-Amz-Credential=[redacted]&X-Amz-Security-Token=[redacted]"),
    ("fetching https://bot:hunter22@git.example.com/repo", "fetching https://[redacted]@git.example.com/repo"),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: [redacted]"),
    ("headers={'x-api-key': 'k123', 'accept': 'json'}", "headers={'x-api-key': '[redacted]', 'accept': 'json'}"),
    ("[(b'authorization', b'Basic zzz'), (b'cookie', b'sid=1')]",
     "[(b'authorization', b'[redacted]'), (b'cookie', b'[redacted]')]"),
    ("search?q=rambutan&limit=20", "search?q=rambutan&limit=20"),  # nothing secret: unchanged
    ("the authorization failed", "the authorization failed"),
])
def test_credentials_in_a_line_are_redacted(line: str, want: str) -> None:
    assert redact(line) == want


def test_registered_values_are_redacted_in_every_form() -> None:
    register_secrets(["short", "s3cret/value with space"])
    assert redact("short") == "short"  # under 8 characters: too likely to be a word
    assert redact("a s3cret/value with space b s3cret%2Fvalue%20with%20space c s3cret%2Fvalue+with+space") == \
        "a [redacted] b [redacted] c [redacted]"


def test_an_mcp_servers_secrets_are_what_the_pool_registers() -> None:
    servers = parse_mcp_servers({
        "web": {"type": "http", "url": "https://u:pw123456@h/mcp?k=urlsecret1",
                "headers": {"Authorization": "Bearer hdrsecret1"}},
        "files": {"command": "srv", "args": ["--token", "argsecret1", "--port", "8080"], "env": {"A": "envsecret1"}}})
    assert sorted(secret_values(servers["web"])) == sorted(
        ["Bearer hdrsecret1", "hdrsecret1", "u", "pw123456", "urlsecret1", "urlsecret1"])
    assert secret_values(servers["files"]) == ["envsecret1", "argsecret1"]


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[tuple[io.StringIO, Path]]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    log_file = tmp_path / "logs" / "avm.log"
    setup_logging("DEBUG", log_file=log_file)
    root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
    try:
        yield stream, log_file
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])


def test_third_party_loggers_are_quiet_and_filtered(logged: tuple[io.StringIO, Path]) -> None:
    stream, log_file = logged
    logging.getLogger("httpx2").info('HTTP Request: POST %s "HTTP/1.1 200 OK"', "http://h/mcp?token=PLANTEDq1")
    logging.getLogger("uvicorn.error").info('%s - "WebSocket %s" [accepted]', "1.2.3.4", "/ws?token=PLANTEDw1")
    logging.getLogger("some.library").warning("retrying %s", "http://h/x?access_token=PLANTEDa1")
    logging.getLogger("some.library").info("raw", extra={"url": "http://h/x?sig=PLANTEDs1", "api_token": "PLANTEDt1"})
    for h in logging.getLogger().handlers:
        h.flush()
    out, written = stream.getvalue(), log_file.read_text()
    for text in (out, written):
        assert "PLANTED" not in text, text
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(e["logger"], e["msg"]) for e in lines] == [
        ("some.library", "retrying http://h/x?access_token=[redacted]"), ("some.library", "raw")]
    assert (lines[1]["url"], lines[1]["api_token"]) == ("http://h/x?sig=[redacted]", "[redacted]")
    assert all(logging.getLogger(name).level == logging.WARNING for name in QUIET_LOGGERS)
    ours = [h for h in logging.getLogger().handlers if isinstance(h.formatter, logs.JsonFormatter)]
    assert len(ours) == 2 and all(any(isinstance(f, logs.SecretFilter) for f in h.filters) for h in ours)
