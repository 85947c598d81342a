"""SessionHistory: one store read, then an incremental context equal to a full rebuild."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.domain.models import Checkpoint, Image, Session, StoredMessage
from agentvm.engine.context import build_context
from agentvm.engine.history import SessionHistory
from agentvm.protocol import messages as m


def sm(body: dict[str, object], turn: str) -> StoredMessage:
    return StoredMessage("s1", str(body["id"]), dict(body), turn)


async def test_incremental_context_equals_a_full_rebuild(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "db")
    await store.open()
    await store.create_image(Image("t", "i1", "c", "s1", "n", 1, 1), Session("t", "s1", "i1", "c", 1, 1))
    first = [sm(m.user_message("u1", "first", 1), "t1"), sm(m.assistant_message("a1", "one", 2), "t1")]
    await store.commit(Checkpoint("t", "s1", messages=first))
    history = SessionHistory(store, "t", "s1")
    loaded = await history.load()
    assert [x.message_id for x in loaded] == ["u1", "a1"]

    steps = [
        ([sm(m.user_message("u2", "second", 3), "t2")], "t2"),
        # t3 is queued while t2 runs: its user message is stored before t2's answer
        ([sm(m.user_message("u3", "third", 4), "t3")], "t2"),
        ([sm(m.tool_call_message("c1", "toolu_1", "Bash", {}, "a2", 5), "t2"),
          sm(m.assistant_message("a2", "looking", 5), "t2"),
          sm(m.tool_result_message("r1", "toolu_1", "Bash", "x", False, 6), "t2"),
          sm(m.error_message("e1", "boom", "api_error", 7), "t2")], "t3"),
        ([sm(m.user_message("u4", "fourth", 8), "t4")], "t4"),
    ]
    for messages, until in steps:
        await store.commit(Checkpoint("t", "s1", messages=messages))
        history.extend(messages)
        full = build_context(await store.list_messages("t", "s1"),
                             until_message_id=next(x.message_id for x in await history.load()
                                                   if x.turn_id == until and x.subtype == "user"))
        before = copy.deepcopy(history._built)
        assert history.context(until) == full
        assert history.context(until) == full  # a second call sees the same (cached, unmodified) turns
        # joining never modifies a cached turn: turns that did not change are exactly as before
        unchanged = {k for k, (count, _) in before.items() if count == len(history._groups[k])}
        assert {k: history._built[k] for k in unchanged} == {k: before[k] for k in unchanged}
    # t2 ended in an error: its tool result makes a user entry that merges with t3's message
    final = history.context("t3")
    assert final[-1] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x", "is_error": False},
        {"type": "text", "text": "third"}]}
    await store.close()


async def test_messages_committed_during_the_first_read_are_not_lost(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "db")
    await store.open()
    await store.create_image(Image("t", "i1", "c", "s1", "n", 1, 1), Session("t", "s1", "i1", "c", 1, 1))
    history = SessionHistory(store, "t", "s1")
    late = sm(m.user_message("u1", "hi", 1), "t1")
    pending = asyncio.ensure_future(history.load())
    await asyncio.sleep(0)  # the read is queued on the store thread
    await store.commit(Checkpoint("t", "s1", messages=[late]))
    history.extend([late])
    rows = await pending
    assert [x.message_id for x in rows] == ["u1"]  # once, whether the read saw it or not
    await store.close()
