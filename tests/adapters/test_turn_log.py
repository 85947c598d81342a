"""The `TurnLog` port contract: every Store adapter runs it (the `store` fixture: SQLite, DynamoDB)."""

from __future__ import annotations

import pytest

from agentvm.domain.models import Checkpoint, Turn, TurnStatus
from agentvm.errors import InvalidRequest
from agentvm.ports import Store
from tests.adapters.store_records import image


async def test_the_tenants_turn_log_lists_finished_turns_newest_first_in_pages(store: Store) -> None:
    await store.create_image(*image("t1", "i1"))
    await store.create_image(*image("t2", "i2"))
    statuses = [TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.RUNNING, TurnStatus.INTERRUPTED,
                TurnStatus.COMPLETED, TurnStatus.QUEUED]
    turns = [Turn("t1", f"turn{i}", "sess_i1", "i1", "c1", f"m{i}", st, 100 + i * 10, agent="code:chat_basic@1",
                  task=f"task {i}", options={"temperature": 0.5} if i == 0 else {}, started_at=100 + i * 10,
                  ended_at=105 + i * 10, key_id="avmk_k1" if i == 0 else None,
                  first_token_ms=3 if i == 0 else None)
             for i, st in enumerate(statuses)]
    await store.commit(Checkpoint("t1", "sess_i1", turns=turns))
    await store.commit(Checkpoint("t2", "sess_i2", turns=[Turn("t2", "other", "sess_i2", "i2", "c1", "m",
                                                               TurnStatus.COMPLETED, 120)]))
    first, cursor = await store.list_tenant_turns("t1", limit=2)
    assert [t.turn_id for t in first] == ["turn4", "turn3"] and cursor is not None
    second, cursor2 = await store.list_tenant_turns("t1", limit=2, cursor=cursor)
    assert [t.turn_id for t in second] == ["turn1", "turn0"] and cursor2 is None
    assert (second[1].agent, second[1].task, second[1].options, second[1].duration_ms, second[1].key_id,
            second[1].first_token_ms) == ("code:chat_basic@1", "task 0", {"temperature": 0.5}, 5, "avmk_k1", 3)
    assert (second[0].key_id, second[0].first_token_ms) == (None, None)
    window, _ = await store.list_tenant_turns("t1", since_ms=110, until_ms=140)
    assert [t.turn_id for t in window] == ["turn3", "turn1"]
    assert [t.turn_id for t in (await store.list_tenant_turns("t2"))[0]] == ["other"]
    assert (await store.list_tenant_turns("t3")) == ([], None)
    with pytest.raises(InvalidRequest, match="cursor: not a cursor of this list"):
        await store.list_tenant_turns("t1", cursor="bogus!")
    # a turn that finishes later joins the log
    turns[2].status = TurnStatus.COMPLETED
    await store.commit(Checkpoint("t1", "sess_i1", turns=[turns[2]]))
    assert [t.turn_id for t in (await store.list_tenant_turns("t1"))[0]] == ["turn4", "turn3", "turn2", "turn1",
                                                                             "turn0"]
