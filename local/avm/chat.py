"""`avm chat`: talk to an agent from the terminal over the AgentX WebSocket protocol.

Creates a container and an image (or continues `--image`), then reads lines from stdin and streams
each reply to stdout. `/history` prints the stored conversation, `/quit` or end of input exits.
Ctrl-C while a reply streams interrupts the agent (a second Ctrl-C exits); at the prompt it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
import getpass
import os
import re
import signal
import sys
import threading
from collections.abc import Awaitable
from decimal import Decimal, InvalidOperation
from typing import Any, TextIO, TypeVar

import orjson

from agentvm.config import ClientSettings
from agentvm_client import (
    AgentVMClient,
    ClientError,
    ConnectError,
    ConnectionLost,
    Event,
    RequestFailed,
    RequestTimeout,
)

DEFAULT_URL = "ws://127.0.0.1:8080/ws"
_INTERRUPT_TIMEOUT_S = 10.0
_TOOL_OUTPUT_PREVIEW = 200
_SMALLEST_AMOUNT = Decimal("0.0001")
_HELP = "Commands: /history shows the conversation, /quit exits. Ctrl-C interrupts a reply."

_T = TypeVar("_T")


def _default_container() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no login name in this environment
        user = ""
    return "user-" + (re.sub(r"[^A-Za-z0-9_.-]", "-", user) or "local")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `chat` subcommand. Its `func` default runs it and returns the exit code."""
    parser = subparsers.add_parser(
        "chat",
        help="chat with an agent in the terminal",
        description="Chat with an agent over the AgentX WebSocket protocol. " + _HELP,
    )
    env = ClientSettings()
    parser.add_argument("--url", default=env.url, help=f"WebSocket URL (default: $AVM_URL or {DEFAULT_URL})")
    parser.add_argument("--token", default=env.token.get_secret_value() if env.token else None,
                        help="API key sent as a Bearer token (default: $AVM_TOKEN)")
    parser.add_argument("--container", default=_default_container(),
                        help="container for a new image (default: user-<login name>)")
    parser.add_argument("--image", help="continue this existing image instead of creating one")
    parser.add_argument("--name", help="name of the new image")
    parser.add_argument("--system", help="system prompt of the new image")
    parser.add_argument("--tools", help="built-in tools the new image's agent may use, comma-separated "
                                        "(bash,read_file,write_file,edit_file,list_files)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Synchronous entry point: run the chat on a fresh event loop."""
    try:
        return asyncio.run(run_chat(args))
    except KeyboardInterrupt:
        return 130


async def run_chat(args: argparse.Namespace, *, stdin_fd: int | None = None, stdout: TextIO | None = None,
                   stderr: TextIO | None = None) -> int:
    """Run the chat. Returns 0 on a clean exit, 1 when the server cannot be reached or refuses."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    fd = stdin_fd if stdin_fd is not None else sys.stdin.fileno()
    client = AgentVMClient(args.url, token=args.token or None)
    try:
        await client.connect()
    except ConnectError as exc:
        hint = " (check --token or $AVM_TOKEN)" if exc.status in (401, 403) else ""
        print(f"avm chat: {exc}{hint}", file=err)
        return 1
    try:
        return await _Chat(client, args, fd, out, err).run()
    finally:
        await client.close()


class _Quit(Exception):
    """The user asked to leave (Ctrl-C at the prompt, or twice during a reply)."""


class _Chat:
    def __init__(self, client: AgentVMClient, args: argparse.Namespace, stdin_fd: int, out: TextIO,
                 err: TextIO) -> None:
        self._client = client
        self._args = args
        self._stdin_fd = stdin_fd
        self._out = out
        self._err = err
        self._style = _Style(_isatty(out))
        self._interactive = _isatty(out) and _fd_isatty(stdin_fd)
        self._image_id = ""
        self._quit = asyncio.Event()
        self._in_turn = False
        self._interrupt_sent = False
        self._printer: _TurnPrinter | None = None
        self._background: set[asyncio.Task[None]] = set()

    async def run(self) -> int:
        try:
            self._image_id = await self._setup()
        except ClientError as exc:
            print(f"avm chat: {exc}", file=self._err)
            return 1
        self._out.write(f"image: {self._image_id}\n")
        self._out.flush()
        if self._interactive:
            print(self._style.dim(_HELP), file=self._err)
        self._client.on_disconnected(lambda: self._notice("(connection lost, reconnecting…)"))
        self._client.on_reconnected(lambda: self._notice("(reconnected)"))

        loop = asyncio.get_running_loop()
        reader = _LineReader(self._stdin_fd, loop)
        reader.start()
        sigint = _install_sigint(loop, self._on_sigint)
        try:
            return await self._repl(reader)
        except _Quit:
            if self._interactive:
                self._out.write("\n")
            return 0
        finally:
            if sigint:
                loop.remove_signal_handler(signal.SIGINT)
            await self._drain_background()

    async def _setup(self) -> str:
        if self._args.image:
            res = await self._client.request_ok("image_get", {"imageId": self._args.image})
            if not isinstance(res["data"].get("record"), dict):
                raise ClientError(f"image not found: {self._args.image}")
            return str(self._args.image)
        container = self._args.container
        await self._client.request_ok("container_create", {"containerId": container})
        config: dict[str, Any] = {}
        if self._args.name:
            config["name"] = self._args.name
        if self._args.system:
            config["systemPrompt"] = self._args.system
        if self._args.tools:
            config["tools"] = [t.strip() for t in self._args.tools.split(",") if t.strip()]
        res = await self._client.request_ok("image_create", {"containerId": container, "config": config})
        record = res["data"].get("record")
        image_id = record.get("imageId") if isinstance(record, dict) else None
        if not isinstance(image_id, str) or not image_id:
            raise ClientError("the server did not return an image id")
        return image_id

    async def _repl(self, reader: _LineReader) -> int:
        while True:
            if self._interactive:
                self._out.write("> ")
                self._out.flush()
            line = await self._race(reader.get())
            if line is None:  # end of input
                if self._interactive:
                    self._out.write("\n")
                return 0
            text = line.strip()
            if not text:
                continue
            if text in ("/quit", "/exit"):
                return 0
            if text == "/history":
                await self._history()
            elif text == "/help":
                print(_HELP, file=self._err)
            elif re.fullmatch(r"/[a-z]+", text):
                print(f"unknown command {text}; {_HELP}", file=self._err)
            else:
                await self._turn(text)
            if self._client.failed is not None:
                print(f"avm chat: {self._client.failed}", file=self._err)
                return 1

    async def _turn(self, text: str) -> None:
        printer = self._printer = _TurnPrinter(self._out, self._err, self._style)
        self._in_turn = True
        self._interrupt_sent = False
        try:
            await self._race(self._client.send_message(self._image_id, text, on_event=printer))
        except RequestFailed as exc:
            print(f"error: {exc}", file=self._err)
        except RequestTimeout as exc:
            print(f"error: {exc}", file=self._err)
        except ConnectionLost as exc:
            print(f"error: {exc}; the message may not have been delivered", file=self._err)
        finally:
            self._in_turn = False
            self._printer = None
            printer.finish()

    async def _history(self) -> None:
        try:
            res = await self._race(self._client.request_ok("image_messages", {"imageId": self._image_id}))
        except ClientError as exc:
            print(f"error: {exc}", file=self._err)
            return
        messages = res["data"].get("messages")
        if not isinstance(messages, list) or not messages:
            self._out.write(self._style.dim("(no messages)") + "\n")
        else:
            for message in messages:
                if isinstance(message, dict):
                    label, body = _describe_message(message)
                    self._out.write(f"{self._style.dim(label + ':')} {body}\n")
        self._out.flush()

    # ---------------------------------------------------------------------------------- Ctrl-C

    def _on_sigint(self) -> None:
        if not self._in_turn or self._interrupt_sent:
            self._quit.set()
            return
        self._interrupt_sent = True
        if self._printer is not None:
            self._printer.finish()  # start the notice on a fresh line
        self._notice("(interrupting… press Ctrl-C again to quit)")
        task = asyncio.ensure_future(self._interrupt())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _interrupt(self) -> None:
        try:
            await self._client.request_ok("agent_interrupt", {"imageId": self._image_id},
                                          timeout=_INTERRUPT_TIMEOUT_S)
        except ClientError as exc:
            print(f"error: interrupt failed: {exc}", file=self._err)

    async def _race(self, aw: Awaitable[_T]) -> _T:
        """Await `aw`, unless the user quits first: then cancel it and raise `_Quit`."""
        work = asyncio.ensure_future(aw)
        quit_wait = asyncio.ensure_future(self._quit.wait())
        try:
            await asyncio.wait({work, quit_wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, quit_wait):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
        if work.cancelled():
            raise _Quit
        return work.result()

    async def _drain_background(self) -> None:
        if self._background:
            _done, pending = await asyncio.wait(set(self._background), timeout=_INTERRUPT_TIMEOUT_S)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    def _notice(self, text: str) -> None:
        print(self._style.dim(text), file=self._err, flush=True)


class _TurnPrinter:
    """Renders the events of one turn: text to stdout as it arrives, errors to stderr."""

    def __init__(self, out: TextIO, err: TextIO, style: _Style) -> None:
        self._out = out
        self._err = err
        self._style = style
        self._at_line_start = True
        self._text_seen = False
        self._separate = False

    def __call__(self, event: Event) -> None:
        kind = event["type"]
        data = event.get("data")
        data = data if isinstance(data, dict) else {}
        if kind == "conversation_queued":
            self._line(self._style.dim("(queued)"))
        elif kind == "message_start":
            self._separate = self._text_seen
        elif kind == "text_delta" and isinstance(data.get("text"), str) and data["text"]:
            if self._separate:
                self._newline()
                self._write("\n")
                self._separate = False
            self._text_seen = True
            self._write(data["text"])
        elif kind == "tool_use_start" and self._style.enabled:
            self._line(self._style.dim(f"[tool {data.get('toolName') or '?'}]"))
        elif kind == "conversation_end":
            if data.get("reason") == "interrupted":
                self._line(self._style.dim("(interrupted)"))
            self._newline()
        elif kind == "error_occurred":
            self._newline()
            code = data.get("code")
            message = data.get("message") or "unknown error"
            print(f"error: {message}" + (f" [{code}]" if code else ""), file=self._err, flush=True)
        elif kind == "turn_response" and self._style.enabled:
            summary = _usage_summary(data)
            if summary:
                self._line(self._style.dim(summary))

    def finish(self) -> None:
        self._newline()

    def _write(self, text: str) -> None:
        self._out.write(text)
        self._out.flush()
        self._at_line_start = text.endswith("\n")

    def _newline(self) -> None:
        if not self._at_line_start:
            self._write("\n")

    def _line(self, text: str) -> None:
        self._newline()
        self._write(text + "\n")


class _Style:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def dim(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[0m" if self.enabled else text


class _LineReader:
    """Reads stdin lines on a daemon thread (so the loop never blocks and exit never waits for it).

    It reads the raw file descriptor rather than `sys.stdin`, so no buffer lock is held at exit.
    """

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self._fd = fd
        self._loop = loop
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()

    def start(self) -> None:
        threading.Thread(target=self._run, name="avm-chat-stdin", daemon=True).start()

    async def get(self) -> str | None:
        """The next line without its newline, or None at end of input."""
        return await self._queue.get()

    def _run(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                pending += decoder.decode(b"", final=True)
                if pending and not self._post(pending):
                    return
                self._post(None)
                return
            pending += decoder.decode(chunk)
            *lines, pending = pending.split("\n")
            for line in lines:
                if not self._post(line.removesuffix("\r")):
                    return

    def _post(self, item: str | None) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the chat is over
            return False
        return True


def _install_sigint(loop: asyncio.AbstractEventLoop, callback: Any) -> bool:
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        loop.add_signal_handler(signal.SIGINT, callback)
    except (NotImplementedError, RuntimeError, ValueError):  # e.g. Windows
        return False
    return True


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _fd_isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _usage_summary(data: dict[str, Any]) -> str:
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
            parts.append(_money(amount, str(cost.get("currency") or "USD")))
    if data.get("model"):
        parts.append(str(data["model"]))
    duration = data.get("durationMs")
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        parts.append(f"{duration / 1000:.1f}s")
    return " · ".join(parts)


def _money(amount: Any, currency: str) -> str:
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


def _content_text(content: Any) -> str:
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


def _describe_message(message: dict[str, Any]) -> tuple[str, str]:
    subtype = message.get("subtype") or message.get("role")
    if subtype == "user":
        return "you", _content_text(message.get("content"))
    if subtype == "assistant":
        return "assistant", _content_text(message.get("content"))
    if subtype == "tool-call":
        call = message.get("toolCall")
        call = call if isinstance(call, dict) else {}
        return "tool call", f"{call.get('name', '?')} {orjson.dumps(call.get('input', {})).decode()}"
    if subtype == "tool-result":
        result = message.get("toolResult")
        output = result.get("output") if isinstance(result, dict) else None
        value = output.get("value") if isinstance(output, dict) else output
        text = value if isinstance(value, str) else orjson.dumps(value).decode()
        if len(text) > _TOOL_OUTPUT_PREVIEW:
            text = text[:_TOOL_OUTPUT_PREVIEW] + "…"
        return "tool result", text.replace("\n", " ")
    if subtype == "error":
        return "error", str(message.get("content", ""))
    return str(subtype or "message"), _content_text(message.get("content"))
