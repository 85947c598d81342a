"""Disconnect storms: clients that drop and reconnect with `afterSeq` at random points while turns run
end with every event of their sessions exactly once, in order, with no gap.

The small version of the `make bench` storm (tests/bench/storm.py: 40 turns here, 500 there), and
a deterministic regression test for the loss it found: a checkpoint that ran while a replay was
reading the store took the unpersisted tail away from that replay.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentvm.domain.models import Checkpoint, LoggedEvent
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from tests.bench.storm import QUICK, run_storm
from tests.support.servers import in_process
from tests.support.stock_client import StockClient

pytestmark = pytest.mark.e2e


async def test_every_follower_ends_with_every_event_exactly_once_in_order(tmp_path: Path) -> None:
    result = await run_storm(QUICK, tmp_path)
    assert result.problems == [], result.summary()
    assert result.ok, result.summary()
    assert (result.duplicates, result.gaps, result.out_of_order, result.mismatched, result.log_gaps) == (0, 0, 0, 0, 0)
    assert result.turns == QUICK.turns
    assert result.events_delivered == result.events_expected > 0
    # the storm really stormed: many reconnects, of both kinds, some while a replay was being read
    assert result.reconnects >= QUICK.clients * 5
    assert 0 < result.aborted < result.reconnects + QUICK.clients
    assert result.dropped_at_subscribe > 0


SLOW = parse_script("""
rules:
  - match: "^slow"
    responses:
      - text: ["a ", "b ", "c ", "d ", "e ", "f ", "g ", "h "]
        delay_ms: 60
""")


async def test_a_checkpoint_during_the_replays_store_read_loses_nothing(tmp_path: Path) -> None:
    """`avm serve`'s session host: a replay is the stored log plus the actor's unpersisted tail. The
    checkpoint is forced right after the replay's store read returns: the events it takes were not in
    that read, so the replay has them only if it copied the tail before reading."""
    async with in_process(tmp_path / "d", driver=ScriptedDriver(SLOW)) as srv:
        rt = srv.runtime
        async with StockClient(srv.url) as sender:
            image = await sender.new_image("c1")
            sid = image["sessionId"]
            start = len(sender.events)
            await sender.request("message_send_request", {"imageId": image["imageId"], "content": "slow one"})
            for _ in range(100):  # two deltas out: the turn's events so far are unpersisted
                if sum(1 for e in sender.events[start:] if e["type"] == "text_delta") >= 2:
                    break
                await asyncio.sleep(0.02)
            actor = rt.sessions._actors[sid]
            assert actor.replay_tail(0), "the turn's events should not be persisted yet"
            read_events = rt.store.read_events
            forced: list[LoggedEvent] = []

            async def read_then_checkpoint(tenant_id: str, session_id: str, after_seq: int,
                                           *args: Any, **kwargs: Any) -> list[LoggedEvent]:
                stored = await read_events(tenant_id, session_id, after_seq, *args, **kwargs)
                if session_id == sid and not forced:
                    forced.extend(actor.channel.take_pending())
                    await rt.store.commit(Checkpoint(tenant_id, session_id, events=forced))
                return stored

            rt.store.read_events = read_then_checkpoint  # type: ignore[method-assign]
            try:
                async with StockClient(srv.url) as follower:
                    await follower.send_raw({"type": "subscribe", "sessionId": sid, "afterSeq": 0})
                    await follower.wait_type("turn_response", timeout=10)
                    await sender.wait_type("turn_response", start=start, timeout=10)
                    got = [e["seq"] for e in follower.events if "seq" in e]
            finally:
                rt.store.read_events = read_events  # type: ignore[method-assign]
            assert forced, "the forced checkpoint did not run"
            assert got == list(range(got[0], got[-1] + 1)) and got[0] == 1, got
            live = [e["seq"] for e in sender.events if "seq" in e and e["type"] != "user_message"]
            assert set(live) <= set(got) and got[-1] == live[-1]
