"""README.md run literally (issue 19, item 10): every code block a user runs is executed against a real
`avm serve` (the offline scripted driver, a temporary data dir, a free port), twice where a user would
naturally run it again; every block that cannot run here is listed in `NOT_RUN` with the reason.

Blocks are keyed by their language tag: ```sh blocks are commands (one per line, `\\` continues a line,
a trailing ` # comment` is not part of the key), ```python and ```js blocks are whole programs, ```console
blocks are shown output and never run. A command or program that is neither run (`RUN`) nor listed
(`NOT_RUN`), a block without a tag, or a stale entry fails `test_every_readme_block_is_run_or_listed`.

The only rewriting of a snippet (`localize`), so the test's server is the one it talks to:
- the `make serve ARGS=…` line runs as `make -n serve ARGS=…` (a dry run: what make would run), and the
  command it prints, the Makefile's `.venv/bin/avm serve …`, is started;
- `127.0.0.1:8080` (the default address) and `--port 9000` become the test server's port, `/tmp/avm`
  the test's data dir;
- `.venv/bin/` becomes the bin directory of the Python running the tests (under `make test` that is
  `.venv/bin/` itself);
- the tools fragment continues the AgentVMClient program: it runs with that program's `avm` (an
  `AgentVMClient` of the test's server, container `user-alice` created) and its top-level `await`;
- `img_…` (a placeholder the reader fills in) becomes the image the first `avm chat` printed;
- commands get `AVM_URL=ws://127.0.0.1:<port>/ws` in their environment (what `avm chat` uses when no
  `--url` is given; its default is the default address), and a temporary `HOME` and `XDG_DATA_HOME`, so
  nothing is written to the user's home (checked at the end)."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from agentvm_client import AgentVMClient, RequestFailed
from tests.support.servers import REPO, ServeProcess, await_startup_record, free_port, stop_serve

README = REPO / "README.md"
TAGS = {"sh", "python", "js", "console"}

# How each runnable command or program is keyed: sh commands by their text, programs by a line they hold.
SERVE = 'make serve ARGS="--port 9000 --data-dir /tmp/avm --flush-ms 100"'
CHAT = ".venv/bin/avm chat"
CHAT_IMAGE = ".venv/bin/avm chat --image img_…"
SSE = ("curl -N http://127.0.0.1:8080/api/v1/chat/completions -H 'content-type: application/json' "
       """-d '{"agent_type": "chat_basic", "message": "Hello!"}'""")
USAGE = 'curl -s "http://127.0.0.1:8080/v1/usage?period=$(date -u +%Y-%m)&groupBy=model"'
PY_CLIENT = "from agentvm_client import AgentVMClient"
PY_MANAGEMENT = "from agentvm_client import ManagementClient"
PY_OPENAI = "from openai import OpenAI"
FRAGMENT = 'config = {"name": "Coder", "tools":'  # continues the PY_CLIENT program: run with its `avm`
SESSIONS = ".venv/bin/avm sessions list"
HELP = ".venv/bin/avm --help"
COMPLETION = 'eval "$(_AVM_COMPLETE=bash_source .venv/bin/avm)"'
RUN = (SERVE, CHAT, CHAT_IMAGE, SSE, USAGE, PY_CLIENT, PY_MANAGEMENT, PY_OPENAI, FRAGMENT, SESSIONS, HELP, COMPLETION)
AGENTX = 'import { createAgentX } from "agentxjs";'
PROGRAMS = {PY_CLIENT, PY_MANAGEMENT, PY_OPENAI, AGENTX, FRAGMENT}  # keys of ```python and ```js blocks

NOT_RUN = {
    "make serve": "the set-up itself: this test runs in the venv it makes, and the server it starts is "
                  "started here from the `make serve ARGS=…` line, by the Makefile's serve recipe",
    "make test": "this test is part of it",
    "LLM_API_KEY=sk-ant-... make serve": "needs a real Anthropic key; the Anthropic drivers replay recorded "
                                         "streams in tests/billing/test_recorded_streams.py",
    AGENTX: "needs the npm package agentxjs, which make test does not install; the stock client's requests run "
            "in tests/e2e/test_serve.py (StockClient); syntax-checked with `node --check` when node is installed",
    "npm install -g --prefix /usr/local @modelcontextprotocol/server-everything@2026.8.31":
        "installs system-wide (network); `make test` runs this very install (Makefile target mcp-servers, as root) "
        "and tests/tools/test_mcp_packages.py runs the README's server with it in the sandbox",
    "make sam-build": "builds the Lambda artifacts for AWS (minutes, network); tests/template checks the template",
    ".venv-sam/bin/sam deploy --guided": "interactive, deploys to an AWS account",
    ".venv/bin/uv sync --locked --inexact --extra aws": "changes the venv running the tests; make test "
                                                        "installs the dev extra, which has the aws one",
    "AWS_REGION=<region> .venv/bin/avm keys create --table <TableName output> --tenant <your-tenant> --scope admin":
        "needs a deployed stack's table; the same command against moto: tests/cloud/test_handlers.py",
    "AWS_REGION=<region> .venv/bin/avm keys create --table <TableName output> --tenant ops --scope operator":
        "needs a deployed stack's table; the same command against moto: tests/cloud/test_handlers.py",
}


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int  # of the opening fence

    def units(self) -> list[str]:
        """What a user runs: each command of a sh block, else the whole program."""
        if self.lang != "sh":
            return [self.text]
        commands = []
        for raw in self.text.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#\s.*$", "", raw).strip()
            if command and not command.startswith("#"):
                commands.append(re.sub(r"\s+", " ", command))
        return commands


def readme_blocks(text: str) -> list[Block]:
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^```(.*)$", lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        blocks.append(Block(fence.group(1).strip(), "\n".join(lines[i + 1:end]) + "\n", i + 1))
        i = end + 1
    return blocks


def key_of(block: Block, unit: str) -> str | None:
    """The RUN or NOT_RUN entry that claims this command or program (None: neither)."""
    program = block.lang != "sh"
    keys = [k for k in (*RUN, *NOT_RUN) if (k in PROGRAMS) == program and (k in unit if program else k == unit)]
    assert len(keys) <= 1, f"README.md line {block.line}: claimed by more than one entry: {keys}"
    return keys[0] if keys else None


def runnable() -> dict[str, tuple[Block, str]]:
    found = {}
    for block in readme_blocks(README.read_text()):
        for unit in block.units() if block.lang != "console" else []:
            key = key_of(block, unit)
            if key in RUN:
                found[key] = (block, unit)
    return found


def test_every_readme_block_is_run_or_listed() -> None:
    blocks = readme_blocks(README.read_text())
    untagged = [b.line for b in blocks if b.lang not in TAGS]
    assert not untagged, f"README.md blocks without a tag of {sorted(TAGS)} at lines {untagged}"
    claimed: list[str] = []
    for block in blocks:
        if block.lang == "console":
            continue
        for unit in block.units():
            key = key_of(block, unit)
            assert key is not None, (f"README.md line {block.line}: {unit!r} is neither run nor listed: add it to "
                                     "RUN (and run it) or to NOT_RUN with the reason")
            claimed.append(key)
    assert sorted(claimed) == sorted((*RUN, *NOT_RUN)), "each entry claims exactly one README command or program"


def test_the_readme_parser_finds_what_it_must() -> None:
    text = ("a\n```sh\nmake x   # why\ncurl -N http://h \\\n  -d '{}'\n\n# only a comment\n```\n"
            "```python\nprint(1)\n```\n```\nplain\n```\n")
    sh, py, plain = readme_blocks(text)
    assert (sh.lang, sh.line, sh.units()) == ("sh", 2, ["make x", "curl -N http://h -d '{}'"])
    assert (py.lang, py.units()) == ("python", ["print(1)\n"])
    assert (plain.lang, plain.line) == ("", 12)


# ---- running them ------------------------------------------------------------------------------------

class Env:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.data = tmp / "data"
        self.tmp = tmp
        self.home = tmp / "home"
        self.home.mkdir()
        self.bin = Path(sys.executable).parent
        self.image = ""
        self.vars = {k: v for k, v in os.environ.items() if not k.startswith(("AVM_", "LLM_", "ANTHROPIC_"))}
        self.vars.update(AVM_URL=f"ws://127.0.0.1:{self.port}/ws", HOME=str(self.home),
                         XDG_DATA_HOME=str(tmp / "xdg"))

    def localize(self, text: str) -> str:
        out = (text.replace("127.0.0.1:8080", f"127.0.0.1:{self.port}").replace("--port 9000", f"--port {self.port}")
               .replace("/tmp/avm", str(self.data)).replace(".venv/bin/", f"{self.bin}/"))
        if "img_…" in out:
            assert self.image, "an image placeholder before any image was created"
            out = out.replace("img_…", self.image)
        ports = set(re.findall(r"(?:127\.0\.0\.1|localhost):(\d+)", out)) | set(re.findall(r"--port (\d+)", out))
        assert ports <= {str(self.port)}, f"a snippet addresses another server than the test's: {text!r}"
        return out

    def sh(self, command: str, stdin: str = "") -> str:
        done = subprocess.run(["bash", "-c", self.localize(command)], input=stdin, capture_output=True, text=True,
                              cwd=REPO, env=self.vars, timeout=90)
        assert done.returncode == 0, f"{command!r} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def python(self, program: str, tmp: Path) -> str:
        path = tmp / "snippet.py"
        path.write_text(self.localize(program))
        done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=REPO,
                              env=self.vars, timeout=90)
        assert done.returncode == 0, f"README program exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    @contextlib.contextmanager
    def serve(self, line: str) -> Iterator[ServeProcess]:
        """The `make serve ARGS=…` line: `make -n` (the same line, dry run) says what it runs, the Makefile's
        serve recipe `$(BIN)/avm serve $(ARGS)`; that command is started."""
        make, *rest = shlex.split(self.localize(line))
        assert make == "make" and rest[0] == "serve", line
        quiet = {k: v for k, v in self.vars.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        dry = subprocess.run(["make", "-n", "--no-print-directory", *rest], capture_output=True, text=True,
                             cwd=REPO, env=quiet, timeout=60)
        assert dry.returncode == 0, dry.stderr
        command = shlex.split(self.localize(dry.stdout.strip().splitlines()[-1]))
        assert command[:2] == [str(self.bin / "avm"), "serve"], dry.stdout
        args = command[2:]
        assert args[args.index("--port") + 1] == str(self.port) and args[args.index("--data-dir") + 1] == str(self.data)
        log_path = self.tmp / "serve.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                    env=self.vars, cwd=REPO)
        srv = ServeProcess(proc, self.port, log_path)
        try:
            deadline = time.monotonic() + 30
            while True:
                assert proc.poll() is None, f"avm serve exited with {proc.returncode}:\n{srv.log()}"
                try:
                    if httpx.get(f"{srv.http}/health", timeout=0.5).status_code == 200:
                        await_startup_record(srv, deadline)
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"avm serve did not start:\n{srv.log()}"
                time.sleep(0.05)
            yield srv
        finally:
            stop_serve(srv)


async def run_fragment(fragment: str, url: str) -> str:
    """The fragment as the rest of the AgentVMClient program: after its `container_create`, inside its
    `async with`; answers the id of the image the fragment created."""
    async with AgentVMClient(url) as avm:
        await avm.request_ok("container_create", {"containerId": "user-alice"})
        before = {i["imageId"] for i in (await avm.request_ok("image_list", {"containerId": "user-alice"}))
                  ["data"]["records"]}
        code = compile(fragment, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        awaiting = eval(code, {"avm": avm})  # README.md's own code, as a reader would run it
        if awaiting is not None:
            await awaiting
        (image,) = [i["imageId"] for i in (await avm.request_ok("image_list", {"containerId": "user-alice"}))
                    ["data"]["records"] if i["imageId"] not in before]
        return str(image)


def sse_events(text: str) -> list[tuple[str, dict[str, object]]]:
    events = []
    for chunk in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in chunk.splitlines() if line and not line.startswith(":"))
        if "event" in fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return events


@pytest.mark.e2e
def test_the_readme_quick_start_runs_literally(tmp_path: Path) -> None:
    units = runnable()
    assert sorted(units) == sorted(RUN), f"README.md lost a command the test runs: {set(RUN) - set(units)}"
    env = Env(tmp_path)
    turns = 0
    with env.serve(units[SERVE][1]) as srv:
        startup = srv.log()
        assert "scripted" in startup and "Traceback" not in startup

        images = []
        for _ in range(2):  # `avm chat` with a piped line: a new image each run
            out = env.sh(units[CHAT][1], stdin="Hello!\n")
            found = re.match(r"image: (img_[a-z0-9_]+)\nYou said: Hello!\n$", out)
            assert found, out
            images.append(found.group(1))
        turns += 2
        assert images[0] != images[1]
        env.image = images[0]
        for word in ("Again!", "Once more!"):  # continue the first conversation
            out = env.sh(units[CHAT_IMAGE][1], stdin=f"{word}\n")
            assert out == f"image: {images[0]}\nYou said: {word}\n"
        turns += 2
        image = httpx.get(f"{srv.http}/v1/images/{images[0]}", timeout=10).json()
        messages = httpx.get(f"{srv.http}/v1/sessions/{image['sessionId']}/messages", timeout=10).json()["items"]
        assert [(m["role"], m["content"] if m["role"] == "user" else m["content"][0]["text"]) for m in messages] == [
            ("user", "Hello!"), ("assistant", "You said: Hello!"), ("user", "Again!"),
            ("assistant", "You said: Again!"), ("user", "Once more!"), ("assistant", "You said: Once more!")]

        for _ in range(2):
            out = env.python(units[PY_CLIENT][1], tmp_path)
            assert out == ("You said: Hello!\n {'inputTokens': 1, 'outputTokens': 4, 'cacheReadTokens': 0, "
                           "'cacheWriteTokens': 0}\n"), out
        turns += 2

        for _ in range(2):
            events = sse_events(env.sh(units[SSE][1]))
            assert "".join(str(d["content"]) for e, d in events if e == "message") == "You said: Hello!"
            (done,) = [d for e, d in events if e == "done"]
            assert done["status"] == "completed" and events[-1][0] == "done"
        turns += 2

        for _ in range(2):  # the second run finds prompts/sales@1.0.0 registered: publish is a no-op
            assert env.python(units[PY_MANAGEMENT][1], tmp_path) == "You said: Hello!\n"
        turns += 2
        for _ in range(2):  # the OpenAI SDK over the token API: one metered call of the scripted model each
            assert env.python(units[PY_OPENAI][1], tmp_path) == "You said: Hello!\n"
        turns += 2
        found = httpx.get(f"{srv.http}/v1/resources", params={"kind": "prompt"}, timeout=10).json()["items"]
        assert [(r["name"], r["version"]) for r in found] == [("sales", "1.0.0")]

        # the tools fragment: an image with the built-in tools and two MCP servers (none started yet)
        try:
            coder = asyncio.run(run_fragment(units[FRAGMENT][1], env.localize("ws://127.0.0.1:8080/ws")))
        except RequestFailed as refused:  # neither bubblewrap nor root: the documented refusal
            assert os.geteuid() != 0 and "sandbox_unavailable" in str(refused.response), refused
        else:
            got = httpx.get(f"{srv.http}/v1/images/{coder}", timeout=10).json()
            assert (got["name"], got["mcpServers"]) == ("Coder", ["everything", "search"])
            assert got["tools"] == ["bash", "read_file", "write_file", "edit_file", "list_files"]

        for _ in range(2):
            usage = json.loads(env.sh(units[USAGE][1]))
            assert usage["groupBy"] == ["model"] and usage["total"]["calls"] == turns
            assert [(r["model"], r["calls"]) for r in usage["rows"]] == [("scripted", turns)]

        listed = [env.sh(units[SESSIONS][1]) for _ in range(2)]  # reading twice changes nothing
        assert listed[0] == listed[1]
        rows = [re.fullmatch(r"(sess_\S+)  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d  (img_\S+)  (\S+)  .+", line)
                for line in listed[0].splitlines()]
        assert rows and all(rows), listed[0]
        chat_images = {m.group(2): m.group(3) for m in rows if m is not None and m.group(2) in images}
        assert sorted(chat_images) == sorted(images)  # `avm chat`'s two images, in its container user-<login>
        assert all(container.startswith("user-") for container in chat_images.values()), chat_images
        for _ in range(2):
            shown = env.sh(units[HELP][1])
            assert shown.startswith("Usage: avm [OPTIONS] COMMAND [ARGS]...\n")
            commands = shown.split("\nCommands:\n", 1)[1]
            assert [line.split()[0] for line in commands.splitlines() if line.startswith("  ") and
                    not line.startswith("   ")] == ["budgets", "chat", "config", "doctor", "keys", "serve",
                                                    "sessions", "usage"]
        for _ in range(2):  # the completion script defines the completion of `avm` in the shell that runs it
            assert env.sh(units[COMPLETION][1] + "; complete -p avm") == "complete -o nosort -F _avm_completion avm\n"
        assert "Traceback" not in srv.log()
    assert list(env.home.iterdir()) == []  # nothing written under $HOME (no ~/.agentvm)


def test_the_agentx_snippet_is_valid_javascript(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the AgentX snippet is not syntax-checked")
    (block,) = [b for b in readme_blocks(README.read_text()) if b.lang == "js"]
    path = tmp_path / "snippet.mjs"
    path.write_text(block.text)
    done = subprocess.run([node, "--check", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
