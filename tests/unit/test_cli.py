"""The `avm` command line on click (issue 19, item 5): `avm --version`, help on every group and
command, shell completion (bash, zsh, fish), a usage mistake as one line naming the command and the
flag with exit code 2, and `--url`/`--token` taken on a group or on its action."""

from __future__ import annotations

import os
import subprocess
import sys

import click
import pytest

from agentvm import __version__
from avm import cli, sessions_read
from avm.cli import main
from avm.runner import Args
from avm.server_args import server
from tests.support.servers import REPO

GROUPS = {name: command for name, command in cli.avm.commands.items() if isinstance(command, click.Group)}


@pytest.fixture(autouse=True)
def eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Help is wrapped to the terminal: the same width wherever the tests run."""
    monkeypatch.setenv("COLUMNS", "80")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def avm_process(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AVM_", "_AVM_", "COMP_"))}
    return subprocess.run([sys.executable, "-m", "avm.cli", *argv], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={**clean, **env})


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "--version") == (0, f"avm {__version__}\n", "")
    done = avm_process("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"avm {__version__}\n", "")


def test_every_group_is_there() -> None:
    assert sorted(GROUPS) == ["budgets", "config", "keys", "sessions", "usage"]
    assert sorted(cli.avm.commands) == ["budgets", "chat", "config", "doctor", "keys", "serve", "sessions", "usage"]


def listed(help_text: str) -> dict[str, str]:
    """The `Commands:` section of a help text: name -> its one-line description (wrapped lines joined)."""
    rows: dict[str, str] = {}
    section = help_text.split("\nCommands:\n", 1)[1]
    for line in section.splitlines():
        if line.startswith("    ") and rows:  # the description wrapped onto the next line
            last = list(rows)[-1]
            rows[last] += " " + line.strip()
        elif line.strip():
            name, _, text = line.strip().partition(" ")
            rows[name] = text.strip()
    return rows


@pytest.mark.parametrize("argv", [["--help"], ["-h"]])
def test_avm_help_lists_every_command_with_its_description(capsys: pytest.CaptureFixture[str],
                                                           argv: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, err) == (0, "")
    assert out.startswith("Usage: avm [OPTIONS] COMMAND [ARGS]...\n")
    assert listed(out) == {name: command.get_short_help_str(limit=200) for name, command in cli.avm.commands.items()}
    assert listed(out)["sessions"] == "your sessions on a server: list, show, search, export, import"


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_each_group_help_lists_its_commands(capsys: pytest.CaptureFixture[str], group: str) -> None:
    code, out, err = run(capsys, group, "--help")
    assert (code, err) == (0, "")
    assert out.startswith(f"Usage: avm {group} [OPTIONS] COMMAND [ARGS]...\n")
    commands = GROUPS[group].commands
    rows = listed(out)
    assert sorted(rows) == sorted(commands)
    for name, command in commands.items():
        assert command.help and rows[name] == command.help.rstrip(".") + "." and len(rows[name]) > 10


def test_sessions_help_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "sessions", "--help")
    assert listed(out) == {
        "export": "Write a session (image snapshot, messages, turns, usage) as JSON.",
        "import": "Restore an archive into a container (a new image and session).",
        "list": "Your sessions, newest first (every image's, or one image's).",
        "search": "Full-text search of your messages, best first.",
        "show": "One session: its image, turns and cost, and its conversation."}
    assert "--url URL " in out and "--token KEY " in out


def leaves() -> list[list[str]]:
    found = [[name] for name, command in cli.avm.commands.items() if not isinstance(command, click.Group)]
    found += [[group, name] for group, g in GROUPS.items() for name in g.commands]
    return sorted(found)


@pytest.mark.parametrize("path", leaves(), ids=" ".join)
def test_every_command_has_help(capsys: pytest.CaptureFixture[str], path: list[str]) -> None:
    code, out, err = run(capsys, *path, "--help")
    assert (code, err) == (0, "")
    assert out.startswith(f"Usage: avm {' '.join(path)} [OPTIONS]")
    assert "\nOptions:\n" in out and "-h, --help" in out


def test_a_group_without_its_command_shows_its_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "keys")
    assert (code, out) == (2, "")
    assert err.startswith("Usage: avm keys [OPTIONS] COMMAND [ARGS]...\n")
    assert sorted(listed(err)) == ["create", "list", "revoke"]


@pytest.mark.parametrize(("argv", "line"), [
    (["sessions", "list", "--limit", "x"],
     "avm sessions list: Invalid value for '--limit': 'x' is not a valid integer (see avm sessions list --help)"),
    (["keys", "create", "--scope", "root"],
     "avm keys create: Invalid value for '--scope': 'root' is not one of 'user', 'admin', 'operator' "
     "(see avm keys create --help)"),
    (["keys", "create", "--expires-days", "soon"],
     "avm keys create: Invalid value for '--expires-days': 'soon' is not a valid integer "
     "(see avm keys create --help)"),
    (["usage", "export", "--period", "2026-11", "--format", "xml"],
     "avm usage export: Invalid value for '--format': 'xml' is not one of 'focus', 'jsonl' "
     "(see avm usage export --help)"),
    (["budgets", "set", "--rpm", "many"],
     "avm budgets set: Invalid value for '--rpm': 'many' is not a valid integer (see avm budgets set --help)"),
    (["doctor", "--timeout", "long"],
     "avm doctor: Invalid value for '--timeout': 'long' is not a valid float (see avm doctor --help)"),
    (["usage", "show", "--tenant", "acme"], "avm usage show: Missing option '--period' (see avm usage show --help)"),
    (["sessions", "import", "archive.json"],
     "avm sessions import: Missing option '--container' / '-c' (see avm sessions import --help)"),
    (["sessions", "search"], "avm sessions search: Missing argument 'WORDS...' (see avm sessions search --help)"),
    (["serve", "--port"], "avm serve: Option '--port' requires an argument (see avm serve --help)"),
    (["chat", "--bogus"], "avm chat: No such option '--bogus' (see avm chat --help)"),
    (["sesions", "list"], "avm: No such command 'sesions'. Did you mean 'sessions'? (see avm --help)"),
    (["config", "--url"], "avm config: Option '--url' requires an argument (see avm config --help)"),
])
def test_a_usage_mistake_is_one_line_naming_the_flag_and_exit_2(capsys: pytest.CaptureFixture[str],
                                                                argv: list[str], line: str) -> None:
    assert run(capsys, *argv) == (2, "", line + "\n")


def test_a_usage_mistake_in_a_process_has_no_traceback() -> None:
    done = avm_process("budgets", "set", "--rpm", "many")
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", "avm budgets set: Invalid value for '--rpm': 'many' is not a valid integer (see avm budgets set "
               "--help)\n")


@pytest.fixture
def read_args(monkeypatch: pytest.MonkeyPatch) -> list[Args]:
    """`avm sessions list|show|search` parse their line and hand over these arguments (no server)."""
    seen: list[Args] = []

    async def read(args: Args) -> int:
        seen.append(args)
        return 0
    monkeypatch.setattr(sessions_read, "read", read)
    return seen


@pytest.mark.parametrize(("argv", "url", "token"), [
    (["sessions", "list"], None, None),
    (["sessions", "--url", "http://group", "--token", "g", "list"], "http://group", "g"),
    (["sessions", "list", "--url", "http://action"], "http://action", None),
    (["sessions", "--url", "http://group", "--token", "g", "list", "--url", "http://action"], "http://action", "g"),
])
def test_url_and_token_on_the_group_or_its_action(capsys: pytest.CaptureFixture[str], read_args: list[Args],
                                                  argv: list[str], url: str | None, token: str | None) -> None:
    assert run(capsys, *argv) == (0, "", "")
    [args] = read_args
    assert (args.action, args.url, args.token, args.limit, args.every, args.as_json) == (
        "list", url, token, 20, False, False)


def test_parsed_arguments_of_search(capsys: pytest.CaptureFixture[str], read_args: list[Args]) -> None:
    assert run(capsys, "sessions", "search", "red", "fox", "--limit", "3", "--all", "--json") == (0, "", "")
    [args] = read_args
    assert (args.action, args.query, args.limit, args.every, args.as_json, args.cursor) == (
        "search", ("red", "fox"), 3, True, True, None)


def test_absent_url_and_token_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AVM_URL", raising=False)
    monkeypatch.delenv("AVM_TOKEN", raising=False)
    assert server(None, None) == ("ws://127.0.0.1:8080/ws", None)
    monkeypatch.setenv("AVM_URL", "http://env:9000")
    monkeypatch.setenv("AVM_TOKEN", "avmk_env")
    assert server(None, None) == ("http://env:9000", "avmk_env")
    assert server("http://flag", None) == ("http://flag", "avmk_env")
    assert server(None, "avmk_flag") == ("http://env:9000", "avmk_flag")


# ------------------------------------------------------------------------------ shell completion


@pytest.mark.parametrize(("shell", "marks"), [
    ("bash", ["_avm_completion() {", "_AVM_COMPLETE=bash_complete $1", "complete -o nosort -F _avm_completion avm"]),
    ("zsh", ["#compdef avm", "_AVM_COMPLETE=zsh_complete"]),
    ("fish", ["_AVM_COMPLETE=fish_complete", "complete --no-files --command avm"]),
])
def test_a_completion_script_for_each_shell(shell: str, marks: list[str]) -> None:
    done = avm_process(_AVM_COMPLETE=f"{shell}_source")
    assert (done.returncode, done.stderr) == (0, "")
    for mark in marks:
        assert mark in done.stdout, (mark, done.stdout)


def completions(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], line: str) -> list[str]:
    """What bash is offered for the last word of `line` (a trailing space: a new word)."""
    words = line.split(" ")
    monkeypatch.setenv("_AVM_COMPLETE", "bash_complete")
    monkeypatch.setenv("COMP_WORDS", line)
    monkeypatch.setenv("COMP_CWORD", str(len(words) - 1))
    code, out, err = run(capsys)
    assert (code, err) == (0, "")
    return out.splitlines()


@pytest.mark.parametrize(("line", "offered"), [
    ("avm ses", ["plain,sessions"]),
    ("avm sessions ", ["plain,export", "plain,import", "plain,list", "plain,search", "plain,show"]),
    ("avm keys create --scope ", ["plain,user", "plain,admin", "plain,operator"]),
    ("avm usage export --format j", ["plain,jsonl"]),
    ("avm serve --data-dir /tm", ["dir,/tm"]),
    ("avm keys list --data-dir ~/.ag", ["dir,~/.ag"]),
    ("avm serve --script s", ["file,s"]),
    ("avm chat --history h", ["file,h"]),
])
def test_completion_of_commands_choices_and_paths(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str], line: str,
                                                  offered: list[str]) -> None:
    assert completions(monkeypatch, capsys, line) == offered


def test_completion_offers_a_commands_flags(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    offered = completions(monkeypatch, capsys, "avm sessions export --")
    assert {"plain,--out", "plain,--include-secrets", "plain,--url", "plain,--token"} <= set(offered)


def test_the_console_script_is_this_main() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert '\navm = "avm.cli:main"\n' in text
