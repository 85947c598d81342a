"""DeltaCoalescer and its bound on a fake clock (exact times, no sleeping), over adversarial delta
timings: bursts, gaps just above and just below the window, dense streams, random ones, very long
replies; and once on the real event loop."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections.abc import Callable

import pytest

from agentvm.engine.coalescer import DeltaCoalescer, max_text_frames, windowed_frames


class _Handle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeTime:
    """A clock and a timer queue that only move when told to (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, Callable[[], None], _Handle]] = []
        self._n = itertools.count()

    def clock(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Handle:
        assert delay >= 0
        handle = _Handle()
        heapq.heappush(self._timers, (self.now + delay, next(self._n), callback, handle))
        return handle

    def advance_to(self, t: float) -> None:
        while self._timers and self._timers[0][0] <= t:
            when, _, callback, handle = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not handle.cancelled:
                callback()
        self.now = max(self.now, t)

    @property
    def armed(self) -> int:
        return sum(1 for *_, h in self._timers if not h.cancelled)


class Run:
    """One message through a coalescer on a fake clock: `frames` are (time s, text)."""

    def __init__(self, flush_ms: int, max_flush_ms: int = 0) -> None:
        self.time = FakeTime()
        self.frames: list[tuple[float, str]] = []
        self.flush_ms, self.max_flush_ms = flush_ms, max_flush_ms
        self.c = DeltaCoalescer(flush_ms, lambda text: self.frames.append((self.time.now, text)),
                                max_flush_ms=max_flush_ms, clock=self.time.clock, call_later=self.time.call_later)
        self.sent: list[tuple[float, str]] = []

    def feed(self, times_s: list[float], end_s: float | None = None) -> Run:
        for i, t in enumerate(times_s):
            self.time.advance_to(t)
            chunk = f"{i},"
            self.sent.append((self.time.now, chunk))
            self.c.text(chunk)
        self.time.advance_to(end_s if end_s is not None else (times_s[-1] if times_s else 0.0))
        self.c.flush()  # message_stop: the forced flush at the end
        return self

    def check(self) -> None:
        """The text arrives whole and in order, never later than one window, within the bound."""
        assert "".join(t for _, t in self.frames) == "".join(c for _, c in self.sent)
        assert self.frames[0] == self.sent[0]  # the first delta at once
        top = max(self.flush_ms, self.max_flush_ms) / 1000
        pending = iter(self.sent)
        for at, text in self.frames:  # no chunk waits longer than the largest window
            taken = ""
            while len(taken) < len(text):
                arrived, chunk = next(pending)
                assert at - arrived <= top + 1e-9, (at, arrived)
                taken += chunk
            assert taken == text
        span_ms = (self.frames[-1][0] - self.frames[0][0]) * 1000
        assert len(self.frames) <= max_text_frames(span_ms, self.flush_ms, self.max_flush_ms)
        # and frame by frame: every frame but the forced last one waited its window
        windows = _windows(self.flush_ms, self.max_flush_ms, len(self.frames))
        for k in range(1, len(self.frames) - 1):
            assert self.frames[k][0] - self.frames[k - 1][0] >= windows[k - 1] - 1e-9, (k, self.frames[:k + 1])
        assert self.time.armed == 0  # no timer left behind
        assert not self.c.pending


def _windows(flush_ms: int, max_flush_ms: int, n: int) -> list[float]:
    top = max(flush_ms, max_flush_ms) / 1000
    return [min(flush_ms / 1000 * 2 ** min(k, 60), top) for k in range(n)]


# ---- the bound itself ---------------------------------------------------------------------------


def test_the_bound_in_closed_form() -> None:
    # F = 250 ms, M = 2 s: windows 250, 500, 1000, 2000, 2000, …; their sums 0, 250, 750, 1750, 3750, …
    assert [windowed_frames(t, 250, 2000) for t in (0, 249, 250, 749, 750, 1749, 1750, 3749, 3750)] == \
        [0, 0, 1, 1, 2, 2, 3, 3, 4]
    assert windowed_frames(10_000, 250, 2000) == 7 and max_text_frames(10_000, 250, 2000) == 9
    assert max_text_frames(10_000, 250, 1000) == 13  # the previous cloud setting, for comparison
    assert windowed_frames(1000, 250) == 4  # no growth: one window after another
    assert max_text_frames(3_600_000, 250, 2000) == 3 + (3_600_000 - 1750) // 2000 + 2
    with pytest.raises(ValueError):
        windowed_frames(1000, 0)


# ---- adversarial timings on the fake clock -------------------------------------------------------


def test_a_dense_stream_reaches_the_bound_exactly() -> None:
    # a delta every millisecond for 10 s: a frame at every window's end, the bound is tight
    run = Run(250, 2000).feed([i / 1000 for i in range(10_001)])
    run.check()
    assert [round(t, 3) for t, _ in run.frames] == [0, 0.25, 0.75, 1.75, 3.75, 5.75, 7.75, 9.75, 10.0]
    assert len(run.frames) == max_text_frames(10_000, 250, 2000) == 9


def test_the_cloud_reply_of_100_deltas_over_10_s() -> None:
    run = Run(250, 2000).feed([0.1 * (i + 1) for i in range(100)])
    run.check()
    assert len(run.frames) == 9


def test_gaps_just_above_the_window_send_each_delta_at_once() -> None:
    # each delta arrives just after the window opened by the previous frame: no merging, no timer
    run = Run(250, 2000)
    times, t = [], 0.0
    for window in _windows(250, 2000, 12):
        times.append(t)
        t += window + 1e-6
    run.feed(times)
    run.check()
    assert len(run.frames) == 12 and [t for t, _ in run.frames] == times
    assert len(run.frames) <= max_text_frames((times[-1] - times[0]) * 1000, 250, 2000)


def test_gaps_just_below_the_window_are_held_to_its_end() -> None:
    run = Run(250, 2000)
    times, t = [], 0.0
    for window in _windows(250, 2000, 12):
        times.append(t)
        t += window - 1e-6
    run.feed(times)
    run.check()
    # every delta after the first waits for the timer at the end of the window it fell into
    assert [round(t, 6) for t, _ in run.frames[:4]] == [0, 0.25, 0.75, 1.75]


def test_bursts_merge_into_one_frame_per_window() -> None:
    # 50 deltas at the same instant, every 0.7 s, for a minute
    times = [0.7 * b for b in range(86) for _ in range(50)]
    run = Run(250, 2000).feed(times)
    run.check()
    assert len(run.frames) < 86


def test_a_very_long_reply_costs_one_frame_per_max_window() -> None:
    # an hour at 20 deltas a second
    run = Run(250, 2000).feed([i * 0.05 for i in range(72_000)])
    run.check()
    assert len(run.frames) == max_text_frames(3_600_000 - 50, 250, 2000)


@pytest.mark.parametrize("seed", range(40))
def test_random_timings_stay_within_the_bound(seed: int) -> None:
    rng = random.Random(seed)
    flush = rng.choice([10, 50, 100, 250, 400])
    top = rng.choice([0, flush, flush * 3, 1000, 2000, 5000])
    times, t = [], 0.0
    for _ in range(rng.randint(1, 400)):
        t += rng.choice([0.0, 0.0, rng.uniform(0, 0.05), rng.uniform(0, flush / 500), rng.uniform(0, 3)])
        times.append(t)
    run = Run(flush, top).feed(times, end_s=t + rng.choice([0.0, rng.uniform(0, 1)]))
    run.check()


def test_a_forced_flush_mid_message_adds_at_most_one_frame() -> None:
    # a tool_use block in the middle of the text forces the pending text out
    run = Run(250, 2000)
    for i in range(200):
        run.time.advance_to(i * 0.01)
        run.c.text("x")
        if i == 100:
            run.c.flush()
    run.time.advance_to(2.0)
    run.c.flush()
    span = (run.frames[-1][0] - run.frames[0][0]) * 1000
    assert len(run.frames) <= max_text_frames(span, 250, 2000, forced=2)
    assert "".join(t for _, t in run.frames) == "x" * 200


def test_zero_window_sends_every_delta() -> None:
    out: list[str] = []
    c = DeltaCoalescer(0, out.append)
    for s in ["a", "b", "", "c"]:
        c.text(s)
    assert out == ["a", "b", "c"]


# ---- on the real event loop -----------------------------------------------------------------------


async def test_first_delta_at_once_then_one_merged_delta_per_window() -> None:
    out: list[str] = []
    c = DeltaCoalescer(50, out.append)
    c.text("a")
    assert out == ["a"]
    c.text("b")
    c.text("c")
    assert out == ["a"] and c.pending
    await asyncio.sleep(0.25)
    assert out == ["a", "bc"] and not c.pending
    c.text("d")  # the window since the last flush has passed: goes at once
    c.text("e")  # within the new window: buffered
    assert out == ["a", "bc", "d"]
    c.flush()  # another event forces the pending text out first
    assert out == ["a", "bc", "d", "e"]
    await asyncio.sleep(0.25)
    assert out == ["a", "bc", "d", "e"]  # no timer left behind
