"""An incremental Server-Sent Events parser (the WHATWG `text/event-stream` format).

Feed it bytes as they arrive, in chunks of any size; it returns the events completed so far.
Lines end with LF, CRLF or CR (a CRLF split across two chunks counts once); `:` lines are
comments; `data:` lines of one event are joined with LF; a blank line dispatches the event. An
event without any `data:` field is not dispatched, and an unterminated event at the end of the
stream is dropped, both as the spec says. `id:` and `retry:` are not used by the drivers and are
ignored. Standard library only: the lightweight drivers must stay cheap to import.

Kept rather than httpx-sse (issue 19; measured with httpx-sse 0.4.3, both ~1.2 ms to import on top of
httpx): httpx-sse reads `Response.aiter_text()`, which decodes with `errors="replace"`, so a stream
that is not valid UTF-8 would turn into U+FFFD and be taken as text instead of a retryable
`malformed_response`, the contract the SDK driver keeps too (test_a_malformed_event_mid_stream_is_a_
malformed_response[anthropic_lite-invalid-utf8] fails with it). It also dispatches an event that has
no `data:` field, keeps a leading BOM, and raises its own error for a 200 that is not
`text/event-stream`.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterator
from typing import NamedTuple

_BOM = "\ufeff"


class SSEEvent(NamedTuple):
    event: str | None  # None when the event had no (or an empty) `event:` field
    data: str


class SSEParser:
    """Bytes in, `SSEEvent`s out. One parser per stream; `feed` keeps partial lines between calls."""

    __slots__ = ("_buffer", "_data", "_event", "_skip_lf", "_started")

    def __init__(self) -> None:
        self._buffer = b""  # an incomplete line
        self._skip_lf = False  # the last chunk ended with CR: a leading LF completes that CRLF
        self._started = False  # a leading BOM was already checked for
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        return list(self.events(chunk))

    def events(self, chunk: bytes) -> Iterator[SSEEvent]:
        """As `feed`, one event at a time: the events before a line that is not UTF-8 come before its
        `UnicodeDecodeError`, however the stream was cut into chunks (one chunk may hold many events)."""
        if not chunk:
            return
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        data = self._buffer + chunk
        self._buffer = b""
        self._skip_lf = data[-1:] == b"\r"
        # bytes.splitlines splits on LF, CRLF and CR only (unlike str.splitlines); the pieces keep
        # their ending, so an unterminated last piece is a partial line to keep for the next chunk.
        lines = data.splitlines(keepends=True)
        if lines and lines[-1][-1:] not in (b"\n", b"\r"):
            self._buffer = lines.pop()
        for line in lines:
            event = self._line(line.rstrip(b"\r\n").decode("utf-8"))
            if event is not None:
                yield event

    def _line(self, line: str) -> SSEEvent | None:
        if not self._started:
            self._started = True
            line = line.removeprefix(_BOM)
        if not line:
            if not self._data:
                self._event = None
                return None
            event = SSEEvent(self._event, "\n".join(self._data))
            self._event, self._data = None, []
            return event
        if line[0] == ":":
            return None
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "event":
            self._event = value or None
        elif name == "data":
            self._data.append(value)
        return None


async def aiter_sse(chunks: AsyncIterable[bytes]) -> AsyncIterator[SSEEvent]:
    """The events of a byte stream, as each one completes."""
    parser = SSEParser()
    async for chunk in chunks:
        for event in parser.events(chunk):
            yield event
