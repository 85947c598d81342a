"""The `SessionLog` port contract: every Store adapter runs it (the `store` fixture: SQLite, DynamoDB)."""

from __future__ import annotations

from agentvm.domain.models import Checkpoint, LoggedEvent, StoredMessage, Turn, TurnStatus, Usage
from agentvm.ports import Store
from tests.adapters.store_records import image


async def test_checkpoints_are_atomic_and_idempotent(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    turn = Turn("t1", "turn1", "sess_i1", "i1", "c1", "m1", TurnStatus.QUEUED, 5)
    msg = StoredMessage("sess_i1", "m1", {"id": "m1", "role": "user", "subtype": "user", "content": "hi",
                                         "timestamp": 5}, "turn1")
    events = [LoggedEvent(1, "message_persisted", '{"seq":1}', 5), LoggedEvent(2, "text_delta", '{"seq":2}', 6)]
    await store.commit(Checkpoint("t1", "sess_i1", messages=[msg], events=events, turns=[turn]))
    await store.commit(Checkpoint("t1", "sess_i1", messages=[msg], events=events))  # replayed: no duplicates
    assert [m.message_id for m in await store.list_messages("t1", "sess_i1")] == ["m1"]
    assert await store.list_messages("t2", "sess_i1") == []
    assert [e.seq for e in await store.read_events("t1", "sess_i1", 0)] == [1, 2]
    assert [e.seq for e in await store.read_events("t1", "sess_i1", 1)] == [2]
    assert await store.read_events("t2", "sess_i1", 0) == []
    assert await store.last_seq("t1", "sess_i1") == 2
    turn.status, turn.usage, turn.billed_cost = TurnStatus.COMPLETED, Usage(10, 20, 3, 4), "0.00012345"
    await store.commit(Checkpoint("t1", "sess_i1", turns=[turn]))
    stored = await store.get_turn("t1", "turn1")
    assert stored is not None and stored.status is TurnStatus.COMPLETED
    assert stored.usage == Usage(10, 20, 3, 4) and stored.billed_cost == "0.00012345"
    assert await store.get_turn("t2", "turn1") is None
    assert [t.turn_id for t in await store.list_turns("t1", "sess_i1")] == ["turn1"]


async def test_seq_reservations_never_go_back(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    assert await store.reserve_seqs("t1", "sess_i1", 100) == (1, 100)
    assert await store.reserve_seqs("t1", "sess_i1", 100) == (101, 200)
    await store.commit(Checkpoint("t1", "sess_i1", events=[LoggedEvent(500, "x", "{}", 1)]))
    assert await store.reserve_seqs("t1", "sess_i1", 10) == (501, 510)


async def test_unfinished_turns_and_event_pruning(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    turns = [Turn("t1", f"turn{i}", "sess_i1", "i1", "c1", f"m{i}", st, i)
             for i, st in enumerate([TurnStatus.QUEUED, TurnStatus.RUNNING, TurnStatus.COMPLETED])]
    events = [LoggedEvent(i, "x", "{}", created) for i, created in [(1, 100), (2, 200), (3, 300)]]
    await store.commit(Checkpoint("t1", "sess_i1", events=events, turns=turns))
    assert [t.turn_id for t in await store.list_unfinished_turns()] == ["turn0", "turn1"]
    assert await store.prune_events(older_than_ms=1000) == 2  # the newest event of a session stays
    assert [e.seq for e in await store.read_events("t1", "sess_i1", 0)] == [3]
