"""Text-delta coalescing: the first delta goes at once, later ones merge into one per window.

API Gateway bills every frame. With a fixed 250 ms window a reply of 100 deltas over 10 s is still
~40 frames, so the window may grow after each frame it sends (×1.5, up to `max_flush_ms`): the start of a
reply streams briskly and a long reply costs ~12 frames. Any other event flushes the pending text
first, so the event order never changes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

GROWTH = 1.5


class DeltaCoalescer:
    def __init__(self, flush_ms: int, emit_text: Callable[[str], None], *, max_flush_ms: int = 0) -> None:
        self._window = flush_ms / 1000.0
        self._max_window = max(self._window, max_flush_ms / 1000.0)
        self._emit_text = emit_text
        self._buf: list[str] = []
        self._last_emit = float("-inf")
        self._timer: asyncio.TimerHandle | None = None

    def text(self, chunk: str) -> None:
        if not chunk:
            return
        if self._window <= 0:
            self._emit_text(chunk)
            return
        now = time.monotonic()
        if not self._buf and now - self._last_emit >= self._window:
            self._last_emit = now
            self._grow()
            self._emit_text(chunk)
            return
        self._buf.append(chunk)
        if self._timer is None:
            delay = max(0.0, self._last_emit + self._window - now)
            self._timer = asyncio.get_running_loop().call_later(delay, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._buf:
            text = "".join(self._buf)
            self._buf.clear()
            self._last_emit = time.monotonic()
            self._grow()
            self._emit_text(text)

    def _grow(self) -> None:
        # After every frame, so deltas that arrive just slower than the window merge too.
        self._window = min(self._window * GROWTH, self._max_window)

    @property
    def pending(self) -> bool:
        return bool(self._buf)
