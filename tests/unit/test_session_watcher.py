"""The running turn's watcher (hosting/session_worker.py) on virtual time: how often it reads the
lease record while a turn streams, and the documented interrupt latency bound (docs/cloud-design.md:
an interrupt is seen within `INTERRUPT_BOUND_S`, at most 2 s)."""

from __future__ import annotations

import contextlib
from typing import Any, cast

import pytest

from agentvm.domain.models import Image, LeaseState, Turn, TurnStatus
from agentvm.hosting.session_worker import INTERRUPT_BOUND_S, SessionWorker, _Run


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


class Leases:
    """The lease record: an interrupt is requested at `interrupt_at` (virtual seconds)."""

    def __init__(self, clock: Clock, interrupt_at: float | None) -> None:
        self.clock = clock
        self.interrupt_at = interrupt_at
        self.polls: list[float] = []
        self.acked: list[tuple[float, int]] = []

    async def poll(self, tenant_id: str, session_id: str, *, consistent: bool = False) -> LeaseState:
        self.polls.append(self.clock.now)
        requested = self.interrupt_at is not None and self.clock.now >= self.interrupt_at
        return LeaseState(interrupts=1 if requested else 0, held=True)

    async def renew(self, *args: Any) -> LeaseState:
        raise AssertionError("a turn of seconds never renews a lease of a minute")

    async def ack_interrupt(self, tenant_id: str, session_id: str, owner: str, count: int) -> None:
        self.acked.append((self.clock.now, count))


class Fanout:
    served: dict[str, set[str]] = {}

    def listeners(self, session_id: str) -> int:
        return 1

    async def flushed(self) -> None:
        return None


class Runner:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.interrupted_at: float | None = None

    def interrupt(self) -> None:
        if self.interrupted_at is None:
            self.interrupted_at = self.clock.now


class Channel:
    def __init__(self) -> None:
        self.context: dict[str, str] = {"agentId": "a1"}
        self.published: list[str] = []

    def publish(self, kind: str, data: Any, **kwargs: Any) -> None:
        self.published.append(kind)


TURN = Turn("t1", "turn1", "s1", "i1", "c1", "m1", TurnStatus.RUNNING, 0)
IMAGE = Image("t1", "i1", "c1", "s1", "img", 0, 0)


async def watch(interrupt_at: float | None, until: float) -> tuple[Leases, Runner, Channel]:
    """Run the watcher with the production defaults until it returns or `until` virtual seconds."""
    clock = Clock()
    leases = Leases(clock, interrupt_at)
    worker = SessionWorker(cast(Any, None), fanout=cast(Any, Fanout()), leases=cast(Any, leases), owner="o",
                           sleep=clock.sleep)
    runner, channel = Runner(clock), Channel()

    async def bounded_sleep(seconds: float) -> None:
        if clock.now + seconds > until:
            raise TimeoutError
        await clock.sleep(seconds)

    worker._sleep = bounded_sleep
    with contextlib.suppress(TimeoutError):
        await worker._watch(cast(Any, runner), TURN, IMAGE, cast(Any, channel), _Run(LeaseState(held=True)))
    return leases, runner, channel


def test_the_bound_is_at_most_two_seconds_and_the_worker_uses_it_by_default() -> None:
    assert INTERRUPT_BOUND_S <= 2.0
    worker = SessionWorker(cast(Any, None), fanout=cast(Any, Fanout()), leases=cast(Any, None), owner="o")
    assert (worker.poll_s, worker.max_poll_s) == (0.25, INTERRUPT_BOUND_S)


async def test_a_ten_second_turn_reads_the_lease_record_seven_times() -> None:
    leases, runner, _ = await watch(None, until=10.0)
    assert leases.polls == [0.25, 0.75, 1.75, 3.75, 5.75, 7.75, 9.75]
    assert runner.interrupted_at is None


@pytest.mark.parametrize("at", [0.1, 0.3, 0.8, 1.76, 2.0, 3.76, 5.0, 7.0, 9.0])
async def test_an_interrupt_is_seen_within_the_bound_wherever_it_falls(at: float) -> None:
    leases, runner, channel = await watch(at, until=30.0)
    assert runner.interrupted_at is not None
    assert at <= runner.interrupted_at <= at + INTERRUPT_BOUND_S
    assert channel.published == ["interrupted"]
    assert leases.acked == [(runner.interrupted_at, 1)]
