"""The session lease record on DynamoDB: exclusive, expiring, re-entrant, with seq blocks, the turn
queue and the signals; release returns what was added meanwhile."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import botocore.session
import pytest

from agentvm.adapters.aws.dynamodb_leases import DynamoDBLeases
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.domain.models import Checkpoint, Image, LeaseHandoff, LeaseState, Session, Turn, TurnStatus


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(aws_env: None, aws_session: botocore.session.Session,
                moto_endpoint: str) -> AsyncIterator[DynamoDBStore]:
    clock = Clock()
    s = DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", session=aws_session, endpoint_url=moto_endpoint,
                      clock=clock)
    await s.open()
    await s.create_table()
    await s.create_image(Image("t1", "i1", "c1", "s1", "n", 1, 1), Session("t1", "s1", "i1", "c1", 1, 1))
    yield s
    await s.close()


@pytest.fixture
def leases(store: DynamoDBStore) -> DynamoDBLeases:
    return DynamoDBLeases(store)


def seqs(state: LeaseState | None) -> tuple[int, int] | None:
    return None if state is None else (state.first_seq, state.last_seq)


async def test_lease_is_exclusive_reentrant_and_expires(store: DynamoDBStore, leases: DynamoDBLeases) -> None:
    clock = store._clock
    assert isinstance(clock, Clock)
    assert seqs(await leases.acquire("t1", "s1", "turn-A", 30_000, seq_block=100)) == (1, 100)
    assert await leases.acquire("t1", "s1", "ws-B", 30_000, seq_block=100) is None
    assert seqs(await leases.acquire("t1", "s1", "turn-A", 30_000, seq_block=100)) == (101, 200)  # re-entrant
    assert await leases.renew("t1", "s1", "ws-B", 30_000) is None
    renewed = await leases.renew("t1", "s1", "turn-A", 30_000)
    assert renewed is not None and renewed.held
    clock.now += 31  # the holder died without releasing: the lease expires
    assert (await leases.poll("t1", "s1")).held is False
    assert seqs(await leases.acquire("t1", "s1", "ws-B", 30_000, seq_block=10)) == (201, 210)
    assert await leases.release("t1", "s1", "turn-A") is None  # no longer the owner
    assert await leases.release("t1", "s1", "ws-B") == LeaseState()
    assert seqs(await leases.acquire("t1", "s1", "turn-C", 30_000, seq_block=10)) == (211, 220)
    # seqs from the lease and from reserve_seqs never overlap
    assert await store.reserve_seqs("t1", "s1", 10) == (221, 230)
    # a lease taken only to read (a replay) reserves no seq: an empty block (first above last)
    await leases.release("t1", "s1", "turn-C")
    assert seqs(await leases.acquire("t1", "s1", "ws-D", 30_000, seq_block=0)) == (231, 230)
    assert await store.reserve_seqs("t1", "s1", 10) == (231, 240)


async def test_lease_of_another_tenant_or_a_missing_session_is_refused(leases: DynamoDBLeases) -> None:
    assert await leases.acquire("t2", "s1", "x", 30_000, seq_block=10) is None
    assert await leases.acquire("t1", "nope", "x", 30_000, seq_block=10) is None
    assert await leases.request_interrupt("t2", "s1") is None


async def test_concurrent_acquirers_get_exactly_one_lease(leases: DynamoDBLeases) -> None:
    results = await asyncio.gather(*(leases.acquire("t1", "s1", f"owner-{i}", 30_000, seq_block=10)
                                     for i in range(10)))
    assert sum(r is not None for r in results) == 1


async def test_work_added_while_the_lease_is_held_comes_back_from_the_release(leases: DynamoDBLeases) -> None:
    await leases.acquire("t1", "s1", "ws-A", 30_000, seq_block=16)
    # ws-A announced turn-1 and queues it in its release
    rest = await leases.release("t1", "s1", "ws-A", queue="turn-1")
    assert rest == LeaseState(queued=frozenset({"turn-1"}))
    state = await leases.acquire("t1", "s1", "chat-B", 30_000, seq_block=100)
    assert state is not None and state.queued == {"turn-1"} and state.interrupts == 0
    # meanwhile: a message queued by another connection, a replay owed, an interrupt
    await leases.enqueue("t1", "s1", "turn-2", "conn-X")
    await leases.enqueue("t1", "s1", "turn-3", None)
    await leases.owe_replay("t1", "s1", "conn-Y")
    assert await leases.request_interrupt("t1", "s1") == 1
    polled = await leases.poll("t1", "s1", consistent=True)
    assert polled.held and (polled.interrupts, polled.interrupts_seen) == (1, 0)
    await leases.ack_interrupt("t1", "s1", "someone-else", 1)  # only the holder acknowledges
    assert (await leases.poll("t1", "s1", consistent=True)).interrupts_seen == 0
    await leases.ack_interrupt("t1", "s1", "chat-B", 1)
    assert (await leases.poll("t1", "s1", consistent=True)).interrupts_seen == 1
    assert polled.announce == {("turn-2", "conn-X"), ("turn-3", "")}
    # chat-B ran turn-1, announced turn-2 (only), served conn-Y: turn-2 and turn-3 are left
    rest = await leases.release("t1", "s1", "chat-B", done={"turn-1"}, announced={("turn-2", "conn-X")},
                                served={"conn-Y"})
    assert rest == LeaseState(queued=frozenset({"turn-2", "turn-3"}), announce=frozenset({("turn-3", "")}),
                              interrupts=1, interrupts_seen=1)
    assert rest.has_work
    # nobody holds the lease: an interrupt request has nothing to interrupt
    assert await leases.request_interrupt("t1", "s1") is None
    await leases.enqueue("t1", "nope", "turn-9", None)  # a missing session: nothing is recorded
    assert (await leases.poll("t1", "nope")) == LeaseState()


async def test_get_turns_reads_the_session_turns_oldest_first(store: DynamoDBStore, leases: DynamoDBLeases) -> None:
    turns = [Turn("t1", f"turn-{i}", "s1", "i1", "c1", f"m{i}", TurnStatus.QUEUED, created_at=100 - i)
             for i in range(3)]
    await store.commit(Checkpoint("t1", "s1", turns=turns))
    got = await leases.get_turns("t1", "s1", {"turn-0", "turn-2", "missing"})
    assert [t.turn_id for t in got] == ["turn-2", "turn-0"]
    assert await leases.get_turns("t2", "s1", {"turn-0"}) == []  # another tenant's session
    assert await leases.get_turns("t1", "s1", ()) == []


async def test_release_cannot_add_and_remove_queued_turns_at_once(leases: DynamoDBLeases) -> None:
    await leases.acquire("t1", "s1", "x", 30_000, seq_block=1)
    with pytest.raises(ValueError, match="queue and done"):
        await leases.release("t1", "s1", "x", queue="a", done={"b"})


async def test_a_clean_release_hands_the_next_seq_on(store: DynamoDBStore, leases: DynamoDBLeases) -> None:
    # chat_turn used seqs 1..7 of its block, then a container task takes the session: it goes on at 8
    assert seqs(await leases.acquire("t1", "s1", "turn-A", 30_000, seq_block=100)) == (1, 100)
    assert await leases.release("t1", "s1", "turn-A", next_seq=8) is not None
    assert seqs(await leases.acquire("t1", "s1", "task-B", 30_000, seq_block=100)) == (8, 200)
    # without a release (the holder died, its lease expired) the next block starts above everything
    # reserved: the dead holder may have published any seq of its block
    clock = store._clock
    assert isinstance(clock, Clock)
    clock.now += 31
    assert seqs(await leases.acquire("t1", "s1", "turn-C", 30_000, seq_block=100)) == (201, 300)
    # the hand-over is used once: a release without next_seq leaves the next holder a fresh block
    assert await leases.release("t1", "s1", "turn-C") is not None
    assert seqs(await leases.acquire("t1", "s1", "turn-D", 30_000, seq_block=100)) == (301, 400)
    assert await leases.release("t1", "s1", "turn-D", next_seq=305) is not None
    # a re-entrant acquire by the same owner never goes back to a handed-over seq it already passed
    assert seqs(await leases.acquire("t1", "s1", "turn-E", 30_000, seq_block=100)) == (305, 500)
    assert seqs(await leases.acquire("t1", "s1", "turn-E", 30_000, seq_block=100)) == (501, 600)


async def test_take_over_breaks_only_a_dead_runners_lease(store: DynamoDBStore, leases: DynamoDBLeases) -> None:
    """`take_over`: the lease of a runner Lambda reported dead, at once (before it expires), only while
    its mark is on the record and nobody else holds it; a live runner's lease is never taken."""
    clock = store._clock
    assert isinstance(clock, Clock)
    assert seqs(await leases.acquire("t1", "s1", "chat_turn:r1", 60_000, 100, runner=True)) == (1, 100)
    # another invocation's record (a runner that is alive): nothing happens
    assert await leases.take_over("t1", "s1", "turn_failed:x", "chat_turn:r2", 60_000, 100) is None
    assert await leases.renew("t1", "s1", "chat_turn:r1", 60_000) is not None  # r1 still holds it
    # r1 died holding it (well within its 60 s): its record takes the lease over, seqs above r1's block
    state = await leases.take_over("t1", "s1", "turn_failed:a", "chat_turn:r1", 60_000, 100)
    assert state is not None and (state.dead_runner, seqs(state), state.held) == ("chat_turn:r1", (101, 200), True)
    assert await leases.acquire("t1", "s1", "ws-B", 60_000, 0) is None  # the new holder's, not free
    # a second report of the same death finds the lease held by its recoverer: nothing happens
    assert await leases.take_over("t1", "s1", "turn_failed:b", "chat_turn:r1", 60_000, 100) is None
    assert await leases.release("t1", "s1", "turn_failed:a", next_seq=101, runner=True) is not None
    # after a clean release there is no mark to find: a late report changes nothing
    assert await leases.take_over("t1", "s1", "turn_failed:c", "chat_turn:r1", 60_000, 100) is None
    poll = await leases.poll("t1", "s1", consistent=True)
    assert (poll.held, poll.dead_runner) == (False, "")

    # a short-lived holder (ws_default after the dead lease expired) keeps the lease it holds
    assert await leases.acquire("t1", "s1", "chat_turn:r3", 60_000, 10, runner=True) is not None
    clock.now += 61
    assert await leases.acquire("t1", "s1", "ws-C", 60_000, 16) is not None
    assert await leases.take_over("t1", "s1", "turn_failed:d", "chat_turn:r3", 60_000, 100) is None
    assert await leases.release("t1", "s1", "ws-C") is not None
    # then, the lease free and the dead mark still there: taken over
    state = await leases.take_over("t1", "s1", "turn_failed:d", "chat_turn:r3", 60_000, 100)
    assert state is not None and state.dead_runner == "chat_turn:r3"


async def test_a_handed_on_lease_is_taken_over_once_by_its_runner(store: DynamoDBStore, leases: DynamoDBLeases) -> None:
    """ws_default takes the lease and queues the turn in one write, announces with seqs 1..2 and passes
    the lease on (no release): the runner started with the handoff takes it over at seq 3; nobody else
    can, and the handoff works once."""
    ws = await leases.acquire("t1", "s1", "ws-1/turn-1", 30_000, seq_block=16, queue="turn-1")
    assert ws is not None and seqs(ws) == (1, 16) and ws.queued == {"turn-1"}
    handoff = LeaseHandoff("ws-1/turn-1", next_seq=3)
    # another runner without the handoff, or with another message's, finds the lease held
    assert await leases.acquire("t1", "s1", "chat_turn:other", 30_000, seq_block=100, runner=True) is None
    assert await leases.acquire("t1", "s1", "chat_turn:other", 30_000, seq_block=100, runner=True,
                                handoff=LeaseHandoff("ws-9/turn-9", 3)) is None
    runner = await leases.acquire("t1", "s1", "chat_turn:r", 30_000, seq_block=100, runner=True, handoff=handoff)
    assert runner is not None and seqs(runner) == (3, 116) and runner.queued == {"turn-1"}
    assert runner.held and runner.dead_runner == ""
    # a second delivery of the same dispatch finds the runner's lease: the turn does not run twice
    assert await leases.acquire("t1", "s1", "chat_turn:dup", 30_000, seq_block=100, runner=True,
                                handoff=handoff) is None
    rest = await leases.release("t1", "s1", "chat_turn:r", done={"turn-1"}, next_seq=9, runner=True)
    assert rest is not None and not rest.has_work
    # a handoff found after the lease changed hands is an ordinary acquire: the released next_seq wins
    assert seqs(await leases.acquire("t1", "s1", "chat_turn:late", 30_000, seq_block=10, runner=True,
                                     handoff=handoff)) == (9, 126)


async def test_a_handed_on_lease_that_expired_still_continues_the_seqs(store: DynamoDBStore,
                                                                       leases: DynamoDBLeases) -> None:
    assert await leases.acquire("t1", "s1", "ws-1/turn-1", 30_000, seq_block=16, queue="turn-1") is not None
    clock = store._clock
    assert isinstance(clock, Clock)
    clock.now += 31  # the runner started late (nobody took the lease meanwhile)
    late = await leases.acquire("t1", "s1", "chat_turn:r", 30_000, seq_block=100, runner=True,
                                handoff=LeaseHandoff("ws-1/turn-1", 3))
    assert seqs(late) == (3, 116)
    # without the handoff an expired lease's block is skipped: its holder may have used any of it
    clock.now += 31
    assert seqs(await leases.acquire("t1", "s1", "chat_turn:s", 30_000, seq_block=10, runner=True)) == (117, 126)


def test_a_handoff_from_a_payload_is_validated() -> None:
    assert LeaseHandoff.from_wire({"owner": "ws-1/turn-1", "nextSeq": 3}) == LeaseHandoff("ws-1/turn-1", 3)
    assert LeaseHandoff("o", 7).to_wire() == {"owner": "o", "nextSeq": 7}
    for bad in (None, "x", [], {"owner": "o"}, {"owner": "", "nextSeq": 3}, {"owner": 5, "nextSeq": 3},
                {"owner": "o", "nextSeq": "3"}, {"owner": "o", "nextSeq": True}, {"owner": "o", "nextSeq": 0}):
        assert LeaseHandoff.from_wire(bad) is None, bad
