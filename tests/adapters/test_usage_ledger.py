"""The UsageLedger contract, on both adapters (SQLite and DynamoDB on the moto server)."""

from __future__ import annotations

import asyncio
import calendar
import dataclasses
from collections.abc import AsyncIterator
from decimal import Decimal
from types import SimpleNamespace
from typing import cast

import botocore.session
import pytest
from botocore.exceptions import ClientError

from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.dynamodb_usage import DynamoDBUsageLedger
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.adapters.local.sqlite_usage import SqliteUsageLedger
from agentvm.domain.models import Usage
from agentvm.domain.usage import Budget, Spend, UnitPrices, UsageRecord, minute_of, period_of
from agentvm.ids import now_ms
from agentvm.ports import Store, UsageLedger
from tests.aws_fixtures import moto_table
from tests.support.dynamodb_calls import Calls


def _ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    return calendar.timegm((year, month, day, hour, minute, 0)) * 1000


NOV = _ms(2026, 11, 15, 12)
DEC_1 = _ms(2026, 12, 1)  # the first millisecond of December (UTC)
#: before every record these tests list (the DynamoDB ledger reads one partition per month of a range)
SEP_1 = _ms(2026, 9, 1)
P_NOV, P_DEC = "2026-11", "2026-12"


@pytest.fixture
def ledger(store: Store) -> UsageLedger:
    if isinstance(store, DynamoDBStore):
        return DynamoDBUsageLedger(store)
    assert isinstance(store, SqliteStore)
    return SqliteUsageLedger(store)


PRICES = UnitPrices(Decimal("0.15"), Decimal("0.60"), Decimal("0.15"), Decimal("0.075"), Decimal("1.05"))


def _record(record_id: str, *, tenant: str = "t1", key: str | None = None, ended: int = NOV,
            billed: Decimal = Decimal("0.00000105"), **kw: object) -> UsageRecord:
    fields: dict[str, object] = dict(
        record_id=record_id, tenant_id=tenant, key_id=key, container_id="c1", image_id="img1", session_id="s1",
        turn_id=record_id.split("#")[0], kind="llm", provider="anthropic", model="claude-x",
        usage=Usage(10, 20, 3, 4), list_cost=billed / Decimal("1.05"), billed_cost=billed, tier="function",
        status="completed", started_at=ended - 1500, ended_at=ended)
    fields.update(kw)
    return UsageRecord(**fields)  # type: ignore[arg-type]


# ---- budgets -------------------------------------------------------------------------------------


async def test_budgets_put_list_replace_delete_per_tenant(ledger: UsageLedger) -> None:
    assert await ledger.list_budgets("t1") == []
    own = Budget("t1", None, monthly=Decimal("10.50"), requests_per_minute=60, updated_at=1)
    kb = Budget("t1", "key_b", monthly=Decimal("0.00000105"), updated_at=2)
    ka = Budget("t1", "key_a", requests_per_minute=5, updated_at=3)
    theirs = Budget("t2", None, monthly=Decimal(1), updated_at=4)
    for b in (kb, own, ka, theirs):
        await ledger.put_budget(b)
    listed = await ledger.list_budgets("t1")
    assert listed == [own, ka, kb]  # the tenant's own first, then keys by id
    assert listed[0].to_wire()["monthlyBudget"] == "10.50"  # exactly as written
    assert listed[2].to_wire()["monthlyBudget"] == "0.00000105"
    assert await ledger.list_budgets("t2") == [theirs]
    assert await ledger.list_budgets("t1#KEY") == []  # ids are escaped inside keys

    replaced = Budget("t1", "key_a", monthly=Decimal(2), updated_at=5)
    await ledger.put_budget(replaced)
    assert await ledger.list_budgets("t1") == [own, replaced, kb]

    assert await ledger.delete_budget("t2", "key_a") is False  # another tenant's key: not found
    assert await ledger.delete_budget("t1", "key_a") is True
    assert await ledger.delete_budget("t1", "key_a") is False
    assert await ledger.delete_budget("t1", None) is True
    assert await ledger.list_budgets("t1") == [kb]
    assert await ledger.list_budgets("t2") == [theirs]


# ---- reserve -------------------------------------------------------------------------------------


async def test_reserve_within_the_tenant_cap_and_refused_past_it(ledger: UsageLedger) -> None:
    cap = Decimal("1.00")
    assert await ledger.reserve("t1", None, P_NOV, Decimal("0.60"),
                                turn_id="turn0", tenant_cap=cap, key_cap=None) is None
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal("0.60"))
    assert await ledger.reserve("t1", None, P_NOV, Decimal("0.41"),
                                turn_id="turn0", tenant_cap=cap, key_cap=None) == "tenant"
    assert await ledger.reserve("t1", None, P_NOV, Decimal("0.40"),
                                turn_id="turn0", tenant_cap=cap, key_cap=None) is None  # = cap
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal("1.00"))
    assert await ledger.reserve("t1", None, P_NOV, Decimal("0.00000001"),
                                turn_id="turn0", tenant_cap=cap, key_cap=None) == "tenant"
    assert await ledger.reserve("t1", None, P_NOV, Decimal(2),
                                turn_id="turn0", tenant_cap=Decimal(1), key_cap=None) == "tenant"
    # other tenants and other months are other counters
    assert await ledger.reserve("t2", None, P_NOV, Decimal("0.9"),
                                turn_id="turn0", tenant_cap=cap, key_cap=None) is None
    assert await ledger.reserve("t1", None, P_DEC, Decimal("0.9"),
                                turn_id="turn0", tenant_cap=cap, key_cap=None) is None
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal("1.00"))
    assert await ledger.spend("t2", None, P_NOV) == Spend(Decimal(0), Decimal("0.9"))
    # an amount above a fresh counter's cap is refused too (no counter exists yet)
    assert await ledger.reserve("t3", None, P_NOV, Decimal(2),
                                turn_id="turn0", tenant_cap=Decimal(1), key_cap=None) == "tenant"
    assert await ledger.spend("t3", None, P_NOV) == Spend()


async def test_reserve_with_a_key_cap_holds_on_both_and_names_the_refusing_limit(ledger: UsageLedger) -> None:
    async def reserve(amount: str, tenant_cap: str | None, key_cap: str | None) -> str | None:
        return await ledger.reserve("t1", "k1", P_NOV, Decimal(amount),
                                    turn_id="turn0", tenant_cap=Decimal(tenant_cap) if tenant_cap else None,
                                    key_cap=Decimal(key_cap) if key_cap else None)

    assert await reserve("3", "10", "5") is None
    assert await ledger.spend("t1", "k1", P_NOV) == Spend(Decimal(0), Decimal(3))
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal(3))
    assert await reserve("3", "10", "5") == "key"  # the key's 3 + 3 > 5
    assert await reserve("8", "10", "50") == "tenant"  # the tenant's 3 + 8 > 10
    assert await reserve("8", "10", "5") == "tenant"  # both refuse: the tenant is named
    assert await reserve("6", "10", "5") == "key"  # above the key cap alone
    # refused: nothing held anywhere
    assert await ledger.spend("t1", "k1", P_NOV) == Spend(Decimal(0), Decimal(3))
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal(3))
    # a key cap without a tenant cap still holds on the tenant's counter (settle releases it there)
    assert await reserve("2", None, "5") is None
    assert await ledger.spend("t1", "k1", P_NOV) == Spend(Decimal(0), Decimal(5))
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal(5))
    assert await reserve("1", None, "5") == "key"
    # a tenant cap alone does not touch the key's counter
    assert await reserve("1", "10", None) is None
    assert await ledger.spend("t1", "k1", P_NOV) == Spend(Decimal(0), Decimal(5))
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal(6))
    # another key of the tenant is another counter
    assert await ledger.reserve("t1", "k2", P_NOV, Decimal(4),
                                turn_id="turn0", tenant_cap=None, key_cap=Decimal(5)) is None
    assert await ledger.spend("t1", "k2", P_NOV) == Spend(Decimal(0), Decimal(4))


async def test_reserve_without_a_cap_writes_nothing(ledger: UsageLedger) -> None:
    calls = Calls(ledger.store) if isinstance(ledger, DynamoDBUsageLedger) else None
    assert await ledger.reserve("t1", "k1", P_NOV, Decimal(5), turn_id="turn0", tenant_cap=None, key_cap=None) is None
    assert await ledger.reserve("t1", None, P_NOV, Decimal(5),
                                turn_id="turn0", tenant_cap=None, key_cap=Decimal(1)) is None
    if calls is not None:
        assert calls.take() == []
    assert await ledger.spend("t1", None, P_NOV) == Spend()
    assert await ledger.spend("t1", "k1", P_NOV) == Spend()


async def test_concurrent_reserves_never_pass_the_cap(ledger: UsageLedger) -> None:
    results = await asyncio.gather(*(ledger.reserve("t1", None, P_NOV, Decimal(1),
                                                    turn_id="turn0", tenant_cap=Decimal(10),
                                                    key_cap=None) for _ in range(50)))
    assert results.count(None) == 10
    assert results.count("tenant") == 40
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal(10))


async def test_concurrent_reserves_with_a_key_cap_never_pass_either_cap(ledger: UsageLedger) -> None:
    results = await asyncio.gather(*(ledger.reserve("t1", f"k{i % 2}", P_NOV, Decimal(1),
                                                    turn_id=f"turn{i}", tenant_cap=Decimal(10),
                                                    key_cap=Decimal(4)) for i in range(30)))
    assert results.count(None) == 8  # 4 per key
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal(8))
    assert await ledger.spend("t1", "k0", P_NOV) == Spend(Decimal(0), Decimal(4))


# ---- settle and release --------------------------------------------------------------------------


async def test_settle_moves_the_hold_to_spent_exactly(ledger: UsageLedger) -> None:
    hold = Decimal("0.0105")
    assert await ledger.reserve("t1", "k1", P_NOV, hold,
                                turn_id="turn1", tenant_cap=Decimal(1), key_cap=Decimal(1)) is None
    rec = _record("turn1#llm#1", key="k1", billed=Decimal("0.00000105"))
    assert await ledger.settle(rec, reserved=hold, reserved_period=P_NOV, key_held=True) is True
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal("0.00000105"), Decimal(0))
    assert await ledger.spend("t1", "k1", P_NOV) == Spend(Decimal("0.00000105"), Decimal(0))
    # a tenant cap now counts what was spent
    room = Decimal(1) - Decimal("0.00000105")
    assert await ledger.reserve("t1", None, P_NOV, room + Decimal("0.00000001"), turn_id="turn0", tenant_cap=Decimal(1),
                                key_cap=None) == "tenant"
    assert await ledger.reserve("t1", None, P_NOV, room, turn_id="turn0", tenant_cap=Decimal(1), key_cap=None) is None
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal("0.00000105"), room)


async def test_a_call_billed_above_its_hold_is_billed_and_blocks_further_holds(ledger: UsageLedger) -> None:
    """An upstream reported more than the hold's upper bound: the record is billed as reported, and
    while spent + reserved exceeds the cap no hold fits, however small; another call holding when the
    overrun settled keeps its hold (its own cost stays within it), so the overshoot is that one call's
    excess. Raising the cap makes the counters consistent again."""
    cap = Decimal("0.10")
    assert await ledger.reserve("t1", "k1", P_NOV, Decimal("0.04"), turn_id="over", tenant_cap=cap,
                                key_cap=cap) is None
    assert await ledger.reserve("t1", "k1", P_NOV, Decimal("0.05"), turn_id="honest", tenant_cap=cap,
                                key_cap=cap) is None
    over = _record("over#llm#1", key="k1", billed=Decimal("0.09"))  # 0.05 above its hold of 0.04
    assert await ledger.settle(over, reserved=Decimal("0.04"), reserved_period=P_NOV, key_held=True) is True
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal("0.09"), Decimal("0.05"))
    for turn in ("next1", "next2"):
        assert await ledger.reserve("t1", "k1", P_NOV, Decimal("0.00000001"), turn_id=turn, tenant_cap=cap,
                                    key_cap=None) == "tenant"
        assert await ledger.reserve("t1", "k1", P_NOV, Decimal("0.00000001"), turn_id=turn, tenant_cap=None,
                                    key_cap=cap) == "key"
    honest = _record("honest#llm#1", key="k1", billed=Decimal("0.05"))
    assert await ledger.settle(honest, reserved=Decimal("0.05"), reserved_period=P_NOV, key_held=True) is True
    spend = await ledger.spend("t1", None, P_NOV)
    assert spend == Spend(Decimal("0.14"), Decimal(0)) == await ledger.spend("t1", "k1", P_NOV)
    # the overshoot (0.04: the holds left 0.01 unused) is at most that one call's excess (0.05)
    assert Decimal(0) < spend.spent - cap <= over.billed_cost - Decimal("0.04")
    records = await ledger.list_usage("t1", since_ms=SEP_1, until_ms=DEC_1)
    assert sum(r.billed_cost for r in records) == spend.spent
    assert await ledger.reserve("t1", None, P_NOV, Decimal("0.00000001"), turn_id="next3", tenant_cap=cap,
                                key_cap=None) == "tenant"
    assert await ledger.reserve("t1", None, P_NOV, Decimal("0.01"), turn_id="next3", tenant_cap=Decimal("0.15"),
                                key_cap=None) is None


async def test_an_estimated_record_round_trips_and_says_so(ledger: UsageLedger) -> None:
    rec = _record("e#llm#1", status="failed", usage=Usage(1234, 8), estimated=True)
    assert await ledger.settle(rec, reserved=Decimal(0), reserved_period=P_NOV, key_held=False) is True
    [listed] = await ledger.list_usage("t1", since_ms=SEP_1, until_ms=DEC_1)
    assert listed == rec and listed.estimated is True and listed.to_wire()["estimated"] is True


async def test_settle_is_once_per_record(ledger: UsageLedger) -> None:
    await ledger.reserve("t1", None, P_NOV, Decimal(1), turn_id="turn1", tenant_cap=Decimal(10), key_cap=None)
    rec = _record("turn1#llm#1", billed=Decimal("0.25"))
    assert await ledger.settle(rec, reserved=Decimal(1), reserved_period=P_NOV, key_held=False) is True
    after = await ledger.spend("t1", None, P_NOV)
    assert after == Spend(Decimal("0.25"), Decimal(0))
    again = dataclasses.replace(rec, billed_cost=Decimal(7), ended_at=NOV + 5)
    assert await ledger.settle(again, reserved=Decimal(1), reserved_period=P_NOV, key_held=False) is False
    assert await ledger.spend("t1", None, P_NOV) == after
    assert await ledger.list_usage("t1", since_ms=SEP_1, until_ms=DEC_1) == [rec]
    # the same record id of another tenant is another record
    other = dataclasses.replace(rec, tenant_id="t2")
    assert await ledger.settle(other, reserved=Decimal(0), reserved_period=P_NOV, key_held=False) is True
    assert await ledger.spend("t2", None, P_NOV) == Spend(Decimal("0.25"), Decimal(0))


async def test_settle_across_a_month_boundary(ledger: UsageLedger) -> None:
    # held in November, ended in the first millisecond of December: December is charged
    assert await ledger.reserve("t1", "k1", P_NOV, Decimal("0.5"), turn_id="turn9", tenant_cap=Decimal(5),
                                key_cap=Decimal(5)) is None
    rec = _record("turn9#llm#1", key="k1", ended=DEC_1, billed=Decimal("0.123456789"))
    assert rec.period == P_DEC
    assert await ledger.settle(rec, reserved=Decimal("0.5"), reserved_period=P_NOV, key_held=True) is True
    for key in (None, "k1"):
        assert await ledger.spend("t1", key, P_NOV) == Spend(Decimal(0), Decimal(0))
        assert await ledger.spend("t1", key, P_DEC) == Spend(Decimal("0.123456789"), Decimal(0))


async def test_settle_without_a_hold_or_a_key_hold(ledger: UsageLedger) -> None:
    # no cap applied: nothing held, the cost is still counted for the tenant; a key's counter counts
    # only while the key has a budget (key_held), so this key's is not written
    rec = _record("turn2#llm#1", key="k1", billed=Decimal("0.3"))
    assert await ledger.settle(rec, reserved=Decimal(0), reserved_period=P_NOV, key_held=False) is True
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal("0.3"), Decimal(0))
    assert await ledger.spend("t1", "k1", P_NOV) == Spend()
    # held on the tenant only (tenant cap, no key cap): the key's counter has nothing to release
    await ledger.reserve("t1", "k1", P_NOV, Decimal(1), turn_id="turn2", tenant_cap=Decimal(10), key_cap=None)
    rec2 = _record("turn2#llm#2", key="k1", billed=Decimal("0.2"))
    assert await ledger.settle(rec2, reserved=Decimal(1), reserved_period=P_NOV, key_held=False) is True
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal("0.5"), Decimal(0))
    assert await ledger.spend("t1", "k1", P_NOV) == Spend()
    # held on the key too (a key budget): its counter counts the cost
    await ledger.reserve("t1", "k1", P_NOV, Decimal(1), turn_id="turn2", tenant_cap=None, key_cap=Decimal(10))
    rec3 = _record("turn2#llm#3", key="k1", billed=Decimal("0.25"))
    assert await ledger.settle(rec3, reserved=Decimal(1), reserved_period=P_NOV, key_held=True) is True
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal("0.75"), Decimal(0))
    assert await ledger.spend("t1", "k1", P_NOV) == Spend(Decimal("0.25"), Decimal(0))
    # a free sandbox record: written, no counter changes
    sandbox = _record("turn2#sandbox", kind="sandbox", provider="anthropic", model=None, usage=Usage(),
                      billed=Decimal(0), sandbox_ms=1234, tier="container")
    assert await ledger.settle(sandbox, reserved=Decimal(0), reserved_period=P_NOV, key_held=False) is True
    assert await ledger.settle(sandbox, reserved=Decimal(0), reserved_period=P_NOV, key_held=False) is False
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal("0.75"), Decimal(0))
    assert sandbox in await ledger.list_usage("t1", since_ms=SEP_1, until_ms=DEC_1)


async def test_release_drops_a_hold(ledger: UsageLedger) -> None:
    await ledger.reserve("t1", "k1", P_NOV, Decimal("2.5"), turn_id="turnA", tenant_cap=Decimal(3), key_cap=Decimal(3))
    await ledger.reserve("t1", "k1", P_NOV, Decimal("0.5"), turn_id="turnB", tenant_cap=Decimal(3), key_cap=None)
    assert await ledger.reserve("t1", None, P_NOV, Decimal("0.1"),
                                turn_id="turnB", tenant_cap=Decimal(3), key_cap=None) == "tenant"
    await ledger.release("t1", "k1", P_NOV, Decimal("2.5"), turn_id="turnA", key_held=True)
    await ledger.release("t1", "k1", P_NOV, Decimal("0.5"), turn_id="turnB", key_held=False)
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal(0))
    assert await ledger.spend("t1", "k1", P_NOV) == Spend(Decimal(0), Decimal(0))
    assert await ledger.reserve("t1", "k1", P_NOV, Decimal(3),
                                turn_id="turn0", tenant_cap=Decimal(3), key_cap=Decimal(3)) is None


async def test_release_turn_gives_back_what_a_dead_runners_turn_holds(ledger: UsageLedger) -> None:
    await ledger.reserve("t1", "k1", P_NOV, Decimal("2.5"), turn_id="dead", tenant_cap=Decimal(3),
                         key_cap=Decimal(3))
    await ledger.reserve("t1", "k1", P_NOV, Decimal("0.25"), turn_id="alive", tenant_cap=Decimal(3), key_cap=None)
    # another tenant's turn of the same id, and months the hold is not in, release nothing
    assert await ledger.release_turn("t2", "k1", "dead", [P_NOV]) == Decimal(0)
    assert await ledger.release_turn("t1", "k1", "dead", [P_DEC]) == Decimal(0)
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal("2.75"))

    assert await ledger.release_turn("t1", "k1", "dead", [P_NOV, P_DEC]) == Decimal("2.5")
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal("0.25"))
    assert await ledger.spend("t1", "k1", P_NOV) == Spend(Decimal(0), Decimal(0))
    # once only
    assert await ledger.release_turn("t1", "k1", "dead", [P_NOV]) == Decimal(0)
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal("0.25"))
    # the living turn's hold is untouched and settles as usual (held on the tenant only: the key's
    # counter, which counts only while the key's budget applies, does not change)
    rec = _record("alive#llm#1", key="k1", billed=Decimal("0.1"))
    assert await ledger.settle(rec, reserved=Decimal("0.25"), reserved_period=P_NOV, key_held=False) is True
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal("0.1"), Decimal(0))
    assert await ledger.spend("t1", "k1", P_NOV) == Spend(Decimal(0), Decimal(0))


async def test_a_late_settle_after_release_turn_bills_the_cost_and_releases_nothing_twice(
        ledger: UsageLedger) -> None:
    # a runner taken for dead settles after all: its record and cost count, its hold was given back once
    await ledger.reserve("t1", "k1", P_NOV, Decimal(2), turn_id="slow", tenant_cap=Decimal(5), key_cap=Decimal(5))
    await ledger.reserve("t1", "k1", P_NOV, Decimal(1), turn_id="other", tenant_cap=Decimal(5), key_cap=Decimal(5))
    assert await ledger.release_turn("t1", "k1", "slow", [P_NOV]) == Decimal(2)
    rec = _record("slow#llm#1", key="k1", billed=Decimal("0.5"))
    assert await ledger.settle(rec, reserved=Decimal(2), reserved_period=P_NOV, key_held=True) is True
    for key in (None, "k1"):
        assert await ledger.spend("t1", key, P_NOV) == Spend(Decimal("0.5"), Decimal(1)), key
    assert await ledger.list_usage("t1", since_ms=SEP_1, until_ms=DEC_1) == [rec]
    # the same for a release after release_turn
    await ledger.release("t1", "k1", P_NOV, Decimal(1), turn_id="other", key_held=True)
    await ledger.release("t1", "k1", P_NOV, Decimal(1), turn_id="other", key_held=True)
    for key in (None, "k1"):
        assert await ledger.spend("t1", key, P_NOV) == Spend(Decimal("0.5"), Decimal(0)), key


# ---- rate windows --------------------------------------------------------------------------------


async def test_admit_counts_the_tenant_window(ledger: UsageLedger) -> None:
    m = minute_of(NOV)
    assert [await ledger.admit("t1", None, m, tenant_limit=3, key_limit=None) for _ in range(4)] == \
        [None, None, None, "tenant"]
    assert await ledger.admit("t1", None, m + 1, tenant_limit=3, key_limit=None) is None  # a new minute
    assert await ledger.admit("t2", None, m, tenant_limit=3, key_limit=None) is None  # another tenant
    assert await ledger.admit("t1", None, m, tenant_limit=4, key_limit=None) is None  # a raised limit
    assert await ledger.admit("t1", None, m, tenant_limit=None, key_limit=None) is None  # no limit
    assert await ledger.admit("t1", None, m + 2, tenant_limit=0, key_limit=None) == "tenant"


async def test_admit_counts_the_key_window_and_names_the_full_one(ledger: UsageLedger) -> None:
    m = minute_of(NOV)
    assert await ledger.admit("t1", "k1", m, tenant_limit=3, key_limit=2) is None
    assert await ledger.admit("t1", "k1", m, tenant_limit=3, key_limit=2) is None
    assert await ledger.admit("t1", "k1", m, tenant_limit=3, key_limit=2) == "key"
    # refused: nothing counted, so the tenant window still has room for one (of another key)
    assert await ledger.admit("t1", "k2", m, tenant_limit=3, key_limit=2) is None
    assert await ledger.admit("t1", "k2", m, tenant_limit=3, key_limit=2) == "tenant"
    assert await ledger.admit("t1", "k1", m, tenant_limit=3, key_limit=2) == "tenant"  # both full: the tenant
    # a key limit alone
    assert await ledger.admit("t1", "k3", m, tenant_limit=None, key_limit=1) is None
    assert await ledger.admit("t1", "k3", m, tenant_limit=None, key_limit=1) == "key"


async def test_concurrent_admits_never_pass_the_limit(ledger: UsageLedger) -> None:
    m = minute_of(NOV)
    results = await asyncio.gather(*(ledger.admit("t1", "k1", m, tenant_limit=7, key_limit=20)
                                     for _ in range(25)))
    assert results.count(None) == 7
    assert results.count("tenant") == 18


# ---- list_usage ----------------------------------------------------------------------------------


async def test_list_usage_per_tenant_and_for_all_in_a_time_range(ledger: UsageLedger) -> None:
    oct_end = _ms(2026, 10, 31, 23, 59)
    recs = [
        _record("b#llm#1", tenant="t1", ended=NOV, key="k1"),
        _record("a#llm#1", tenant="t1", ended=NOV),  # same time: by record id
        _record("c#llm#1", tenant="t2", ended=NOV - 1),
        _record("d#llm#1", tenant="t1", ended=DEC_1),  # at `until`: out
        _record("e#llm#1", tenant="t2", ended=DEC_1 - 1),
        _record("f#llm#1", tenant="t1", ended=oct_end),  # before `since`: out
        _record("g#llm#1", tenant="t1#x", ended=NOV + 7, billed=Decimal("12.3456789012345678")),
        _record("h#llm#1", tenant="t3", ended=_ms(2027, 2, 3)),
    ]
    for r in recs:
        assert await ledger.settle(r, reserved=Decimal(0), reserved_period=r.period, key_held=False)
    since = _ms(2026, 11, 1)
    by_id = {r.record_id[0]: r for r in recs}

    mine = await ledger.list_usage("t1", since_ms=since, until_ms=DEC_1)
    assert mine == [by_id["a"], by_id["b"]]
    assert await ledger.list_usage("t2", since_ms=since, until_ms=DEC_1) == [by_id["c"], by_id["e"]]
    assert await ledger.list_usage("t1#x", since_ms=since, until_ms=DEC_1) == [by_id["g"]]
    assert await ledger.list_usage("nobody", since_ms=since, until_ms=DEC_1) == []
    # since is inclusive, until exclusive
    assert await ledger.list_usage("t1", since_ms=NOV, until_ms=NOV + 1) == [by_id["a"], by_id["b"]]
    assert await ledger.list_usage("t1", since_ms=NOV + 1, until_ms=DEC_1 + 1) == [by_id["d"]]
    assert await ledger.list_usage("t1", since_ms=NOV, until_ms=NOV) == []

    every = await ledger.list_usage(None, since_ms=since, until_ms=DEC_1)
    assert [r.record_id for r in every] == ["c#llm#1", "a#llm#1", "b#llm#1", "g#llm#1", "e#llm#1"]
    assert every[3].billed_cost == Decimal("12.3456789012345678")
    assert every[3].to_wire()["billedCost"] == "12.3456789012345678"
    # several months (and a month with nothing in it)
    everything = await ledger.list_usage(None, since_ms=_ms(2026, 9, 1), until_ms=_ms(2027, 3, 1))
    assert [r.record_id[0] for r in everything] == ["f", "c", "a", "b", "g", "e", "d", "h"]
    assert everything == sorted(recs, key=lambda r: (r.ended_at, r.record_id))
    assert await ledger.list_usage(None, since_ms=DEC_1 + 1, until_ms=_ms(2027, 2, 1)) == []


async def test_stream_usage_yields_what_list_usage_lists_in_charge_time_order(
        ledger: UsageLedger, monkeypatch: pytest.MonkeyPatch) -> None:
    # pages of 25: several pages of every shard (~160 records each), over two months
    from agentvm.adapters.aws import dynamodb_usage_stream
    from agentvm.adapters.local import sqlite_usage

    monkeypatch.setattr(dynamodb_usage_stream, "EXPORT_PAGE", 25)
    monkeypatch.setattr(sqlite_usage, "_STREAM_PAGE", 25)
    recs = [_record(f"r{i:05d}#llm#1", tenant=f"t{i % 3}", ended=_ms(2026, 11, 30, 23, 40) + i * 997,
                    billed=Decimal(i) / 1000) for i in range(1_300)]
    if isinstance(ledger, DynamoDBUsageLedger):
        from agentvm.adapters.aws.dynamodb_usage import _record_item

        await ledger.store._batch_write([{"PutRequest": {"Item": _record_item(r)}} for r in recs])
    else:
        for r in recs:
            assert await ledger.settle(r, reserved=Decimal(0), reserved_period=r.period, key_held=False)
    since, until = _ms(2026, 11, 30, 23, 45), _ms(2026, 12, 1, 0, 1)
    streamed = [r async for r in ledger.stream_usage(None, since_ms=since, until_ms=until)]
    listed = await ledger.list_usage(None, since_ms=since, until_ms=until)
    assert len(streamed) == len(listed) == len([r for r in recs if since <= r.ended_at < until]) == 963
    assert sorted(streamed, key=lambda r: r.record_id) == sorted(listed, key=lambda r: r.record_id)
    assert [r.ended_at for r in streamed] == sorted(r.ended_at for r in streamed)
    assert sum(r.billed_cost for r in streamed) == sum(r.billed_cost for r in listed)
    assert [r async for r in ledger.stream_usage("t1", since_ms=since, until_ms=until)] == \
        await ledger.list_usage("t1", since_ms=since, until_ms=until)
    assert [r async for r in ledger.stream_usage(None, since_ms=until, until_ms=until)] == []


async def test_records_round_trip(ledger: UsageLedger) -> None:
    full = _record("t#llm#1", key="k1", list_cost=Decimal("0.000001"), billed=Decimal("0.00000105"), prices=PRICES)
    bare = _record("t#sandbox", kind="sandbox", model=None, usage=Usage(), billed=Decimal(0), sandbox_ms=99,
                   tier="container", status="interrupted", currency="EUR")
    for r in (full, bare):
        await ledger.settle(r, reserved=Decimal(0), reserved_period=P_NOV, key_held=False)
    listed = await ledger.list_usage("t1", since_ms=SEP_1, until_ms=DEC_1)
    assert sorted(listed, key=lambda r: r.record_id) == [full, bare]
    assert [r.to_wire() for r in sorted(listed, key=lambda r: r.record_id)] == [full.to_wire(), bare.to_wire()]
    assert listed[0].prices == PRICES and full.to_wire()["prices"] == {
        "input": "0.15", "output": "0.60", "cacheWrite": "0.15", "cacheRead": "0.075", "markup": "1.05"}
    assert period_of(full.ended_at) == P_NOV


# ---- DynamoDB: what each operation costs -----------------------------------------------------------


@pytest.fixture
async def dynamodb(aws_env: None, aws_session: botocore.session.Session, moto_endpoint: str) -> AsyncIterator[
        DynamoDBStore]:
    async with moto_table(moto_endpoint, session=aws_session) as store:
        yield store


async def test_dynamodb_request_counts(dynamodb: DynamoDBStore) -> None:
    ledger, calls = DynamoDBUsageLedger(dynamodb), Calls(dynamodb)
    d = Decimal
    assert await calls.ops(ledger.reserve("t1", "k1", P_NOV, d(1),
                                          turn_id="x", tenant_cap=d(5), key_cap=None)) == ["UpdateItem"]
    assert await calls.ops(ledger.reserve("t1", "k1", P_NOV, d(1), turn_id="x", tenant_cap=d(5), key_cap=d(5))) == \
        ["TransactWriteItems"]
    rec = _record("x#llm#1", key="k1")
    # no transaction: the record, then one conditional update per counter held
    assert await calls.ops(ledger.settle(rec, reserved=d(1), reserved_period=P_NOV, key_held=True)) == \
        ["PutItem", "UpdateItem", "UpdateItem"]
    await ledger.reserve("t1", "k1", P_NOV, d(1), turn_id="x", tenant_cap=d(5), key_cap=None)
    assert await calls.ops(ledger.settle(_record("x#llm#2", key="k1"), reserved=d(1), reserved_period=P_NOV,
                                         key_held=False)) == ["PutItem", "UpdateItem"]
    sandbox = _record("x#sandbox", billed=d(0))
    assert await calls.ops(ledger.settle(sandbox, reserved=d(0), reserved_period=P_NOV, key_held=False)) == ["PutItem"]
    assert await calls.ops(ledger.release("t1", None, P_NOV, d(1), turn_id="x", key_held=False)) == ["UpdateItem"]
    assert await calls.ops(ledger.spend("t1", None, P_NOV)) == ["GetItem"]
    assert await calls.ops(ledger.admit("t1", "k1", 5, tenant_limit=None, key_limit=None)) == []
    assert await calls.ops(ledger.admit("t1", "k1", 5, tenant_limit=3, key_limit=None)) == ["UpdateItem"]
    assert await calls.ops(ledger.admit("t1", "k1", 5, tenant_limit=3, key_limit=3)) == ["TransactWriteItems"]
    assert await calls.ops(ledger.list_budgets("t1")) == ["Query"]
    # one Query per month of the range, + one of GSI1 for records written before the month key
    assert await calls.ops(ledger.list_usage("t1", since_ms=NOV, until_ms=DEC_1)) == ["Query", "Query"]
    assert await calls.ops(ledger.list_usage("t1", since_ms=NOV, until_ms=DEC_1 + 1)) == ["Query"] * 3
    assert await calls.ops(ledger.list_usage(None, since_ms=NOV, until_ms=DEC_1)) == ["Query"] * 8
    assert len(await calls.ops(ledger.list_usage(None, since_ms=NOV, until_ms=DEC_1 + 1))) == 16


async def test_dynamodb_settle_writes_one_item_per_counter(dynamodb: DynamoDBStore) -> None:
    ledger, calls = DynamoDBUsageLedger(dynamodb), Calls(dynamodb)
    sizes = []
    for record in (_record("y#llm#1", key="k1"), _record("y#llm#2", key="k1", ended=DEC_1)):
        await ledger.reserve("t1", "k1", P_NOV, Decimal(1), turn_id="y", tenant_cap=Decimal(5), key_cap=Decimal(5))
        calls.log.clear()
        await ledger.settle(record, reserved=Decimal(1), reserved_period=P_NOV, key_held=True)
        sizes.append([len(params.get("TransactItems", [params])) for name, params in calls.log])
    # the record, then per counter (tenant, key) one update; when the record's month is not the hold's,
    # a transaction of the hold's month (released) and the record's (cost added)
    assert sizes == [[1, 1, 1], [1, 2, 2]]


async def test_dynamodb_a_settle_writes_3_units_with_a_tenant_budget(dynamodb: DynamoDBStore) -> None:
    """The record (one item of < 1 KB and its one index, GSI2) and the counter: 1 + 1 + 1 write units,
    after the hold's 1 (docs/billing.md); the record is not in GSI1 any more."""
    ledger = DynamoDBUsageLedger(dynamodb)
    rec = _record("u#llm#1", key="k1", started_at=NOV - 1500, prices=PRICES)  # the prices kept too
    await ledger.reserve("t1", "k1", P_NOV, Decimal(1), turn_id="u", tenant_cap=Decimal(5), key_cap=None,
                         at_ms=rec.started_at)
    assert await ledger.settle(rec, reserved=Decimal(1), reserved_period=P_NOV, key_held=False)
    res = await dynamodb.client.query(TableName=dynamodb.table_name, KeyConditionExpression="PK = :pk",
                                      ExpressionAttributeValues={":pk": {"S": "USAGE#t1#2026-11"}})
    (item,) = res["Items"]
    assert item["SK"] == {"S": "REC#u%23llm%231"}
    assert "G1PK" not in item and item["G2PK"]["S"].startswith("USAGEMON#2026-11#")
    size = sum(len(k) + len(str(next(iter(v.values())))) for k, v in item.items())
    assert size < 1024, size
    counter = (await dynamodb.client.get_item(TableName=dynamodb.table_name,
                                              Key={"PK": {"S": "SPEND#t1"}, "SK": {"S": P_NOV}}))["Item"]
    assert "hold#u" not in counter and counter["spent"] == {"N": "0.00000105"}


async def test_dynamodb_release_turn_request_counts(dynamodb: DynamoDBStore) -> None:
    ledger, calls = DynamoDBUsageLedger(dynamodb), Calls(dynamodb)
    await ledger.reserve("t1", "k1", P_NOV, Decimal(1), turn_id="w", tenant_cap=Decimal(5), key_cap=Decimal(5))
    # one read per month and counter; an update per hold found (a hold noted without its time: no record
    # can be its call's, so none is looked for)
    assert await calls.ops(ledger.release_turn("t1", "k1", "w", [P_NOV, P_DEC])) == \
        ["GetItem", "GetItem", "GetItem", "GetItem", "UpdateItem", "UpdateItem"]
    # a hold noted with its time: its call's record is looked for (a Query per month since the hold)
    await ledger.reserve("t1", None, P_NOV, Decimal(1), turn_id="v", tenant_cap=Decimal(5), key_cap=None,
                         at_ms=now_ms() - 1000)
    assert await calls.ops(ledger.release_turn("t1", None, "v", [P_NOV])) == ["GetItem", "Query", "UpdateItem"]
    assert await calls.ops(ledger.release_turn("t1", None, "w", [P_NOV])) == ["GetItem"]


async def test_dynamodb_rate_windows_expire(dynamodb: DynamoDBStore) -> None:
    ledger = DynamoDBUsageLedger(dynamodb)
    m = minute_of(NOV)
    await ledger.admit("t1", None, m, tenant_limit=3, key_limit=None)
    res = await dynamodb.client.query(TableName=dynamodb.table_name, KeyConditionExpression="PK = :pk",
                                   ExpressionAttributeValues={":pk": {"S": "RATE#t1"}})
    (item,) = res["Items"]
    assert int(item["expires_at"]["N"]) == (m + 1) * 60 + 300
    assert item["n"] == {"N": "1"}


class _ConflictingClient:
    """Cancels the first `conflicts` transactions as DynamoDB does when another one holds an item."""

    def __init__(self, conflicts: int) -> None:
        self.conflicts = conflicts
        self.calls = 0

    async def put_item(self, **params: object) -> dict[str, object]:
        return {}

    async def update_item(self, **params: object) -> dict[str, object]:
        return {}

    async def transact_write_items(self, **params: object) -> dict[str, object]:
        self.calls += 1
        if self.calls <= self.conflicts:
            raise ClientError({"Error": {"Code": "TransactionCanceledException", "Message": "conflict"},
                               "CancellationReasons": [{"Code": "None"}, {"Code": "TransactionConflict"}]},
                              "TransactWriteItems")
        return {}


async def test_dynamodb_conflicting_transactions_are_tried_again() -> None:
    client = _ConflictingClient(conflicts=2)
    store = SimpleNamespace(client=client, table_name="t", backoff_base_s=0.0, backoff_attempts=8)
    ledger = DynamoDBUsageLedger(cast(DynamoDBStore, store))
    assert await ledger.reserve("t1", "k1", P_NOV, Decimal(1),
                                turn_id="z", tenant_cap=Decimal(5), key_cap=Decimal(5)) is None
    assert client.calls == 3
    assert await ledger.settle(_record("z#llm#1", ended=DEC_1), reserved=Decimal(1), reserved_period=P_NOV,
                               key_held=False)  # across a month: a transaction (of 2 counters)
    assert client.calls == 4
    # past the attempts: the conflict is raised
    store.backoff_attempts = 2
    client.conflicts, client.calls = 5, 0
    with pytest.raises(ClientError):
        await ledger.release("t1", "k1", P_NOV, Decimal(1), turn_id="z", key_held=True)
    assert client.calls == 2
