"""The crash windows of a DynamoDB settle (docs/billing.md, "Crash windows"): the record is one
PutItem and each counter one conditional UpdateItem, with no transaction between them. Each test
stops a settle at one point (a client that fails the chosen request, or a settle not run at all)
and shows what the recovery path leaves: the exact counters and records."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import botocore.session
import pytest

from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.dynamodb_usage import DynamoDBUsageLedger
from agentvm.domain.models import Turn, TurnStatus, Usage
from agentvm.domain.usage import Budget, Spend, UsageRecord
from agentvm.drivers.base import LLMRequest
from agentvm.money import Cost
from agentvm.services.metering import Meter
from tests.adapters.test_usage_ledger import NOV, P_NOV, SEP_1, _record
from tests.aws_fixtures import moto_table

HELD = Decimal("0.50")
COST = Decimal("0.0123")


class Crash(Exception):
    """The process dies here (for the test: the request fails and nothing after it runs)."""


class _FailingClient:
    """The store's client, except that the `n`th request named `op` whose key starts with `prefix` fails
    (before reaching DynamoDB) with `Crash`."""

    def __init__(self, client: Any, op: str, prefix: str, n: int = 1) -> None:
        self._client, self.op, self.prefix, self.left = client, op, prefix, n

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._client, name)
        if name != self.op:
            return call

        async def maybe_fail(**params: Any) -> Any:
            key = params.get("Key") or params.get("Item") or {}
            if str(key.get("PK", {}).get("S", "")).startswith(self.prefix):
                self.left -= 1
                if self.left == 0:
                    raise Crash(f"{name} {key['PK']['S']}")
            return await call(**params)
        return maybe_fail


class _Store:
    """The real store with another client."""

    def __init__(self, store: DynamoDBStore, client: Any) -> None:
        self._store, self.client = store, client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture
async def dynamodb(aws_env: None, aws_session: botocore.session.Session, moto_endpoint: str) -> AsyncIterator[
        DynamoDBStore]:
    async with moto_table(moto_endpoint, session=aws_session) as store:
        yield store


def failing(store: DynamoDBStore, op: str, prefix: str, n: int = 1) -> DynamoDBUsageLedger:
    return DynamoDBUsageLedger(_Store(store, _FailingClient(store.client, op, prefix, n)))  # type: ignore[arg-type]


def _call(turn: str, *, key: str | None = "k1") -> UsageRecord:
    return _record(f"{turn}#llm#1", key=key, billed=COST, started_at=NOV - 1500)


async def _hold(ledger: DynamoDBUsageLedger, rec: UsageRecord, *, key_cap: Decimal | None = None) -> None:
    assert await ledger.reserve("t1", rec.key_id, P_NOV, HELD, turn_id=rec.turn_id, tenant_cap=Decimal(10),
                                key_cap=key_cap, at_ms=rec.started_at) is None


async def _records(ledger: DynamoDBUsageLedger) -> list[UsageRecord]:
    return await ledger.list_usage("t1", since_ms=SEP_1, until_ms=NOV + 1)


async def test_window_1_dead_during_the_call_the_hold_is_released(dynamodb: DynamoDBStore) -> None:
    ledger = DynamoDBUsageLedger(dynamodb)
    rec = _call("w1")
    await _hold(ledger, rec)
    # no record was written: the hold is given back, nothing billed
    assert await ledger.release_turn("t1", "k1", "w1", [P_NOV]) == HELD
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal(0))
    assert await _records(ledger) == []


async def test_window_2_dead_between_the_record_and_the_counter_recovery_settles_from_the_record(
        dynamodb: DynamoDBStore) -> None:
    ledger = DynamoDBUsageLedger(dynamodb)
    rec = _call("w2")
    await _hold(ledger, rec)
    with pytest.raises(Crash):
        await failing(dynamodb, "update_item", "SPEND#").settle(rec, reserved=HELD, reserved_period=P_NOV,
                                                                 key_held=False)
    assert await _records(ledger) == [rec]
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), HELD)  # still held: not billed yet
    # the next runner fails the turn and recovers: the hold is released and the record's cost billed
    assert await ledger.release_turn("t1", "k1", "w2", [P_NOV]) == HELD
    assert await ledger.spend("t1", None, P_NOV) == Spend(COST, Decimal(0))
    assert await ledger.spend("t1", "k1", P_NOV) == Spend()  # the key has no budget: no counter
    # the runner was not dead after all and settles again: nothing is counted twice
    assert await ledger.settle(rec, reserved=HELD, reserved_period=P_NOV, key_held=False) is False
    assert await ledger.release_turn("t1", "k1", "w2", [P_NOV]) == Decimal(0)
    assert await ledger.spend("t1", None, P_NOV) == Spend(COST, Decimal(0))
    assert await _records(ledger) == [rec]


async def test_window_3_recovery_before_the_record_the_late_settle_bills_the_cost(
        dynamodb: DynamoDBStore) -> None:
    ledger = DynamoDBUsageLedger(dynamodb)
    rec = _call("w3")
    await _hold(ledger, rec)
    # the runner is taken for dead during its call: the hold goes
    assert await ledger.release_turn("t1", "k1", "w3", [P_NOV]) == HELD
    assert await ledger.spend("t1", None, P_NOV) == Spend(Decimal(0), Decimal(0))
    # then it settles: its note is gone and the record is not marked recovered, so the cost is added
    assert await ledger.settle(rec, reserved=HELD, reserved_period=P_NOV, key_held=False) is True
    assert await ledger.spend("t1", None, P_NOV) == Spend(COST, Decimal(0))
    assert await _records(ledger) == [rec]


async def test_window_4_recovery_between_the_record_and_the_counter_of_a_live_runner(
        dynamodb: DynamoDBStore) -> None:
    ledger = DynamoDBUsageLedger(dynamodb)
    rec = _call("w4")
    await _hold(ledger, rec)

    class RecoveryInBetween(_FailingClient):
        """Runs release_turn (another process) just before the settle's counter update."""

        def __getattr__(self, name: str) -> Any:
            call = getattr(self._client, name)
            if name != "update_item":
                return call

            async def recover_first(**params: Any) -> Any:
                if params["Key"]["PK"]["S"].startswith("SPEND#") and self.left:
                    self.left = 0
                    assert await ledger.release_turn("t1", "k1", "w4", [P_NOV]) == HELD
                return await call(**params)
            return recover_first

    slow = DynamoDBUsageLedger(_Store(dynamodb, RecoveryInBetween(dynamodb.client, "", "")))  # type: ignore[arg-type]
    assert await slow.settle(rec, reserved=HELD, reserved_period=P_NOV, key_held=False) is True
    # recovery billed the record (and marked it); the settle found the note gone and the mark: once
    assert await ledger.spend("t1", None, P_NOV) == Spend(COST, Decimal(0))
    assert await _records(ledger) == [rec]


async def test_window_5_dead_between_the_tenant_and_the_key_counter(dynamodb: DynamoDBStore) -> None:
    ledger = DynamoDBUsageLedger(dynamodb)
    rec = _call("w5")
    await _hold(ledger, rec, key_cap=Decimal(10))
    with pytest.raises(Crash):
        await failing(dynamodb, "update_item", "SPEND#t1#").settle(rec, reserved=HELD, reserved_period=P_NOV,
                                                                    key_held=True)
    assert await ledger.spend("t1", None, P_NOV) == Spend(COST, Decimal(0))
    assert await ledger.spend("t1", "k1", P_NOV) == Spend(Decimal(0), HELD)
    # recovery finds the key's note only and settles that counter from the record
    assert await ledger.release_turn("t1", "k1", "w5", [P_NOV]) == Decimal(0)  # (the tenant's was released)
    for key in (None, "k1"):
        assert await ledger.spend("t1", key, P_NOV) == Spend(COST, Decimal(0)), key
    assert await _records(ledger) == [rec]


async def test_window_6_a_failed_counter_update_is_completed_by_the_meters_second_try(
        dynamodb: DynamoDBStore) -> None:
    """The process lives, the counter update failed (an error, not a crash): `Meter` settles again, the
    record is not written twice and the counter is updated once."""
    ledger = failing(dynamodb, "update_item", "SPEND#", n=2)  # the hold is the 1st SPEND update
    meter = Meter(ledger, clock=lambda: NOV)
    await DynamoDBUsageLedger(dynamodb).put_budget(Budget("t1", None, monthly=Decimal(10), updated_at=1))
    turn = Turn(turn_id="w6", session_id="s1", container_id="c1", image_id="img1", tenant_id="t1",
                user_message_id="m1", status=TurnStatus.RUNNING, key_id="k1", created_at=NOV - 5000)
    hold = await meter.hold(turn, LLMRequest(model="claude-haiku-4-5", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=100), markup=Decimal("1.05"))
    assert hold.amount > 0
    rec = await meter.settle(turn, hold, call=1, provider="anthropic", model="claude-haiku-4-5",
                             usage=Usage(10, 20), cost=Cost(COST / Decimal("1.05"), COST), status="completed")
    real = DynamoDBUsageLedger(dynamodb)
    assert await real.spend("t1", None, P_NOV) == Spend(COST, Decimal(0))
    assert await real.list_usage("t1", since_ms=SEP_1, until_ms=NOV + 1) == [rec]
