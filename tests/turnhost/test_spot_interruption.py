"""A Fargate Spot interruption (or any SIGTERM: scale-in, a deploy) of `python -m agentvm.turnhost` as a
real process against moto and the emulated edge, mid-turn, with a priced model and a budget:

(a) the drain is long enough: the running turn completes on the host, the turn queued behind it in the
same session is handed back and runs on `chat_turn` at once, the host exits 0 well within the
120 s stopTimeout, no seq twice, nothing held on the budget;
(b) the drain is shorter than the turn (a reply longer than the two-minute warning): the turn is
interrupted (`host_stopped`, its reply so far kept and billed), the host exits 0, its lease is
released at once (the session's next message runs on `chat_turn` without waiting for a 30 s lease to
expire or a sweep), and nothing stays held on the budget.
"""

from __future__ import annotations

import asyncio
import signal
import time
from decimal import Decimal

from agentvm.adapters.aws.dynamodb_usage import DynamoDBUsageLedger
from agentvm.domain.usage import Budget, period_of
from agentvm.hosting.drain import HOST_STOPPED, HOST_STOPPED_TEXT
from agentvm.ids import now_ms
from tests.cloud.test_turn_host_process import MODEL, TENANT, Stack, stack, turn_host
from tests.support.stock_client import StockClient

__all__ = ["stack"]  # the fixture: a table, a queue, the emulated edge with chat_turn on moto

LONG_LEASE = "30"  # a lease the host does not release would block the session's next turn this long


async def budget(s: Stack) -> tuple[DynamoDBUsageLedger, str]:
    ledger = DynamoDBUsageLedger(s.store)
    await ledger.put_budget(Budget(TENANT, monthly=Decimal(5), updated_at=now_ms()))
    return ledger, period_of(now_ms())


async def deltas(c: StockClient, n: int, start: int) -> None:
    deadline = time.monotonic() + 20
    while sum(e.get("type") == "text_delta" for e in c.events[start:]) < n:
        assert time.monotonic() < deadline, "the turn did not stream"
        await asyncio.sleep(0.02)


def responses(c: StockClient, start: int) -> list[dict[str, object]]:
    return [e["data"] for e in c.events[start:] if e.get("type") == "turn_response"]


async def test_sigterm_mid_turn_the_turn_completes_and_the_one_queued_behind_it_runs_on_chat_turn(
        stack: Stack) -> None:
    ledger, period = await budget(stack)
    async with StockClient(stack.edge.url) as c:
        image = await c.new_image("c-spot-a", model=MODEL)
        sid, start = image["sessionId"], len(c.events)
        async with turn_host(stack, AVM_TURN_HOST_DRAIN_S="60", AVM_SESSION_LEASE_S=LONG_LEASE) as proc:
            res = await c.request("message_send_request", {"imageId": image["imageId"], "content": "slow first"})
            assert "error" not in res["data"], res["data"]
            await deltas(c, 3, start)
            res = await c.request("message_send_request", {"imageId": image["imageId"], "content": "slow second"})
            assert "error" not in res["data"], res["data"]
            await c.wait_for(lambda e: e.get("type") == "conversation_queued", 10, start)
            await asyncio.sleep(0.5)  # the host has received the second request (a session it runs: joined)
            proc.send_signal(signal.SIGTERM)  # the Spot interruption's warning
            stopped = time.monotonic()
            assert await asyncio.wait_for(proc.wait(), 60) == 0
            exited = time.monotonic() - stopped
        await c.wait_for(lambda e: e.get("type") == "turn_response", 30,
                         next(i for i, e in enumerate(c.events) if e.get("type") == "turn_response") + 1)
        await stack.edge.settle(include_invokes=True)
    # the first turn's remaining ~2.5 s of reply, then the exit: far inside the 120 s stopTimeout
    assert exited < 15, exited
    assert [(r["status"]) for r in responses(c, start)] == ["completed", "completed"]
    assert stack.chat_turns() == [sid]  # the second turn: handed back, on chat_turn
    turns = await stack.store.list_turns(TENANT, sid)
    assert [(t.status, t.error_code) for t in turns] == [("completed", None), ("completed", None)]
    seqs = [e["seq"] for e in c.events if "seq" in e and e["context"].get("sessionId", sid) == sid]
    assert seqs == sorted(set(seqs))  # none twice, in order
    assert (await ledger.spend(TENANT, None, period)).reserved == 0


async def test_sigterm_with_a_drain_shorter_than_the_turn_interrupts_it_and_releases_the_lease_at_once(
        stack: Stack) -> None:
    ledger, period = await budget(stack)
    async with StockClient(stack.edge.url) as c:
        image = await c.new_image("c-spot-b", model=MODEL)
        sid, start = image["sessionId"], len(c.events)
        async with turn_host(stack, AVM_TURN_HOST_DRAIN_S="0.5", AVM_SESSION_LEASE_S=LONG_LEASE) as proc:
            res = await c.request("message_send_request", {"imageId": image["imageId"], "content": "slow, reclaimed"})
            assert "error" not in res["data"], res["data"]
            await deltas(c, 3, start)
            assert (await ledger.spend(TENANT, None, period)).reserved > 0  # the streaming call's hold
            proc.send_signal(signal.SIGTERM)
            stopped = time.monotonic()
            ended = await c.wait_for(lambda e: e.get("type") == "turn_response", 10, start)
            interrupted_after = time.monotonic() - stopped
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert ended["data"]["status"] == "interrupted"
        assert 0.4 < interrupted_after < 2.5, interrupted_after  # the 0.5 s drain, then at once
        streamed = sum(e.get("type") == "text_delta" for e in c.events[start:])
        assert 3 <= streamed < 20  # the reply was cut, not finished
        assert (await ledger.spend(TENANT, None, period)).reserved == 0
        assert stack.chat_turns() == []

        # the lease was released: the next message runs now on chat_turn (not after 30 s and a sweep). First
        # the dispatchers' 2 s directory cache lapses (a message sent within it goes to the queue, where
        # no host reads it any more: turn_sweep re-dispatches it, docs/cloud-design.md)
        await asyncio.sleep(2.1)
        began = time.monotonic()
        after = await c.turn(image["imageId"], "hello again", timeout=10)
        assert time.monotonic() - began < 8
        await stack.edge.settle(include_invokes=True)
    assert after[-1]["data"]["status"] == "completed"
    assert stack.chat_turns() == [sid]
    assert not [e for e in c.events[start:] if e.get("type") == "error_occurred"]  # no worker_lost
    turns = await stack.store.list_turns(TENANT, sid)
    assert [(t.status, t.error_code, t.error_message) for t in turns] == [
        ("interrupted", HOST_STOPPED, HOST_STOPPED_TEXT), ("completed", None, None)]
    assert (await ledger.spend(TENANT, None, period)).reserved == 0
    seqs = [e["seq"] for e in c.events if "seq" in e and e["context"].get("sessionId", sid) == sid]
    assert seqs == sorted(set(seqs))
