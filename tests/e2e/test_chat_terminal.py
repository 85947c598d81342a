"""`avm chat` in a pseudo-terminal against a real `avm serve` with the scripted driver (issue 19, "The
terminal chat test"): arrow keys edit the line and never reach the model, multi-line input, Ctrl-C
clears the prompt, replies and tool calls are shown, /sessions and /new, history Up, Ctrl-C during a
turn interrupts it, Ctrl-D exits 0, and the history is kept for the next run.

What the model received is read back from the server (`/v1/sessions/{id}/messages` and `/turns`);
what the user saw is the terminal's output with its control sequences removed."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path

import httpx
import pexpect
import pytest

from tests.support.servers import REPO, serve

pytestmark = pytest.mark.e2e

SCRIPT = """\
rules:
  - match: "files"
    responses:
      - text: ["Let me look."]
        tool_calls: [{id: toolu_01, name: bash, input: {command: ls -1}, result: "a.txt\\nb.txt"}]
      - text: ["There are **two** files:\\n\\n", "- a.txt\\n", "- b.txt\\n"]
        usage: {input_tokens: 120, output_tokens: 8}
  - match: "slow"
    responses:
      - text: ["tick ", "tick ", "tick ", "tick ", "tick ", "tick ", "tick ", "tick ", "tick ", "tick "]
        delay_ms: 700
"""

# CSI sequences (colours, cursor moves, modes), OSC strings, two-character escapes, carriage returns
CONTROL = re.compile(r"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[=>()78][0-9A-B]?|\r")
LEFT, UP, ESC_ENTER = "\x1b[D", "\x1b[A", "\x1b\r"
ID = r"[a-z0-9_]+"


class Terminal:
    """The chat's terminal: `wait` for a pattern in the visible text after the last match."""

    def __init__(self, child: pexpect.spawn) -> None:
        self.child = child
        self.raw = ""
        self.mark = 0

    def visible(self) -> str:
        return CONTROL.sub("", self.raw)

    def wait(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        regex = re.compile(pattern, re.MULTILINE)
        deadline = time.monotonic() + timeout
        while True:
            text = self.visible()
            match = regex.search(text, self.mark)
            if match:
                self.mark = match.end()
                return match
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not shown; visible text since the last match:\n"
                                     f"{text[self.mark:]}")
            with contextlib.suppress(pexpect.TIMEOUT):
                self.raw += self.child.read_nonblocking(65536, timeout=0.2)

    def prompt(self) -> None:
        self.wait(r"^>")

    def drain(self) -> None:
        """Read to the end of output (the process has exited)."""
        while True:
            try:
                self.raw += self.child.read_nonblocking(65536, timeout=5)
            except pexpect.EOF:
                return


def spawn_chat(url: str, history: Path) -> Terminal:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AVM_", "LLM_", "ANTHROPIC_"))}
    # pexpect answers no cursor-position request: prompt_toolkit would wait for one, then warn
    env.update({"TERM": "xterm-256color", "AVM_CHAT_HISTORY": str(history), "PROMPT_TOOLKIT_NO_CPR": "1",
                "COLUMNS": "120", "LINES": "40"})
    child = pexpect.spawn(sys.executable, ["-m", "avm.cli", "chat", "--url", url, "--container", "user-pty"],
                          env=env, cwd=str(REPO), dimensions=(40, 120), encoding="utf-8", timeout=30)
    return Terminal(child)


def user_texts(http: str, session_id: str) -> list[object]:
    items = httpx.get(f"{http}/v1/sessions/{session_id}/messages", timeout=5).json()["items"]
    return [m["content"] for m in items if m.get("subtype") == "user"]


def test_chat_in_a_pseudo_terminal(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    history = tmp_path / "config" / "chat-history"
    with serve(tmp_path / "data", "--script", str(script)) as srv:
        term = spawn_chat(srv.url, history)
        try:
            image = term.wait(rf"^image: (img_{ID})$")[1]
            term.wait(r"^  /resume <id>  continue a session \(sess_…\) or the primary session of an image "
                      r"\(img_…\)$")
            term.prompt()
            primary = httpx.get(f"{srv.http}/v1/images/{image}/sessions", timeout=5).json()["items"][0]["sessionId"]

            # a typo mended with the Left arrow: the model gets "hello", never an escape code
            term.child.send("helo")
            term.child.send(LEFT)
            term.child.send("l\r")
            term.wait(r"^You said: hello *$")
            term.wait(r"^\d+ in / \d+ out tokens · \$0 · scripted · \d+\.\ds$")
            term.prompt()

            # three lines in one message: Esc-Enter, then a trailing backslash
            term.child.send("line one" + ESC_ENTER + "line two\\\r" + "line three\r")
            term.wait(r"^… line three")  # the continuation lines are shown as such
            term.wait(r"^You said: line one line two line three *$")  # Markdown joins a paragraph's lines
            term.prompt()

            # Ctrl-C at the prompt throws the line away; a tool turn shows the call and its result
            term.child.send("junk")
            term.child.sendintr()
            term.child.send("show files\r")
            term.wait(r"^Let me look\. *$")
            term.wait(r'^⚙ bash \{"command":"ls -1"\}$')
            term.wait(r"^  ↳ a\.txt \(\+1 lines\)$")
            term.wait(r"^There are two files: *$")  # Markdown: the ** are rendered, not shown
            term.wait(r"^ • a\.txt *\n ?\n? • b\.txt *$")
            term.wait(r"^\d+ in / 11 out tokens · \$0 · scripted · \d+\.\ds$")
            term.prompt()
            assert user_texts(srv.http, primary) == ["hello", "line one\nline two\nline three", "show files"]

            term.child.send("/sessions\r")
            term.wait(rf"^\* {primary}  \d{{4}}-\d\d-\d\d \d\d:\d\d  primary$")
            term.prompt()
            term.child.send("/new\r")
            second = term.wait(rf"^new session (sess_{ID}) of image {image}$")[1]
            term.prompt()
            term.child.send("/sessions\r")
            term.wait(rf"^  {primary}  [-0-9 :]+  primary\n\* {second}  [-0-9 :]+$")
            term.prompt()

            # Up recalls the previous line (/sessions): it runs again
            term.child.send(UP)
            term.child.send("\r")
            term.wait(rf"^  {primary}  [-0-9 :]+  primary\n\* {second}  [-0-9 :]+$")
            term.prompt()

            # the new session is where messages now go; Ctrl-C during its reply interrupts the turn
            term.child.send("slow\r")
            term.wait(r"tick")
            term.child.sendintr()
            term.wait(r"^\(interrupting… press Ctrl-C again to quit\)$")
            term.wait(r"^\(interrupted\)$")
            term.prompt()
            turns = httpx.get(f"{srv.http}/v1/sessions/{second}/turns", timeout=5).json()["items"]
            assert [t["status"] for t in turns] == ["interrupted"]
            assert user_texts(srv.http, second) == ["slow"]

            term.child.sendeof()
            term.drain()
            term.child.close()
            assert term.child.exitstatus == 0, term.visible()[-2000:]
        finally:
            if term.child.isalive():
                term.child.terminate(force=True)
        assert "^[[" not in term.visible() and "\x1b[D" not in str(user_texts(srv.http, primary))

        # the next run: Up recalls the last line of the previous one; /resume continues a session of
        # another image, whose messages then go there
        term = spawn_chat(srv.url, history)
        try:
            other = term.wait(rf"^image: (img_{ID})$")[1]
            assert other != image
            term.prompt()
            term.child.send(UP)
            term.wait(r"slow")  # on the prompt line: the ">" just matched
            term.child.sendintr()
            term.child.send(f"/resume {second}\r")
            term.wait(rf"^resumed {second} of image {image}: 2 messages\nyou: slow\nassistant: (tick )+")
            term.prompt()
            term.child.send("hello again\r")
            term.wait(r"^You said: hello again *$")
            term.prompt()
            term.child.send("/exit\r")
            term.drain()
            term.child.close()
            assert term.child.exitstatus == 0, term.visible()[-2000:]
        finally:
            if term.child.isalive():
                term.child.terminate(force=True)
        assert user_texts(srv.http, second) == ["slow", "hello again"]

    # typed lines are kept for the next run (prompt_toolkit's history file: "+" before each line; a line
    # equal to the one before it, as the recalled /sessions, is not stored twice)
    kept = [line[1:] for line in history.read_text().splitlines() if line.startswith("+")]
    assert kept == ["hello", "line one", "line two", "line three", "show files", "/sessions", "/new", "/sessions",
                    "slow", f"/resume {second}", "hello again", "/exit"]
