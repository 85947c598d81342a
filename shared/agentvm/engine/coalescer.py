"""Text-delta coalescing with a bound on the frames of a reply.

API Gateway bills every frame. The first delta of an LLM message goes at once; later deltas are
merged and sent at most once per window; the window starts at `flush_ms` and doubles after every
frame up to `max_flush_ms` (the start of a reply streams briskly, a long one costs few frames). Any
other event flushes the pending text first (`flush`), so the event order never changes.

The bound. With F = flush_ms > 0, M = max(max_flush_ms, F), the window after the k-th frame (k = 0 for
the first) is g_k = min(F·2^k, M), and S_k = g_0 + … + g_(k-1) (S_0 = 0). Every frame but a forced
one (`flush`) comes at least the current window after the previous frame, and the windows only grow,
so a message whose text frames span T ms (from its first delta to its last frame) with f forced
flushes sends at most

    text frames <= K(T) + 1 + f,    K(T) = max{k : S_k <= T}

and a pure-text message (one forced flush, at its end) at most K(T) + 2. In closed form, with
m = ceil(log2(M/F)) doubling steps and G = F·(2^m - 1) the time they take:

    K(T) = floor(log2(1 + T/F))          if T < G
    K(T) = m + floor((T - G) / M)        otherwise

e.g. F = 250 ms, M = 2 s, T = 10 s: m = 3, G = 1.75 s, K = 3 + 4 = 7, so at most 9 text frames
(`max_text_frames`). F = 0 sends every delta as it comes (no bound but the number of deltas).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

GROWTH = 2


class _Timer(Protocol):
    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], None]], _Timer]


def _loop_call_later(delay: float, callback: Callable[[], None]) -> _Timer:
    return asyncio.get_running_loop().call_later(delay, callback)


def windowed_frames(duration_ms: float, flush_ms: int, max_flush_ms: int = 0) -> int:
    """K(T): how many windows fit, one after the other, in `duration_ms` (see the module docstring)."""
    if flush_ms <= 0:
        raise ValueError("no bound without a window (flush_ms = 0 sends every delta)")
    f, top = flush_ms, max(max_flush_ms, flush_ms)
    k, spent, window = 0, 0.0, float(f)
    while window < top:  # the doubling steps, while the next window still fits
        if spent + window > duration_ms:
            return k
        k, spent, window = k + 1, spent + window, window * GROWTH
    return k + int((duration_ms - spent) // top)


def max_text_frames(duration_ms: float, flush_ms: int, max_flush_ms: int = 0, *, forced: int = 1) -> int:
    """The most text frames of a message whose text spans `duration_ms` with `forced` flushes (a
    pure-text message: 1, at its end): K(T) + 1 + forced."""
    return windowed_frames(duration_ms, flush_ms, max_flush_ms) + 1 + forced


class DeltaCoalescer:
    def __init__(self, flush_ms: int, emit_text: Callable[[str], None], *, max_flush_ms: int = 0,
                 clock: Callable[[], float] = time.monotonic, call_later: CallLater = _loop_call_later) -> None:
        self._first = flush_ms / 1000.0
        self._max_window = max(self._first, max_flush_ms / 1000.0)
        self._window = self._first  # between the last frame and the next
        self._next = self._first  # the window after the next frame
        self._emit_text = emit_text
        self._clock = clock
        self._call_later = call_later
        self._buf: list[str] = []
        self._last_emit = float("-inf")
        self._timer: _Timer | None = None
        self._held = False

    def text(self, chunk: str) -> None:
        if not chunk:
            return
        if self._held:
            self._buf.append(chunk)
            return
        if self._first <= 0:
            self._emit_text(chunk)
            return
        now = self._clock()
        if not self._buf and now - self._last_emit >= self._window:
            self._emit(chunk, now)
            return
        self._buf.append(chunk)
        if self._timer is None:
            delay = max(0.0, self._last_emit + self._window - now)
            self._timer = self._call_later(delay, self.flush)

    def flush(self) -> None:
        """Send the pending text now (a timer's window is over, or another event must follow it)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._buf:
            text = "".join(self._buf)
            self._buf.clear()
            self._emit(text, self._clock())

    def hold(self) -> None:
        """Keep the pending text until the next `flush` (the message has ended: its text goes out
        with its closing events)."""
        self._held = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _emit(self, text: str, now: float) -> None:
        self._last_emit = now
        # After every frame, so deltas that arrive just slower than the window merge too.
        self._window, self._next = self._next, min(self._next * GROWTH, self._max_window)
        self._emit_text(text)

    @property
    def pending(self) -> bool:
        return bool(self._buf)
