from __future__ import annotations

import asyncio

from agentvm.engine.coalescer import DeltaCoalescer


async def test_zero_window_sends_every_delta() -> None:
    out: list[str] = []
    c = DeltaCoalescer(0, out.append)
    for s in ["a", "b", "", "c"]:
        c.text(s)
    assert out == ["a", "b", "c"]


async def test_first_delta_at_once_then_one_merged_delta_per_window() -> None:
    out: list[str] = []
    c = DeltaCoalescer(50, out.append)
    c.text("a")
    assert out == ["a"]
    c.text("b")
    c.text("c")
    assert out == ["a"] and c.pending
    await asyncio.sleep(0.08)
    assert out == ["a", "bc"] and not c.pending
    c.text("d")  # the window after the last flush has not passed: buffered
    assert out == ["a", "bc"]
    c.flush()  # another event forces the pending text out first
    assert out == ["a", "bc", "d"]
    await asyncio.sleep(0.08)
    assert out == ["a", "bc", "d"]  # no timer left behind


async def test_a_hundred_deltas_over_a_second_become_about_one_frame_per_window() -> None:
    out: list[str] = []
    c = DeltaCoalescer(250, out.append)
    for i in range(100):
        c.text(f"{i},")
        await asyncio.sleep(0.01)
    c.flush()
    assert "".join(out) == "".join(f"{i}," for i in range(100))
    assert len(out) <= 8  # ~1.2 s of deltas in 250 ms windows


async def test_growing_window_keeps_a_long_reply_to_few_frames() -> None:
    # 100 deltas over ~1 s with a 25 ms window growing ×1.5 to 100 ms: the cloud's 100 deltas over
    # 10 s at 250 ms → 1 s, scaled down ten times. A fixed window would give ~40 frames.
    out: list[str] = []
    c = DeltaCoalescer(25, out.append, max_flush_ms=100)
    for i in range(100):
        c.text(f"{i},")
        await asyncio.sleep(0.01)
    c.flush()
    assert "".join(out) == "".join(f"{i}," for i in range(100))
    assert out[0] == "0,"
    # with the ~8 other events of a turn this stays within 25 frames
    assert len(out) <= 17, len(out)
    fixed: list[str] = []
    f = DeltaCoalescer(25, fixed.append)
    for i in range(100):
        f.text(f"{i},")
        await asyncio.sleep(0.01)
    f.flush()
    assert len(fixed) > len(out) + 10
