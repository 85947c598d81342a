"""Where `avm chat` reads the user's lines: a prompt_toolkit prompt on a terminal, plain lines otherwise.

On a terminal: line editing (arrows, Home/End, Ctrl-A/E/W/K…), the history of earlier runs (Up/Down,
Ctrl-R; kept in a file), and messages of several lines: Alt-Enter (or Esc then Enter) inserts a
newline, and so does Enter after a trailing backslash. Ctrl-C clears the line, Ctrl-D on an empty
line ends the chat.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import threading
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent


class LineInput:
    async def read(self) -> str | None:
        """The next message or command, or None when the user is done (end of input)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class TerminalInput(LineInput):
    def __init__(self, history_path: Path | None) -> None:
        self.history_note = ""
        self._session: PromptSession[str] = PromptSession(
            history=self._history(history_path), key_bindings=_bindings(), multiline=True,
            prompt_continuation=lambda width, _line, _soft: "… ".rjust(width), enable_history_search=False)

    def _history(self, path: Path | None) -> History:
        if path is None:
            return InMemoryHistory()
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.touch(mode=0o600, exist_ok=True)
        except OSError as exc:
            self.history_note = f"(history not kept: {path}: {exc.strerror or exc})"
            return InMemoryHistory()
        return FileHistory(str(path))

    async def read(self) -> str | None:
        while True:
            try:
                return await self._session.prompt_async("> ")
            except KeyboardInterrupt:  # Ctrl-C at the prompt: start the line again
                continue
            except EOFError:  # Ctrl-D on an empty line
                return None


def _bindings() -> KeyBindings:
    kb = KeyBindings()

    @kb.add("enter")
    def _enter(event: KeyPressEvent) -> None:
        buffer = event.current_buffer
        if buffer.document.text_before_cursor.endswith("\\") and buffer.document.is_cursor_at_the_end:
            buffer.delete_before_cursor(1)
            buffer.insert_text("\n")
        else:
            buffer.validate_and_handle()

    @kb.add("escape", "enter")
    def _newline(event: KeyPressEvent) -> None:
        event.current_buffer.insert_text("\n")

    return kb


class PipeInput(LineInput):
    """Lines from a file descriptor that is no terminal, read on a daemon thread (so the event loop
    never blocks and exit never waits for it). It reads the raw descriptor, not `sys.stdin`, so no
    buffer lock is held at exit."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        threading.Thread(target=self._run, name="avm-chat-stdin", daemon=True).start()

    async def read(self) -> str | None:
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
