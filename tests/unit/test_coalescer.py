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
