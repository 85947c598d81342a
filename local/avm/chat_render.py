"""How `avm chat` shows things: a turn's events (streamed Markdown, a spinner, tool calls, the cost),
notices, and stored messages.

On a terminal a reply is rendered as Markdown while it streams, in a `rich.live.Live` region that
is redrawn as tokens arrive. The region is cropped to the screen while it streams
(`vertical_overflow="ellipsis"`: a region taller than the screen cannot be redrawn without leaving
copies in the scroll-back) and printed in full when its text ends. Printing plain text and
re-rendering it at the end was the other choice: it flickers from raw to formatted and cannot erase
text that has scrolled off. Without a terminal (a pipe, a file) the text is written as it arrives,
unformatted, so scripts read exactly what the model said.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any, TextIO

import orjson
from rich.console import Console
from rich.live import Live
from rich.markdown import Markdown
from rich.spinner import Spinner
from rich.text import Text

from agentvm_client import Event

_PREVIEW = 200  # characters of a tool's arguments or result shown
_SMALLEST_AMOUNT = Decimal("0.0001")


class Screen:
    """The chat's two output streams. `rich` is true on a terminal (colours, Markdown, live regions)."""

    def __init__(self, out: TextIO, err: TextIO, *, rich: bool) -> None:
        self.rich = rich
        # Off a terminal: no colour codes, no wrapping, no highlighting: the text as given.
        plain = {} if rich else {"no_color": True, "highlight": False, "soft_wrap": True, "emoji": False}
        self.out = Console(file=out, **plain)  # type: ignore[arg-type]
        self.err = Console(file=err, stderr=True, **plain)  # type: ignore[arg-type]

    def say(self, text: str, style: str | None = None) -> None:
        self.out.print(Text(text, style=style or ""), soft_wrap=True)

    def notice(self, text: str) -> None:
        """A dim line about the chat itself (stderr, so a pipe of stdout gets only the conversation)."""
        self.err.print(Text(text, style="dim"), soft_wrap=True)

    def error(self, text: str) -> None:
        self.err.print(Text(text, style="bold red"), soft_wrap=True)

    def renderer(self) -> TurnRenderer:
        return RichTurn(self) if self.rich else PlainTurn(self)


class TurnRenderer:
    """Shows the events of one turn; `notice` prints between them; `finish` closes what is open."""

    def __call__(self, event: Event) -> None:
        raise NotImplementedError

    def notice(self, text: str) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        raise NotImplementedError


class RichTurn(TurnRenderer):
    """A turn on a terminal: a spinner until the first token, Markdown as it streams, a line per tool
    call (name and arguments) and its result, then the usage and cost of the turn."""

    def __init__(self, screen: Screen) -> None:
        self._screen = screen
        self._console = screen.out
        self._spinner: Live | None = None
        self._text: Live | None = None
        self._buffer = ""
        self._spin("thinking…")

    def __call__(self, event: Event) -> None:
        kind = event["type"]
        data = event.get("data")
        data = data if isinstance(data, dict) else {}
        if kind == "text_delta" and isinstance(data.get("text"), str) and data["text"]:
            self._stop_spinner()
            self._buffer += data["text"]
            if self._text is None:
                self._text = Live(Markdown(self._buffer), console=self._console, refresh_per_second=8,
                                  vertical_overflow="ellipsis")
                self._text.start()
            else:
                self._text.update(Markdown(self._buffer))
        elif kind == "conversation_queued":
            self._print(Text("(queued behind the running turn)", style="dim"))
        elif kind == "tool_use_start":
            self._end_text()
            self._spin(f"calling {data.get('toolName') or 'a tool'}…")
        elif kind == "tool_use_stop":
            line = Text("⚙ ", style="cyan")
            line.append(str(data.get("toolName") or "?"), style="bold cyan")
            line.append(" " + preview(compact_json(data.get("input", {}))), style="cyan")
            self._print(line)
            self._spin(f"running {data.get('toolName') or 'the tool'}…")
        elif kind == "tool_result":
            failed = bool(data.get("isError"))
            self._print(Text("  ↳ " + preview(result_text(data.get("result"))), style="red" if failed else "dim"))
            self._spin("thinking…")
        elif kind == "conversation_end":
            self._stop_all()
            if data.get("reason") == "interrupted":
                self._print(Text("(interrupted)", style="yellow"))
        elif kind == "error_occurred":
            self._stop_all()
            self._screen.error(error_line(data))
        elif kind == "turn_response":
            self._stop_all()
            summary = usage_summary(data)
            if summary:
                self._print(Text(summary, style="dim"))

    def notice(self, text: str) -> None:
        self._print(Text(text, style="dim"))

    def finish(self) -> None:
        self._stop_all()

    def _print(self, renderable: Text) -> None:
        self._end_text()  # a line printed inside a text region would split its Markdown
        self._console.print(renderable, soft_wrap=True)

    def _spin(self, label: str) -> None:
        self._stop_spinner()
        self._spinner = Live(Spinner("dots", Text(label, style="dim")), console=self._console,
                             refresh_per_second=12, transient=True)
        self._spinner.start()

    def _stop_spinner(self) -> None:
        if self._spinner is not None:
            self._spinner.stop()
            self._spinner = None

    def _end_text(self) -> None:
        if self._text is not None:
            self._text.stop()  # its last refresh prints the whole text, however tall
            if not self._console.is_terminal:  # Live ends its last line only on a terminal
                self._console.line()
            self._text = None
            self._buffer = ""

    def _stop_all(self) -> None:
        self._stop_spinner()
        self._end_text()


class PlainTurn(TurnRenderer):
    """A turn off a terminal: the reply's text as it arrives on stdout, errors on stderr."""

    def __init__(self, screen: Screen) -> None:
        self._screen = screen
        self._file = screen.out.file
        self._at_line_start = True
        self._text_seen = False
        self._separate = False

    def __call__(self, event: Event) -> None:
        kind = event["type"]
        data = event.get("data")
        data = data if isinstance(data, dict) else {}
        if kind == "conversation_queued":
            self._line("(queued)")
        elif kind == "message_start":
            self._separate = self._text_seen
        elif kind == "text_delta" and isinstance(data.get("text"), str) and data["text"]:
            if self._separate:
                self._newline()
                self._write("\n")
                self._separate = False
            self._text_seen = True
            self._write(data["text"])
        elif kind == "conversation_end":
            if data.get("reason") == "interrupted":
                self._line("(interrupted)")
            self._newline()
        elif kind == "error_occurred":
            self._newline()
            self._screen.error(error_line(data))

    def notice(self, text: str) -> None:
        self._newline()
        self._screen.notice(text)

    def finish(self) -> None:
        self._newline()

    def _write(self, text: str) -> None:
        self._file.write(text)
        self._file.flush()
        self._at_line_start = text.endswith("\n")

    def _newline(self) -> None:
        if not self._at_line_start:
            self._write("\n")

    def _line(self, text: str) -> None:
        self._newline()
        self._write(text + "\n")


# ------------------------------------------------------------------------------------------- texts


def error_line(data: dict[str, Any]) -> str:
    code = data.get("code")
    return f"error: {data.get('message') or 'unknown error'}" + (f" [{code}]" if code else "")


def compact_json(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def preview(text: str) -> str:
    """One line of at most `_PREVIEW` characters, saying how much was left out."""
    lines = text.strip().splitlines() or [""]
    first = lines[0]
    more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
    if len(first) > _PREVIEW:
        first = first[:_PREVIEW] + "…"
    return first + more


def result_text(result: Any) -> str:
    """A tool result's text: the value of an AgentX `{type, value}` output, else the JSON."""
    if isinstance(result, dict) and "value" in result:
        result = result["value"]
    return result if isinstance(result, str) else compact_json(result)


def usage_summary(data: dict[str, Any]) -> str:
    parts: list[str] = []
    usage = data.get("usage")
    if isinstance(usage, dict):
        tokens = f"{usage.get('inputTokens', 0)} in / {usage.get('outputTokens', 0)} out tokens"
        cached = usage.get("cacheReadTokens")
        if cached:
            tokens += f" ({cached} cached)"
        parts.append(tokens)
    cost = data.get("cost")
    if isinstance(cost, dict):
        amount = cost.get("billed") if cost.get("billed") is not None else cost.get("list")
        if amount is not None:
            parts.append(money(amount, str(cost.get("currency") or "USD")))
    if data.get("model"):
        parts.append(str(data["model"]))
    duration = data.get("durationMs")
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        parts.append(f"{duration / 1000:.1f}s")
    return " · ".join(parts)


def money(amount: Any, currency: str) -> str:
    try:
        value = Decimal(str(amount))
    except InvalidOperation:
        text = str(amount)
    else:
        if value == 0:
            text = "0"
        elif abs(value) < _SMALLEST_AMOUNT:
            text = f"<{_SMALLEST_AMOUNT}"
        else:
            text = f"{value.quantize(_SMALLEST_AMOUNT):f}"
    return f"${text}" if currency == "USD" else f"{text} {currency}"


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text":
            pieces.append(str(part.get("text", "")))
        elif kind == "image":
            pieces.append(f"[image {part.get('name') or ''}]".replace(" ]", "]"))
        elif kind == "file":
            pieces.append(f"[file {part.get('filename') or ''}]".replace(" ]", "]"))
    return " ".join(p for p in pieces if p)


def describe_message(message: dict[str, Any]) -> tuple[str, str]:
    """A stored message as (who, one line)."""
    subtype = message.get("subtype") or message.get("role")
    if subtype == "user":
        return "you", content_text(message.get("content"))
    if subtype == "assistant":
        return "assistant", content_text(message.get("content"))
    if subtype == "tool-call":
        call = message.get("toolCall")
        call = call if isinstance(call, dict) else {}
        return "tool call", f"{call.get('name', '?')} {compact_json(call.get('input', {}))}"
    if subtype == "tool-result":
        result = message.get("toolResult")
        output = result.get("output") if isinstance(result, dict) else None
        return "tool result", preview(result_text(output)).replace("\n", " ")
    if subtype == "error":
        return "error", str(message.get("content", ""))
    return str(subtype or "message"), content_text(message.get("content"))
