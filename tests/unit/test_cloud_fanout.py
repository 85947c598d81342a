"""CloudFanout with an in-memory API Gateway and connection registry."""

from __future__ import annotations

import asyncio
import json

from agentvm.adapters.aws.cloud_fanout import CloudFanout
from agentvm.domain.models import ConnectionRecord, LoggedEvent, Subscription


class FakeGateway:
    def __init__(self, gone: set[str] | None = None) -> None:
        self.posts: list[tuple[str, str]] = []
        self.gone = gone or set()

    async def post(self, connection_id: str, frame: str) -> bool:
        await asyncio.sleep(0)
        if connection_id in self.gone:
            return False
        self.posts.append((connection_id, frame))
        return True

    def frames(self, connection_id: str) -> list[int]:
        return [json.loads(f)["seq"] for c, f in self.posts if c == connection_id]


class MemoryRegistry:
    def __init__(self) -> None:
        self.subs: dict[tuple[str, str], dict[str, Subscription]] = {}
        self.watches: dict[tuple[str, str], set[str]] = {}
        self.deleted: list[str] = []

    async def put_connection(self, record: ConnectionRecord) -> None: ...
    async def get_connection(self, connection_id: str) -> ConnectionRecord | None:
        return None

    async def delete_connection(self, connection_id: str) -> None:
        self.deleted.append(connection_id)
        for subs in self.subs.values():
            subs.pop(connection_id, None)

    async def put_subscription(self, tenant_id: str, session_id: str, sub: Subscription) -> None:
        self.subs.setdefault((tenant_id, session_id), {})[sub.connection_id] = sub

    async def subscribers(self, tenant_id: str, session_id: str, *, consistent: bool = True) -> list[Subscription]:
        return list(self.subs.get((tenant_id, session_id), {}).values())

    async def watch(self, tenant_id: str, container_id: str, connection_id: str) -> None:
        self.watches.setdefault((tenant_id, container_id), set()).add(connection_id)

    async def watchers(self, tenant_id: str, container_id: str) -> list[str]:
        return sorted(self.watches.get((tenant_id, container_id), set()))


def ev(seq: int) -> str:
    return json.dumps({"type": "text_delta", "seq": seq})


async def test_session_events_reach_every_subscriber_in_order_and_not_the_excluded() -> None:
    gw, reg = FakeGateway(), MemoryRegistry()
    await reg.put_subscription("t1", "s1", Subscription("a"))
    await reg.put_subscription("t1", "s1", Subscription("b"))
    await reg.put_subscription("t2", "s1", Subscription("other-tenant"))
    fan = CloudFanout(gateway=gw, registry=reg, tenant_id="t1")
    for seq in range(1, 6):
        fan.to_session("s1", seq, ev(seq), exclude="b" if seq == 2 else None)
    fan.to_connection("a", json.dumps({"type": "x_response", "seq": 99}))
    await fan.drain()
    assert gw.frames("a") == [1, 2, 3, 4, 5, 99]
    assert gw.frames("b") == [1, 3, 4, 5]
    assert gw.frames("other-tenant") == []


async def test_lifecycle_events_go_to_the_container_watchers() -> None:
    gw, reg = FakeGateway(), MemoryRegistry()
    fan = CloudFanout(gateway=gw, registry=reg, tenant_id="t1")
    fan.watch("a", "user-1")
    await fan.drain()
    fan.to_container("t1", "user-1", ev(1))
    fan.to_container("t1", "user-2", ev(2))
    await fan.drain()
    assert gw.frames("a") == [1]


async def test_a_gone_connection_is_dropped_and_counted_out() -> None:
    gw, reg = FakeGateway(gone={"b"}), MemoryRegistry()
    await reg.put_subscription("t1", "s1", Subscription("a"))
    await reg.put_subscription("t1", "s1", Subscription("b"))
    fan = CloudFanout(gateway=gw, registry=reg, tenant_id="t1")
    fan.to_session("s1", 1, ev(1))
    fan.to_session("s1", 2, ev(2))
    await fan.drain()
    assert gw.frames("a") == [1, 2]
    assert reg.deleted == ["b"]
    assert fan.listeners("s1") == 1


async def test_a_subscriber_arriving_mid_stream_gets_what_it_missed_once_in_order() -> None:
    gw, reg = FakeGateway(), MemoryRegistry()
    await reg.put_subscription("t1", "s1", Subscription("a"))
    stored = [LoggedEvent(s, "text_delta", ev(s), 0) for s in (3, 4)]  # from an earlier invocation

    async def replay(session_id: str, after: int) -> list[LoggedEvent]:
        return [e for e in stored if e.seq > after]

    fan = CloudFanout(gateway=gw, registry=reg, tenant_id="t1", refresh_s=0, replay_source=replay)
    for seq in (10, 11, 12):
        fan.to_session("s1", seq, ev(seq))
    await fan.drain()
    # b reconnected elsewhere with afterSeq=2; its stored-log replay is owed by this lease holder
    await reg.put_subscription("t1", "s1", Subscription("b", after_seq=2, pending=True))
    # c was already replayed up to 11 by ws_default
    await reg.put_subscription("t1", "s1", Subscription("c", after_seq=5, replayed_seq=11))
    for seq in (13, 14):
        fan.to_session("s1", seq, ev(seq))
    await fan.drain()
    assert gw.frames("a") == [10, 11, 12, 13, 14]
    assert gw.frames("b") == [3, 4, 10, 11, 12, 13, 14]
    assert gw.frames("c") == [12, 13, 14]
    assert reg.subs[("t1", "s1")]["b"] == Subscription("b", 2, 4, False, since_seq=4)


async def test_subscribe_with_after_seq_replays_and_records_how_far() -> None:
    gw, reg = FakeGateway(), MemoryRegistry()
    fan = CloudFanout(gateway=gw, registry=reg, tenant_id="t1")

    async def source(after_seq: int) -> list[LoggedEvent]:
        return [LoggedEvent(s, "x", ev(s), 0) for s in (5, 6, 7) if s > after_seq]

    await fan.subscribe("a", "s1", "user-1", 5, source)
    fan.to_session("s1", 7, ev(7))  # already replayed: not sent twice
    fan.to_session("s1", 8, ev(8))
    await fan.drain()
    assert gw.frames("a") == [6, 7, 8]
    assert reg.subs[("t1", "s1")]["a"] == Subscription("a", after_seq=5, replayed_seq=7, since_seq=7)
    assert await reg.watchers("t1", "user-1") == ["a"]


async def test_a_live_connection_is_a_cursor_across_invocations() -> None:
    """What a connection received (live since its subscription began, or replayed) is not sent again
    when it subscribes once more with an older afterSeq, as from `avm serve`."""
    gw, reg = FakeGateway(), MemoryRegistry()
    log = [LoggedEvent(s, "x", ev(s), 0) for s in range(1, 7)]
    head = 3

    async def heads(session_id: str) -> int:
        return head

    async def source(after_seq: int) -> list[LoggedEvent]:
        return [e for e in log if head >= e.seq > after_seq]

    first = CloudFanout(gateway=gw, registry=reg, tenant_id="t1", head_source=heads)
    first.attach("live", "s1", "c1")  # subscribed when the log's head was 3
    first.attach("idle", "s1", "c1")
    await first.drain()
    assert reg.subs[("t1", "s1")]["live"] == Subscription("live", since_seq=3)
    # no event since `idle` subscribed: a re-subscribe from 0 replays the whole log
    again = CloudFanout(gateway=gw, registry=reg, tenant_id="t1", head_source=heads)
    await again.subscribe("idle", "s1", "c1", 0, source)
    await again.drain()
    assert gw.frames("idle") == [1, 2, 3]
    # seqs 4..6 were then delivered live to both; a later subscribe from 0 sends nothing again
    head = 6
    later = CloudFanout(gateway=gw, registry=reg, tenant_id="t1", head_source=heads)
    await later.subscribe("live", "s1", "c1", 0, source)
    await later.subscribe("idle", "s1", "c1", 2, source)
    await later.drain()
    assert gw.frames("live") == [] and gw.frames("idle") == [1, 2, 3]
    assert reg.subs[("t1", "s1")]["live"] == Subscription("live", after_seq=0, replayed_seq=6, since_seq=6)


# ---- batched frames (docs/protocol.md, "Batched frames") ----------------------------------------


def posted(gw: FakeGateway, connection_id: str) -> list[list[int] | int]:
    """Each post to the connection: a batch as the list of its seqs, a single event as its seq."""
    out: list[list[int] | int] = []
    for c, f in gw.posts:
        if c == connection_id:
            body = json.loads(f)
            out.append([e["seq"] for e in body] if isinstance(body, list) else body["seq"])
    return out


async def test_a_batched_subscriber_gets_each_tick_in_one_frame_and_a_stock_one_event_per_frame() -> None:
    gw, reg = FakeGateway(), MemoryRegistry()
    await reg.put_subscription("t1", "s1", Subscription("stock"))
    await reg.put_subscription("t1", "s1", Subscription("batched", batch=True))
    fan = CloudFanout(gateway=gw, registry=reg, tenant_id="t1")
    fan.to_session("s1", 1, ev(1))
    fan.to_session("s1", 2, ev(2))
    await fan.drain()
    fan.to_session("s1", 3, ev(3))  # alone in its tick: the event's own object
    await fan.drain()
    for seq in (4, 5, 6, 7):
        fan.to_session("s1", seq, ev(seq), exclude="batched" if seq == 5 else None)
    await fan.drain()
    assert posted(gw, "stock") == [1, 2, 3, 4, 5, 6, 7]
    assert posted(gw, "batched") == [[1, 2], 3, [4, 6, 7]]
    # the batch is the events' own JSON texts, joined
    assert next(f for c, f in gw.posts if c == "batched") == f"[{ev(1)},{ev(2)}]"


async def test_a_batch_stays_within_32_kb_and_a_bigger_event_goes_alone() -> None:
    gw, reg = FakeGateway(), MemoryRegistry()
    fan = CloudFanout(gateway=gw, registry=reg, tenant_id="t1")
    fan.known(ConnectionRecord("b", "t1", None, 0, batch=True))

    def big(seq: int, size: int) -> str:
        return json.dumps({"type": "tool_result", "seq": seq, "pad": "x" * size})

    sizes = [10_000, 10_000, 10_000, 10_000, 40_000, 100, 100]
    for seq, size in enumerate(sizes, 1):
        fan.to_connection("b", big(seq, size))
    await fan.drain()
    assert posted(gw, "b") == [[1, 2, 3], 4, 5, [6, 7]]
    assert all(len(f.encode()) <= 32 * 1024 for c, f in gw.posts if f.startswith("["))


async def test_a_batched_connection_known_from_its_record_gets_batches_and_subscribes_batched() -> None:
    gw, reg = FakeGateway(), MemoryRegistry()
    fan = CloudFanout(gateway=gw, registry=reg, tenant_id="t1")
    fan.known(ConnectionRecord("b", "t1", None, 0, batch=True))
    fan.attach("b", "s1", "c1")
    fan.to_session("s1", 1, ev(1))
    fan.to_connection("b", json.dumps({"type": "message_send_response", "seq": 99}))
    await fan.drain()
    assert posted(gw, "b") == [[1, 99]]
    assert [s.batch for s in await reg.subscribers("t1", "s1")] == [True]  # chat_turn will batch too


async def test_flushed_waits_for_the_batch_posted_before_it() -> None:
    gw, reg = FakeGateway(), MemoryRegistry()
    await reg.put_subscription("t1", "s1", Subscription("b", batch=True))
    fan = CloudFanout(gateway=gw, registry=reg, tenant_id="t1")
    fan.to_session("s1", 1, ev(1))
    fan.to_session("s1", 2, ev(2))
    await fan.flushed()
    assert posted(gw, "b") == [[1, 2]]
    fan.to_session("s1", 3, ev(3))
    await fan.drain()
    assert posted(gw, "b") == [[1, 2], 3]
