"""TieredDispatcher: a turn goes to the host queue only when a registered host takes turns (alive,
accepting, with room as of its heartbeat); else, and whenever the queue or the directory fails, to
the function tier. The directory is read at most once per `cache_s`."""

from __future__ import annotations

from agentvm.domain.turn_hosts import TurnHostRecord
from agentvm.hosting.turn_tiers import TieredDispatcher
from tests.turnhost.fakes import Directory, Dispatches, Queue

NOW = 1_800_000_000_000


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def tiered(directory: Directory, queue: Queue | None = None) -> tuple[TieredDispatcher, Queue, Dispatches, Clock]:
    clock, queue, fallback = Clock(), queue or Queue(), Dispatches()
    return TieredDispatcher(queue, directory, fallback, clock=clock, wall_ms=lambda: NOW), queue, fallback, clock


def host(host_id: str, *, until: int = NOW + 1, running: int = 0, capacity: int = 200,
         accepting: bool = True) -> TurnHostRecord:
    return TurnHostRecord(host_id, until, capacity, running, accepting)


async def test_no_host_registered_sends_the_turn_to_the_function() -> None:
    d, queue, fallback, _ = tiered(Directory())
    await d.start_turns("t", "s1")
    assert (queue.sent, fallback.started, d.counts) == ([], [("t", "s1")], {"host": 0, "function": 1})


async def test_a_live_accepting_host_gets_the_turn() -> None:
    d, queue, fallback, _ = tiered(Directory([host("h1", until=NOW + 1)]))
    await d.start_turns("t", "s1")
    assert (queue.sent, fallback.started, d.counts) == ([("t", "s1")], [], {"host": 1, "function": 0})


async def test_expired_full_or_refusing_hosts_do_not_count() -> None:
    hosts = [host("expired", until=NOW), host("full", running=200), host("refusing", accepting=False)]
    d, queue, fallback, _ = tiered(Directory(hosts))
    await d.start_turns("t", "s1")
    assert (queue.sent, fallback.started) == ([], [("t", "s1")])


async def test_one_live_host_among_dead_ones_is_enough() -> None:
    d, queue, fallback, _ = tiered(Directory([host("expired", until=NOW - 5), host("live", running=199)]))
    await d.start_turns("t", "s1")
    assert (queue.sent, fallback.started) == ([("t", "s1")], [])


async def test_the_listing_is_cached_for_cache_s() -> None:
    directory = Directory()
    d, queue, fallback, clock = tiered(directory)
    await d.start_turns("t", "s1")
    directory.hosts["h1"] = host("h1")  # a host starts: not seen until the cache lapses
    clock.t += 1.99
    await d.start_turns("t", "s2")
    assert (directory.lists, queue.sent, fallback.started) == (1, [], [("t", "s1"), ("t", "s2")])
    clock.t += 0.01
    await d.start_turns("t", "s3")
    assert (directory.lists, queue.sent) == (2, [("t", "s3")])


async def test_a_failing_directory_or_queue_falls_back_to_the_function() -> None:
    d, queue, fallback, _ = tiered(Directory(fail=True))
    await d.start_turns("t", "s1")
    assert (queue.sent, fallback.started) == ([], [("t", "s1")])
    d, queue, fallback, _ = tiered(Directory([host("h1")]), Queue(fail=True))
    await d.start_turns("t", "s2")
    assert (fallback.started, d.counts) == ([("t", "s2")], {"host": 0, "function": 1})


class Wall:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def __call__(self) -> int:
        return NOW + round((self.clock.t - 100.0) * 1000)


async def test_a_cached_listing_judges_hosts_as_of_when_it_was_read() -> None:
    """A host heartbeating every 0.5 s is listed with 1.5 s to go; the listing is kept for 2 s.
    Judged against each dispatch's own time, the live host looked dead for the last 0.5 s of every
    cache period (6 of 20 simultaneous turns went to chat_turn in the bench, none refused)."""
    clock, queue, fallback = Clock(), Queue(), Dispatches()
    directory = Directory([host("h1", until=NOW + 1500), host("dead", until=NOW - 1)])
    d = TieredDispatcher(queue, directory, fallback, clock=clock, wall_ms=Wall(clock))
    for i in range(20):  # 20 turns over 1.9 s, one listing
        await d.start_turns("t", f"s{i}")
        clock.t += 0.1
    assert (directory.lists, len(queue.sent), fallback.started) == (1, 20, [])
    clock.t += 0.1  # the cache lapses: a new listing, the host's record has not been renewed
    await d.start_turns("t", "late")
    assert (directory.lists, fallback.started) == (2, [("t", "late")])
