"""`avm serve` explains itself: a user's mistake is one line with the fix on stderr and exit code 2,
never a traceback (real processes); the banner's lines; console lines or JSON on stderr, JSON in the
log file always."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentvm import __version__
from tests.support.servers import REPO, free_port, serve

pytestmark = pytest.mark.e2e

BANNER_END = "Press Ctrl-C to stop."


def env_without_avm(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AVM_", "LLM_", "ANTHROPIC_"))}
    return {**clean, **extra}


def avm_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "avm.cli", "serve", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=env or env_without_avm())


def assert_refused(out: subprocess.CompletedProcess[str], line: str) -> None:
    assert "Traceback" not in out.stderr
    assert (out.returncode, out.stderr, out.stdout) == (2, line + "\n", "")


@pytest.mark.parametrize(("flags", "line"), [
    (["--flush-ms", "-1"], "avm serve: --flush-ms -1: must be a whole number of milliseconds from 0 to 5000"),
    (["--flush-ms", "5001"], "avm serve: --flush-ms 5001: must be a whole number of milliseconds from 0 to 5000"),
    (["--flush-ms", "1.5"], "avm serve: --flush-ms 1.5: must be a whole number of milliseconds from 0 to 5000"),
    (["--log-level", "LOUD"],
     "avm serve: --log-level LOUD: not a log level; use DEBUG, INFO, WARNING, ERROR or CRITICAL"),
    (["--log-format", "pretty"], "avm serve: --log-format pretty: must be auto, console or json"),
    (["--port", "abc"], "avm serve: --port abc: must be a whole number from 0 to 65535 (0 picks a free port)"),
    (["--port", "70000"], "avm serve: --port 70000: must be a whole number from 0 to 65535 (0 picks a free port)"),
    (["--port", "-1"], "avm serve: --port -1: must be a whole number from 0 to 65535 (0 picks a free port)"),
    (["--port"], "avm serve: Option '--port' requires an argument (see avm serve --help)"),
    (["--script", "{tmp}/missing.yaml"], "avm serve: --script {tmp}/missing.yaml is not a readable file: pass the "
                                         "path of a YAML or JSON script (docs/configuration.md, script_path)"),
    (["--unsafe-unsandboxed-tools=yes"],
     "avm serve: Option '--unsafe-unsandboxed-tools' does not take a value (see avm serve --help)"),
    (["--bogus"], "avm serve: No such option '--bogus'. Did you mean '--host'? (see avm serve --help)"),
])
def test_a_bad_flag_value_is_one_line_naming_the_flag(tmp_path: Path, flags: list[str], line: str) -> None:
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    out = avm_serve("--data-dir", str(tmp_path / "data"), *flags)
    assert_refused(out, line.replace("{tmp}", str(tmp_path)))
    assert not (tmp_path / "data" / "agentvm.db").exists()  # refused before anything was built


@pytest.mark.parametrize(("env", "line"), [
    ({"AVM_LOG_LEVEL": "loud"}, "avm serve: AVM_LOG_LEVEL=loud: not a log level; use DEBUG, INFO, WARNING, ERROR "
                                "or CRITICAL"),
    ({"AVM_LOG_FORMAT": "xml"}, "avm serve: AVM_LOG_FORMAT=xml: must be auto, console or json"),
    ({"AVM_UNSAFE_UNSANDBOXED_TOOLS": "maybe"},
     "avm serve: AVM_UNSAFE_UNSANDBOXED_TOOLS=maybe: must be true or false"),
    ({"AVM_PORT": "eighty"}, "avm serve: AVM_PORT=eighty: must be a whole number from 0 to 65535 (0 picks a free "
                             "port)"),
])
def test_a_bad_variable_of_a_serve_flag_is_named_as_the_variable(tmp_path: Path, env: dict[str, str],
                                                                 line: str) -> None:
    assert_refused(avm_serve("--data-dir", str(tmp_path / "data"), env=env_without_avm(**env)), line)


def test_a_script_that_does_not_parse_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("rules: [\n  - a: b\n")
    (tmp_path / "wrong.yaml").write_text("rules: 5\n")
    out = avm_serve("--port", "0", "--data-dir", str(tmp_path / "data"), "--script", str(tmp_path / "broken.yaml"))
    assert_refused(out, f"avm serve: --script {tmp_path}/broken.yaml: not valid YAML/JSON at line 2, column 3: "
                        "expected the node content, but found '-'")
    out = avm_serve("--port", "0", "--data-dir", str(tmp_path / "data"), "--script", str(tmp_path / "wrong.yaml"))
    assert_refused(out, f"avm serve: --script {tmp_path}/wrong.yaml: rules: Input should be a valid list")


def test_a_host_that_is_not_this_machines_is_one_line(tmp_path: Path) -> None:
    """With an API key, so that the public address is not refused for want of one first."""
    data = tmp_path / "data"
    made = subprocess.run([sys.executable, "-m", "avm.cli", "keys", "create", "--tenant", "acme", "--data-dir",
                           str(data)], capture_output=True, text=True, timeout=60, cwd=REPO, env=env_without_avm())
    assert made.returncode == 0, made.stderr
    out = avm_serve("--host", "192.0.2.1", "--port", "0", "--data-dir", str(data))
    assert_refused(out, "avm serve: --host 192.0.2.1 is not an address of this machine: pass --host 127.0.0.1 (the "
                        "default) or one of its addresses")
    named = avm_serve("--port", "0", "--data-dir", str(data), env=env_without_avm(AVM_HOST="no-such-host.invalid"))
    assert "Traceback" not in named.stderr and named.returncode == 2
    assert named.stderr.startswith("avm serve: AVM_HOST=no-such-host.invalid is not an address of this machine (the "
                                   "name does not resolve: "), named.stderr
    assert named.stderr.endswith("): pass an address such as 127.0.0.1\n") and named.stderr.count("\n") == 1


def test_a_busy_port_is_one_line_with_the_fix(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        out = avm_serve("--port", str(port), "--data-dir", str(tmp_path / "data"))
    assert_refused(out, f"avm serve: port {port} is in use: stop the other server or pass --port")
    assert not (tmp_path / "data" / "agentvm.db").exists()  # checked before the database is migrated


def test_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    out = avm_serve("--port", "0", "--data-dir", str(tmp_path / "file"))
    assert_refused(out, f"avm serve: --data-dir {tmp_path}/file is a file, not a directory: pass a directory (it "
                        "is created if missing)")


def test_a_data_dir_that_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    out = avm_serve("--port", "0", "--data-dir", str(tmp_path / "file" / "data"))
    assert_refused(out, f"avm serve: --data-dir {tmp_path}/file/data cannot be created (Not a directory): pass a "
                        "directory you can create or one that exists")
    variable = avm_serve("--port", "0", env=env_without_avm(AVM_DATA_DIR=str(tmp_path / "file" / "data")))
    assert_refused(variable, f"avm serve: AVM_DATA_DIR={tmp_path}/file/data cannot be created (Not a directory): "
                             "pass a directory you can create or one that exists")


def test_a_data_dir_whose_logs_folder_is_a_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "logs").write_text("x")
    out = avm_serve("--port", "0", "--data-dir", str(data))
    assert_refused(out, f"avm serve: the log file {data}/logs/avm.log cannot be opened ({data}/logs: File exists): "
                        "move that away or pass another --data-dir")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in any directory of a writable filesystem")
def test_a_data_dir_that_is_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    out = avm_serve("--port", "0", "--data-dir", str(locked))
    assert_refused(out, f"avm serve: --data-dir {locked} is not writable by this user: change its permissions or "
                        "pass another --data-dir")


def test_the_unwritable_data_dir_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same check in process, with `os.access` saying no (this runs as root too)."""
    from avm import serve_cmd

    monkeypatch.setattr(serve_cmd.os, "access", lambda path, mode: False)
    with pytest.raises(serve_cmd.StartupRefused) as refused:
        serve_cmd.check_data_dir(tmp_path, f"--data-dir {tmp_path}")
    assert refused.value.line == (f"--data-dir {tmp_path} is not writable by this user: change its permissions or "
                                  "pass another --data-dir")


def banner_lines(port: int, data: Path) -> list[str]:
    return [f"AgentVM {__version__} is running",
            f"  HTTP       http://127.0.0.1:{port}",
            f"  WebSocket  ws://127.0.0.1:{port}/ws",
            f"  API docs   http://127.0.0.1:{port}/docs",
            f"  Console    http://127.0.0.1:{port}/console/",
            "  LLM        scripted (offline; set LLM_API_KEY to use Anthropic)",
            f"  Data       {data}",
            f"  Log file   {data}/logs/avm.log"]


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_console_lines_and_the_banner_with_json_in_the_log_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serve(data, "--log-format", "console") as srv:
        pass
    out = srv.log().splitlines()
    start = out.index(f"AgentVM {__version__} is running")
    assert out[start:start + 8] == banner_lines(srv.port, data)
    assert out[start + 8].startswith("  Sandbox    ") and out[start + 9] == BANNER_END
    migrated = [line for line in out if "database migrated" in line]
    assert len(migrated) == 1 and migrated[0].split(" ", 1)[1] == (
        "INFO    agentvm.adapters.local.sqlite_database  database migrated  from_schema=0 "
        f"schema_version={migrated[0].rsplit('=', 1)[1]}")
    assert not any(line.startswith("{") for line in out)
    # the log file: JSON lines whatever the console shows, the banner's facts as keys
    entries = json_lines((data / "logs" / "avm.log").read_text())
    (startup,) = [e for e in entries if e.get("event") == "startup" and e["level"] == "INFO"]
    base = f"127.0.0.1:{srv.port}"
    assert {k: startup[k] for k in ("http_url", "ws_url", "docs_url", "console_url", "driver", "model",
                                    "data_dir")} == {
        "http_url": f"http://{base}", "ws_url": f"ws://{base}/ws", "docs_url": f"http://{base}/docs",
        "console_url": f"http://{base}/console/", "driver": "scripted", "model": None, "data_dir": str(data)}
    assert "console" not in startup
    assert len([e for e in entries if e["msg"] == "database migrated"]) == 1


def test_json_on_stderr_when_it_is_not_a_terminal(tmp_path: Path) -> None:
    with serve(tmp_path / "data") as srv:  # auto, stderr a file
        pass
    entries = json_lines(srv.log())  # every line is JSON
    (startup,) = [e for e in entries if e.get("event") == "startup" and e["level"] == "INFO"]
    assert startup["docs_url"] == f"http://127.0.0.1:{srv.port}/docs" and "console" not in startup
    assert [e["msg"] for e in entries].count("database migrated") == 1
    again = tmp_path / "again"
    with serve(again, "--log-format", "json", env={"AVM_LOG_FORMAT": "console"}) as srv:  # the flag wins
        pass
    assert all(line.startswith("{") for line in srv.log().splitlines())


def test_auto_is_console_lines_on_a_terminal(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "avm.cli", "serve", "--port", str(port), "--data-dir", str(data)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=secondary, cwd=REPO,
                            env=env_without_avm(NO_COLOR="1"))
    os.close(secondary)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while BANNER_END.encode() not in seen and time.monotonic() < deadline:
            if select.select([primary], [], [], 0.5)[0]:
                try:
                    seen += os.read(primary, 65536)
                except OSError:  # the process ended
                    break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        os.close(primary)
    lines = seen.decode().replace("\r\n", "\n").splitlines()
    assert BANNER_END in lines, seen
    start = lines.index(f"AgentVM {__version__} is running")
    assert lines[start:start + 8] == banner_lines(port, data)
    assert not any(line.startswith("{") for line in lines) and "\x1b[" not in seen.decode()  # NO_COLOR


def test_the_console_formatter_redacts_and_shows_the_fields() -> None:
    import logging

    from agentvm.logs import ConsoleFormatter

    record = logging.LogRecord("agentvm.test", logging.WARNING, __file__, 1, "key %s", ("sk-ant-abc123",), None)
    record.turn_id, record.api_key, record.note = "turn_1", "sk-live", "two words"
    line = ConsoleFormatter().format(record)
    assert line.split(" ", 1)[1] == ('WARNING agentvm.test  key [redacted]  turn_id=turn_1 api_key=[redacted] '
                                     'note="two words"')
    coloured = ConsoleFormatter(colour=True).format(record)
    assert "\x1b[33mWARNING\x1b[0m" in coloured


def test_a_refusal_after_the_port_is_bound_releases_it(tmp_path: Path) -> None:
    """A bad config file is found after the port is bound: the next start gets the port."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "config.yaml").write_text("defaults:\n  markup: .nan\n")
    port = free_port()
    out = avm_serve("--port", str(port), "--data-dir", str(data))
    assert (out.returncode, out.stderr) == (2, f"avm: {data / 'config.yaml'}: defaults.markup: must be a decimal "
                                               "number such as 1.05\n")
    (data / "config.yaml").unlink()
    with serve(data, port=port) as srv:
        assert srv.port == port
    assert f'"port":{port}' in srv.log()  # its banner


def test_the_banner_names_the_model_the_console_and_brackets_ipv6(tmp_path: Path) -> None:
    from types import SimpleNamespace
    from typing import cast

    from agentvm.config import Settings
    from avm.app import Runtime, banner_lines

    rt = SimpleNamespace(settings=Settings(host="::1", data_dir=tmp_path, llm_model="claude-test-1"),
                         driver=SimpleNamespace(name="anthropic"), console_path="/console", tool_sandbox=None)
    assert banner_lines(cast(Runtime, rt), 9000) == [
        f"AgentVM {__version__} is running",
        "  HTTP       http://[::1]:9000",
        "  WebSocket  ws://[::1]:9000/ws",
        "  API docs   http://[::1]:9000/docs",
        "  Console    http://[::1]:9000/console",
        "  LLM        anthropic (claude-test-1)",
        f"  Data       {tmp_path}",
        f"  Log file   {tmp_path}/logs/avm.log",
        BANNER_END]
