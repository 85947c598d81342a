"""What `avm chat` shows for a turn's events on a terminal (chat_render.RichTurn), its short texts, and
which lines are commands. The terminal itself is tests/e2e/test_chat_terminal.py's."""

from __future__ import annotations

import io
import re
from typing import Any

from agentvm_client import Event
from avm.chat_commands import Commands, help_text
from avm.chat_render import Screen, money, preview, usage_summary

CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\r")


def event(kind: str, **data: Any) -> Event:
    return {"type": kind, "data": data}


def test_a_tool_turn_on_a_terminal_shows_markdown_the_call_its_result_and_the_cost() -> None:
    out, err = io.StringIO(), io.StringIO()
    screen = Screen(out, err, rich=True)
    screen.out.width = screen.err.width = 80
    turn = screen.renderer()
    for e in [event("message_start"), event("text_delta", text="Let me **look**"), event("text_delta", text="."),
              event("tool_use_start", toolCallId="t1", toolName="bash"),
              event("tool_use_stop", toolCallId="t1", toolName="bash", input={"command": "cat x"}),
              event("tool_result", toolCallId="t1", result={"type": "error-text", "value": "no such file\nx"},
                    isError=True),
              event("message_start"), event("text_delta", text="# Done\n\n- one\n- two"),
              event("conversation_end", reason="completed"),
              event("turn_response", usage={"inputTokens": 1200, "outputTokens": 35, "cacheReadTokens": 1000},
                    cost={"list": "0.0050", "billed": "0.00421", "currency": "USD"}, model="claude-haiku-4-5",
                    durationMs=1530)]:
        turn(e)
    turn.finish()
    lines = [line.rstrip() for line in CONTROL.sub("", out.getvalue()).splitlines() if line.strip()]
    assert lines[:3] == ["Let me look.", '⚙ bash {"command":"cat x"}', "  ↳ no such file (+1 lines)"], lines
    assert lines[3].strip() == "Done"  # a Markdown heading, centred by rich
    assert lines[4:] == [" • one", " • two",
                         "1200 in / 35 out tokens (1000 cached) · $0.0042 · claude-haiku-4-5 · 1.5s"], lines
    assert err.getvalue() == ""


def test_an_error_and_an_interrupted_turn() -> None:
    out, err = io.StringIO(), io.StringIO()
    turn = Screen(out, err, rich=True).renderer()
    turn(event("text_delta", text="partial"))
    turn(event("error_occurred", code="rate_limit_error", message="slow down"))
    turn(event("conversation_end", reason="interrupted"))
    turn.finish()
    assert [line.rstrip() for line in out.getvalue().splitlines() if line.strip()] == ["partial", "(interrupted)"]
    assert err.getvalue() == "error: slow down [rate_limit_error]\n"


def test_short_texts() -> None:
    assert preview("x" * 250) == "x" * 200 + "…"
    assert preview("a\nb\nc\n") == "a (+2 lines)"
    assert money("0.00001", "USD") == "$<0.0001" and money("0", "USD") == "$0"
    assert money("1.23456", "EUR") == "1.2346 EUR"
    assert usage_summary({"usage": {"inputTokens": 3, "outputTokens": 4}}) == "3 in / 4 out tokens"


def test_which_lines_are_commands() -> None:
    assert Commands.is_command("/new") and Commands.is_command("/resume sess_1")
    assert not Commands.is_command("/etc/hosts has a typo") and not Commands.is_command("hello /new")
    assert help_text().splitlines()[0] == "Commands:" and "  /exit         leave (also /quit, or Ctrl-D)" in help_text()
