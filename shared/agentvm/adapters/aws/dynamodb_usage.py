"""The UsageLedger port in the AgentVM table (beside the Store's items).

| Entity       | PK                     | SK          | Index keys: GSI partition / sort                  | TTL        |
|--------------|------------------------|-------------|---------------------------------------------------|------------|
| Usage record | USAGE#{t}#{yyyy-mm}    | REC#{rid}   | 2: USAGEMON#{yyyy-mm}#{shard} / {ended}#{t}#{rid} | –          |
| (before #17) | USAGE#{t}#{rid}        | REC         | 1: TENANT#{t}#USAGE / {ended}#{rid}, and 2        | –          |
| Budget       | BUDGET#{t}             | TENANT      | –                                                 | –          |
| (key's)      | BUDGET#{t}             | KEY#{kid}   | –                                                 | –          |
| Spend        | SPEND#{t}              | {yyyy-mm}   | –                                                 | –          |
| (key's)      | SPEND#{t}#{kid}        | {yyyy-mm}   | –                                                 | –          |
| Rate window  | RATE#{t}               | {minute}    | –                                                 | expires_at |
| (key's)      | RATE#{t}#{kid}         | {minute}    | –                                                 | expires_at |

`{ended}` is the record's `ended_at` (epoch ms, 16 digits), `{minute}` the window's epoch minute (12
digits), `{shard}` crc32 of the tenant and record id modulo 8, `{yyyy-mm}` the UTC month (of a
record: of its `ended_at`, its charge month).

* A usage record is written once: its key is the tenant, its month and the record id, and the
  PutItem is conditional on `attribute_not_exists(PK)`. Money (`list_cost`, `billed_cost`) is Decimal
  text, as on turns. A tenant's records of a month are one partition, so `/v1/usage` reads them from
  the table (strongly consistent, filtered by `ended_at`) and the record carries no GSI1 key: one
  index write per record, GSI2. GSI2 (G2PK/G2SK, projection ALL; the Store uses it for
  container-wide lists) holds every record in a month partition split into 8 shards, so the
  operator's export of all tenants reads 8 Queries per month of the range (in parallel) and never
  scans. Records written before this layout (PK `USAGE#{t}#{rid}`, with a GSI1 key) are still
  listed: a tenant's list also Queries GSI1 (one more request, empty once none is left).
* A budget's counters of a month are one item: `spent` and `reserved` as DynamoDB numbers (exact
  decimals; written as Decimal text, never float) and `committed` = spent + reserved, because a
  condition cannot add two attributes. `reserve` is one conditional UpdateItem
  (`ADD reserved :a, committed :a SET #hold = :note` if `attribute_not_exists(committed) OR committed
  <= :cap - :a`, where `#hold` is `hold#{turn}` and the note `{amount}@{start}`: the counter notes
  each turn's hold, and when its call started, while it lasts); with a key budget too it is a
  TransactWriteItems of both updates, and the cancellation reasons say which limit refused.
* `settle` is not a transaction: the record's PutItem, then per counter held (the tenant's, the
  key's when the key has a budget) one UpdateItem that releases the hold and adds the cost, on
  condition that the hold's note is still there, and removes it (a TransactWriteItems of the two
  months' items when the record's month is not the hold's). A counter whose note is gone was
  released by `release_turn` first: the cost is added by itself, unless `release_turn` found the
  record and marked it `recovered` (it billed it). `release_turn` (a dead runner's turn) reads the
  notes; for a note it looks for the record of that call (the turn's records of the months since
  the call started whose `started_at` is the note's): found, it marks it and settles each noted
  counter from it; else it releases exactly the amount noted. Every counter update is conditional
  on the note, so a hold is released once, and a cost added once, whichever comes first. The crash
  windows are in docs/billing.md. A note is ~50 bytes: a counter item passes 1 KB (2 write units
  per update) only with some 15 calls of one tenant in flight at once.
* A key's counter is written only while the key has a budget (the hold says so: `key_held`).
* A rate window is one item per budget and minute: `ADD n :one` if `attribute_not_exists(n) OR n
  < :limit`, with `expires_at` (the table's TTL, seconds) a few minutes after the window.
* Budgets of a tenant share one partition: `list_budgets` is one strongly consistent Query.
* Transactions on a busy counter item conflict with each other (TransactionConflict): those
  cancellations (nothing was written) are retried with full-jitter backoff.

Requests per operation (R = read, W = write; write units: an item's ceil(KB), +1 per index it is
in; a transaction bills twice): put_budget 1 W · delete_budget 1 W · list_budgets 1 R · reserve: no
cap 0, one cap 1 W (UpdateItem, 1 unit), tenant and key 1 W (TransactWriteItems, 2 items) · settle:
PutItem (2 units: the record and GSI2) + 1 UpdateItem per counter held (1 unit each; with no hold, 1
UpdateItem of the tenant's counter when the cost is not 0; a TransactWriteItems of 2 items per
counter when the months differ); a priced call under a tenant budget: hold 1 + record 2 + counter 1
= 4 units · release 1 W (UpdateItem; a transaction of 2 with the key) · release_turn 1 R per month
and counter, + 1 Query per month since the call (when a note was found), +1 W (record mark) when
the record is found, +1 W per note · spend 1 R · admit: no limit 0, one limit 1 W, both 1 W
(TransactWriteItems, 2 items) · list_usage 1 R/page per month of the range + 1 R (GSI1: records of
the former layout) (a tenant), 8 R/page per month of the range (all tenants) · stream_usage (all
tenants) the same 8 R per month, pages of 1,000 items.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, cast

from botocore.exceptions import ClientError

from agentvm.adapters.aws.dynamodb_items import (
    SHARDS,
    TTL_ATTRIBUTE,
    Item,
    _conditional_failed,
    _error_code,
    _failed_conditions,
    _int,
    _k,
    _key,
    _n,
    _opt_int,
    _opt_s,
    _put_opt,
    _s,
    _shard,
    _ts,
)
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.dynamodb_table import GSI_CONTAINER, GSI_TENANT
from agentvm.adapters.aws.dynamodb_usage_stream import stream_all
from agentvm.domain.models import Usage
from agentvm.domain.usage import Budget, Spend, UnitPrices, UsageRecord, precheck_hold
from agentvm.ids import now_ms

_RECORD_SK: Final = "REC"
_TENANT_BUDGET_SK: Final = "TENANT"
#: A rate window's item is deleted (TTL) this long after its minute ends.
_WINDOW_TTL_S: Final = 5 * 60
#: The Queries the all-tenant export runs at once.
_EXPORT_PARALLEL: Final = 16
#: Cancellation reasons of a transaction that wrote nothing and may simply be tried again.
_RETRY_REASONS: Final = frozenset({"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"})
_ZERO: Final = Decimal(0)


class DynamoDBUsageLedger:
    """`UsageLedger` over an open `DynamoDBStore` (same table, same client)."""

    def __init__(self, store: DynamoDBStore) -> None:
        self.store = store

    # ---- budgets -----------------------------------------------------------------------------

    async def put_budget(self, budget: Budget) -> None:
        item: Item = {**_budget_key(budget.tenant_id, budget.key_id), "tenant_id": _s(budget.tenant_id),
                      "updated_at": _n(budget.updated_at)}
        _put_opt(item, "key_id", budget.key_id)
        if budget.monthly is not None:
            item["monthly"] = _s(_text(budget.monthly))  # text: reads back exactly as written
        _put_opt(item, "requests_per_minute", budget.requests_per_minute)
        await self.store.client.put_item(TableName=self.store.table_name, Item=item)

    async def delete_budget(self, tenant_id: str, key_id: str | None) -> bool:
        res = await self.store.client.delete_item(TableName=self.store.table_name,
                                                  Key=_budget_key(tenant_id, key_id), ReturnValues="ALL_OLD")
        return bool(res.get("Attributes"))

    async def list_budgets(self, tenant_id: str) -> list[Budget]:
        items = await self.store._query(KeyConditionExpression="PK = :pk", ConsistentRead=True,
                                        ExpressionAttributeValues={":pk": _s(f"BUDGET#{_k(tenant_id)}")})
        budgets = [_budget(i) for i in items if i["tenant_id"]["S"] == tenant_id]
        return sorted(budgets, key=lambda b: (b.key_id is not None, b.key_id or ""))

    # ---- monthly counters --------------------------------------------------------------------

    async def reserve(self, tenant_id: str, key_id: str | None, period: str, amount: Decimal, *,
                      turn_id: str, tenant_cap: Decimal | None, key_cap: Decimal | None,
                      at_ms: int = 0) -> str | None:
        key_cap, verdict = precheck_hold(key_id, amount, tenant_cap, key_cap)
        if verdict != "check":
            return verdict
        holds = [("tenant", _hold(_spend_key(tenant_id, None, period), amount, tenant_cap, turn_id, at_ms))]
        if key_cap is not None:
            holds.append(("key", _hold(_spend_key(tenant_id, key_id, period), amount, key_cap, turn_id, at_ms)))
        failed = await self._write([op for _which, op in holds])
        return next((which for (which, _op), f in zip(holds, failed, strict=False) if f), None)

    async def settle(self, record: UsageRecord, *, reserved: Decimal, reserved_period: str,
                     key_held: bool) -> bool:
        """The record's conditional PutItem, then one UpdateItem per counter held (no transaction; the
        crash windows and how each is closed are in docs/billing.md, "Crash windows")."""
        written = not await self._write([{"Put": {"Item": _record_item(record),
                                                  "ConditionExpression": "attribute_not_exists(PK)"}}])
        counters: list[str | None] = [None]
        if key_held and record.key_id is not None:
            counters.append(record.key_id)
        if reserved == 0:
            if written and record.billed_cost != 0:
                for kid in counters:
                    await self._write([_change(_spend_key(record.tenant_id, kid, record.period), record.billed_cost,
                                               _ZERO)])
            return written
        recovered: bool | None = None
        for kid in counters:
            if await self._apply(record, kid, reserved, reserved_period, _note(reserved, record.started_at)):
                continue
            # The hold's note is gone. A duplicate settle stops here. Otherwise release_turn came first: it
            # either found this record (and marked it recovered: it billed the cost) or it did not (it only
            # released the hold: the cost is still to add).
            if written:
                if recovered is None:
                    recovered = await self._recovered(record)
                if not recovered and record.billed_cost != 0:
                    await self._write([_change(_spend_key(record.tenant_id, kid, record.period), record.billed_cost,
                                               _ZERO)])
        return written

    async def _apply(self, record: UsageRecord, kid: str | None, held: Decimal, held_period: str,
                     note: str) -> bool:
        """Release the hold noted `note` from a counter and add the record's cost, if the note is still
        there (one conditional UpdateItem; a TransactWriteItems of 2 when the record's month is not the
        hold's). False when the note is gone (nothing changed)."""
        t, cost = record.tenant_id, record.billed_cost
        if held_period == record.period:
            ops = [_change(_spend_key(t, kid, held_period), cost, -held, record.turn_id, note=note, legacy=held)]
        else:
            ops = [_change(_spend_key(t, kid, held_period), _ZERO, -held, record.turn_id, note=note, legacy=held),
                   _change(_spend_key(t, kid, record.period), cost, _ZERO)]
        return not any(await self._write(ops))

    async def _recovered(self, record: UsageRecord) -> bool:
        res = await self.store.client.get_item(TableName=self.store.table_name, Key=_record_key(record.tenant_id,
                                               record.period, record.record_id), ConsistentRead=True,
                                               ProjectionExpression="recovered")
        return bool((res.get("Item") or {}).get("recovered", {}).get("BOOL", False))

    async def release(self, tenant_id: str, key_id: str | None, period: str, amount: Decimal, *,
                      turn_id: str, key_held: bool) -> None:
        if amount == 0:
            return
        ops = [_change(_spend_key(tenant_id, None, period), _ZERO, -amount, turn_id)]
        if key_held and key_id is not None:
            ops.append(_change(_spend_key(tenant_id, key_id, period), _ZERO, -amount, turn_id))
        await self._write(ops)  # a failed condition: release_turn took the hold first

    async def release_turn(self, tenant_id: str, key_id: str | None, turn_id: str,
                           periods: Sequence[str]) -> Decimal:
        """Per month and counter (the tenant's, the key's): one strongly consistent GetItem of the
        turn's hold note. When one is there, the usage record of that hold is looked for (a Query of
        the turn's records per month since the hold): a runner that died between writing the record
        and updating the counters wrote it. Found, it is marked `recovered` and each counter gets
        what the settle would have written (hold released, cost added); not found (the runner died
        during the call), the hold is released. Each update is conditional on the note."""
        released = _ZERO
        names = {"#h": _hold_attribute(turn_id)}
        notes: list[tuple[Item, str | None, str, Item]] = []
        for period in dict.fromkeys(periods):
            for kid in (None, key_id) if key_id is not None else (None,):
                key = _spend_key(tenant_id, kid, period)
                res = await self.store.client.get_item(TableName=self.store.table_name, Key=key, ConsistentRead=True,
                                                       ProjectionExpression="#h", ExpressionAttributeNames=names)
                found = (res.get("Item") or {}).get(names["#h"])
                if found is not None:
                    notes.append((key, kid, period, cast(Item, found)))
        if not notes:
            return released
        at = _note_at(notes[0][3])
        record = await self._record_of_hold(tenant_id, turn_id, at) if at is not None else None
        if record is not None:
            await self.store.client.update_item(
                TableName=self.store.table_name, Key=_record_key(tenant_id, record.period, record.record_id),
                UpdateExpression="SET recovered = :t", ConditionExpression="attribute_exists(PK)",
                ExpressionAttributeValues={":t": {"BOOL": True}})
        for key, kid, period, attr in notes:
            amount = _note_amount(attr)
            if record is not None and _note_at(attr) == record.started_at:
                applied = await self._apply(record, kid, amount, period, attr.get("S", ""))
            else:
                op = _change(key, _ZERO, -amount, turn_id)
                op["Update"]["ConditionExpression"] = "#h = :held"
                op["Update"]["ExpressionAttributeValues"][":held"] = attr
                applied = not await self._write([op])
            if applied and kid is None:
                released += amount
        return released

    async def _record_of_hold(self, tenant_id: str, turn_id: str, at: int) -> UsageRecord | None:
        """The turn's LLM record whose call started at `at` (the hold's time), in the months since."""
        for month in _months(at, max(at, now_ms())):
            items = await self.store._query(
                KeyConditionExpression="PK = :pk AND begins_with(SK, :sk)", ConsistentRead=True,
                ExpressionAttributeValues={":pk": _s(_record_pk(tenant_id, month)),
                                           ":sk": _s(f"{_RECORD_SK}#{_k(turn_id + '#llm#')}")})
            found = [r for r in map(_record, items) if r.turn_id == turn_id and r.started_at == at]
            if found:
                return found[0]
        return None

    async def spend(self, tenant_id: str, key_id: str | None, period: str) -> Spend:
        res = await self.store.client.get_item(TableName=self.store.table_name, ConsistentRead=True,
                                               Key=_spend_key(tenant_id, key_id, period),
                                               ProjectionExpression="spent, reserved")
        item = res.get("Item") or {}
        return Spend(_dec(item, "spent"), _dec(item, "reserved"))

    # ---- rate windows ------------------------------------------------------------------------

    async def admit(self, tenant_id: str, key_id: str | None, minute: int, *, tenant_limit: int | None,
                    key_limit: int | None) -> str | None:
        # Only windows with a limit are counted: nothing reads a window without one.
        windows: list[tuple[str, int, str | None]] = []
        if tenant_limit is not None:
            windows.append(("tenant", tenant_limit, None))
        if key_limit is not None and key_id is not None:
            windows.append(("key", key_limit, key_id))
        for which, limit, _kid in windows:
            if limit <= 0:  # a window that does not exist yet passes the condition
                return which
        if not windows:
            return None
        expires = (minute + 1) * 60 + _WINDOW_TTL_S
        ops = [{"Update": {
            "Key": _key(_budget_pk("RATE", tenant_id, kid), f"{minute:012d}"),
            "UpdateExpression": "ADD #c :one SET #ttl = :exp",
            "ConditionExpression": "attribute_not_exists(#c) OR #c < :limit",
            "ExpressionAttributeNames": {"#c": "n", "#ttl": TTL_ATTRIBUTE},
            "ExpressionAttributeValues": {":one": _n(1), ":exp": _n(expires), ":limit": _n(limit)},
        }} for _which, limit, kid in windows]
        failed = await self._write(ops)
        return next((which for (which, _limit, _kid), f in zip(windows, failed, strict=False) if f), None)

    # ---- records -----------------------------------------------------------------------------

    async def list_usage(self, tenant_id: str | None, *, since_ms: int, until_ms: int) -> list[UsageRecord]:
        if since_ms >= until_ms:
            return []
        # BETWEEN is inclusive: `{until}` sorts before every `{until}#...` key, so ended_at = until is out.
        bounds = {":lo": _s(_ts(since_ms)), ":hi": _s(_ts(until_ms))}
        if tenant_id is not None:
            ended = {":lo": _n(since_ms), ":hi": _n(until_ms - 1)}
            pages = [await self.store._query(
                KeyConditionExpression="PK = :pk AND begins_with(SK, :rec)",
                FilterExpression="ended_at BETWEEN :lo AND :hi",
                ExpressionAttributeValues={":pk": _s(_record_pk(tenant_id, month)), ":rec": _s(f"{_RECORD_SK}#"),
                                           **ended}) for month in _months(since_ms, until_ms - 1)]
            # Records written before the month-partitioned key (docs/billing.md) are in GSI1.
            pages.append(await self.store._query(
                IndexName=GSI_TENANT, KeyConditionExpression="G1PK = :pk AND G1SK BETWEEN :lo AND :hi",
                ExpressionAttributeValues={":pk": _s(_tenant_list(tenant_id)), **bounds}))
            unique = {r.record_id: r for page in pages for r in map(_record, page) if r.tenant_id == tenant_id}
            records = list(unique.values())
        else:
            gate = asyncio.Semaphore(_EXPORT_PARALLEL)

            async def shard(g2pk: str) -> list[Item]:
                async with gate:
                    return await self.store._query(
                        IndexName=GSI_CONTAINER, KeyConditionExpression="G2PK = :pk AND G2SK BETWEEN :lo AND :hi",
                        ExpressionAttributeValues={":pk": _s(g2pk), **bounds})
            pages = await asyncio.gather(*(shard(_month_shard(month, s))
                                           for month in _months(since_ms, until_ms - 1) for s in range(SHARDS)))
            records = [_record(i) for page in pages for i in page]
        return sorted(records, key=lambda r: (r.ended_at, r.record_id, r.tenant_id))

    async def stream_usage(self, tenant_id: str | None, *, since_ms: int,
                           until_ms: int) -> AsyncIterator[UsageRecord]:
        """All tenants': GSI2 read as a stream (dynamodb_usage_stream.py), never more than 16 pages held.
        A tenant's records (`/v1/usage`, one tenant's month) are the `list_usage` list."""
        if since_ms >= until_ms:
            return
        if tenant_id is not None:
            for r in await self.list_usage(tenant_id, since_ms=since_ms, until_ms=until_ms):
                yield r
            return
        async for r in stream_all(self.store, _months(since_ms, until_ms - 1), since_ms, until_ms, _record,
                                  _month_shard):
            yield r

    # ---- writing -----------------------------------------------------------------------------

    async def _write(self, ops: list[Item]) -> list[bool]:
        """One UpdateItem/PutItem, or a TransactWriteItems of several. Per op, whether its condition
        failed ([] when everything was written). Conflicts (nothing written) are tried again."""
        client, table = self.store.client, self.store.table_name
        if len(ops) == 1:
            (kind, params), = ops[0].items()
            call: Callable[[], Awaitable[Any]] = (
                (lambda: client.put_item(TableName=table, **params)) if kind == "Put"
                else (lambda: client.update_item(TableName=table, **params)))
        else:
            items = [{kind: {"TableName": table, **params} for kind, params in op.items()} for op in ops]

            def call() -> Awaitable[Any]:
                return client.transact_write_items(TransactItems=cast(Any, items))
        for attempt in itertools.count(1):
            try:
                await call()
                return []
            except ClientError as exc:
                if _conditional_failed(exc):
                    return [True]
                failed = _failed_conditions(exc)
                if any(failed):
                    return failed
                if attempt >= self.store.backoff_attempts or not _retryable(exc):
                    raise
            await asyncio.sleep(random.uniform(0, self.store.backoff_base_s * 2 ** attempt))
        raise AssertionError("unreachable")


# ---- keys and items ----------------------------------------------------------------------------


def _budget_pk(prefix: str, tenant_id: str, key_id: str | None) -> str:
    """`{prefix}#{t}` for the tenant's own budget, `{prefix}#{t}#{kid}` for a key's (ids are escaped,
    so the two never collide)."""
    base = f"{prefix}#{_k(tenant_id)}"
    return base if key_id is None else f"{base}#{_k(key_id)}"


def _budget_key(tenant_id: str, key_id: str | None) -> Item:
    return _key(f"BUDGET#{_k(tenant_id)}", _TENANT_BUDGET_SK if key_id is None else f"KEY#{_k(key_id)}")


def _spend_key(tenant_id: str, key_id: str | None, period: str) -> Item:
    return _key(_budget_pk("SPEND", tenant_id, key_id), period)


def _hold_attribute(turn_id: str) -> str:
    return f"hold#{turn_id}"


def _note(amount: Decimal, at_ms: int) -> str:
    """A hold's note: its amount and the time its call started (the call's record has that `started_at`)."""
    return f"{_text(amount)}@{at_ms}"


def _note_amount(attr: Item) -> Decimal:
    """The amount of a note (a number: a note written before notes said when: amount only)."""
    return Decimal(attr["N"]) if "N" in attr else Decimal(attr["S"].partition("@")[0])


def _note_at(attr: Item) -> int | None:
    """When the hold's call started; None when the note does not say (then no record can be its call's)."""
    return (int(attr["S"].partition("@")[2]) or None) if "S" in attr else None


def _hold(key: Item, amount: Decimal, cap: Decimal | None, turn_id: str, at_ms: int) -> Item:
    """Add `amount` to a counter's `reserved` (and `committed`), unless that passes `cap`, and note it
    as the turn's hold (`hold#{turn}` = `{amount}@{at}`), so that `release_turn` can give it back and
    find the call's record."""
    update: Item = {"Key": key, "UpdateExpression": "ADD reserved :a, committed :a SET #h = :note",
                    "ExpressionAttributeNames": {"#h": _hold_attribute(turn_id)},
                    "ExpressionAttributeValues": {":a": _num(amount), ":note": _s(_note(amount, at_ms))}}
    if cap is not None:
        room = cap - amount
        # A counter that does not exist yet holds nothing: it has room unless the amount alone passes the cap.
        update["ConditionExpression"] = ("attribute_not_exists(committed) OR committed <= :room" if room >= 0
                                         else "committed <= :room")
        update["ExpressionAttributeValues"][":room"] = _num(room)
    return {"Update": update}


def _change(key: Item, spent: Decimal, held: Decimal, released_turn: str | None = None, *,
            note: str | None = None, legacy: Decimal | None = None) -> Item:
    """Add `spent` and `held` (either may be negative or zero) to a counter, keeping `committed`; with
    `released_turn`, only if that turn's hold is still noted there (with `note`: that very note, or
    the number `legacy`, a note of the amount alone), and the note goes."""
    parts, values = [], {}
    for name, delta in (("spent", spent), ("reserved", held), ("committed", spent + held)):
        if delta != 0:
            parts.append(f"{name} :{name}")
            values[f":{name}"] = _num(delta)
    if not parts:  # e.g. a hold released into the same month's equal cost: still the same item
        parts, values = ["committed :z"], {":z": _n(0)}
    update: Item = {"Key": key, "UpdateExpression": "ADD " + ", ".join(parts), "ExpressionAttributeValues": values}
    if released_turn is not None:
        update["UpdateExpression"] += " REMOVE #h"
        update["ConditionExpression"] = "attribute_exists(#h)"
        update["ExpressionAttributeNames"] = {"#h": _hold_attribute(released_turn)}
        if note is not None:
            update["ConditionExpression"] = "#h = :note"
            values[":note"] = _s(note)
            if legacy is not None:  # a note of the amount alone, or of a hold made without its time
                update["ConditionExpression"] += " OR #h = :legacy OR #h = :untimed"
                values[":legacy"], values[":untimed"] = _num(legacy), _s(_note(legacy, 0))
    return {"Update": update}


def _tenant_list(tenant_id: str) -> str:
    return f"TENANT#{_k(tenant_id)}#USAGE"


def _record_pk(tenant_id: str, month: str) -> str:
    return f"USAGE#{_k(tenant_id)}#{month}"


def _record_key(tenant_id: str, month: str, record_id: str) -> Item:
    return _key(_record_pk(tenant_id, month), f"{_RECORD_SK}#{_k(record_id)}")


def _month_shard(month: str, shard: int) -> str:
    return f"USAGEMON#{month}#{shard}"


def _months(first_ms: int, last_ms: int) -> list[str]:
    """The UTC months (`yyyy-mm`) from the one of `first_ms` to the one of `last_ms`, inclusive."""
    first, last = time.gmtime(first_ms // 1000), time.gmtime(last_ms // 1000)
    index, end = first.tm_year * 12 + first.tm_mon - 1, last.tm_year * 12 + last.tm_mon - 1
    return [f"{i // 12:04d}-{i % 12 + 1:02d}" for i in range(index, end + 1)]


def _record_item(r: UsageRecord) -> Item:
    t, rid, u = r.tenant_id, r.record_id, r.usage
    item: Item = {
        **_record_key(t, r.period, rid),
        "G2PK": _s(_month_shard(r.period, _shard(t, rid))), "G2SK": _s(f"{_ts(r.ended_at)}#{_k(t)}#{_k(rid)}"),
        "tenant_id": _s(t), "record_id": _s(rid), "container_id": _s(r.container_id), "image_id": _s(r.image_id),
        "session_id": _s(r.session_id), "turn_id": _s(r.turn_id), "kind": _s(r.kind), "provider": _s(r.provider),
        "input_tokens": _n(u.input_tokens), "output_tokens": _n(u.output_tokens),
        "cache_read_tokens": _n(u.cache_read_tokens), "cache_write_tokens": _n(u.cache_write_tokens),
        "sandbox_ms": _n(r.sandbox_ms), "list_cost": _s(_text(r.list_cost)), "billed_cost": _s(_text(r.billed_cost)),
        "currency": _s(r.currency), "tier": _s(r.tier), "status": _s(r.status),
        "started_at": _n(r.started_at), "ended_at": _n(r.ended_at),
    }
    _put_opt(item, "key_id", r.key_id)
    _put_opt(item, "model", r.model)
    if r.estimated:
        item["usage_estimated"] = {"BOOL": True}
    if r.prices is not None:
        item["unit_prices"] = _s(r.prices.to_text())
    return item


def _record(i: Mapping[str, Any]) -> UsageRecord:
    return UsageRecord(
        record_id=i["record_id"]["S"], tenant_id=i["tenant_id"]["S"], key_id=_opt_s(i, "key_id"),
        container_id=i["container_id"]["S"], image_id=i["image_id"]["S"], session_id=i["session_id"]["S"],
        turn_id=i["turn_id"]["S"], kind=i["kind"]["S"], provider=i["provider"]["S"], model=_opt_s(i, "model"),
        usage=Usage(_int(i, "input_tokens"), _int(i, "output_tokens"), _int(i, "cache_read_tokens"),
                    _int(i, "cache_write_tokens")),
        list_cost=Decimal(i["list_cost"]["S"]), billed_cost=Decimal(i["billed_cost"]["S"]), tier=i["tier"]["S"],
        status=i["status"]["S"], started_at=_int(i, "started_at"), ended_at=_int(i, "ended_at"),
        sandbox_ms=_int(i, "sandbox_ms"), currency=i["currency"]["S"],
        estimated=bool(i.get("usage_estimated", {}).get("BOOL", False)),
        prices=UnitPrices.from_text(i["unit_prices"]["S"]) if "unit_prices" in i else None)


def _budget(i: Mapping[str, Any]) -> Budget:
    monthly = _opt_s(i, "monthly")
    return Budget(tenant_id=i["tenant_id"]["S"], key_id=_opt_s(i, "key_id"),
                  monthly=Decimal(monthly) if monthly is not None else None,
                  requests_per_minute=_opt_int(i, "requests_per_minute"), updated_at=_int(i, "updated_at"))


def _text(value: Decimal) -> str:
    """Decimal as plain text (never an exponent: `0.00000105`, not `1.05E-6`)."""
    return format(value, "f")


def _num(value: Decimal) -> Item:
    """A DynamoDB number from a Decimal, exactly (N values are decimal strings; never a float)."""
    return {"N": _text(value)}


def _dec(item: Mapping[str, Any], name: str) -> Decimal:
    value = item.get(name)
    return Decimal(value["N"]) if value is not None else _ZERO


def _retryable(exc: ClientError) -> bool:
    """A write that wrote nothing because of a conflicting transaction (or throttling inside one)."""
    code = _error_code(exc)
    if code == "TransactionConflictException":
        return True
    if code != "TransactionCanceledException":
        return False
    reasons = {str(r.get("Code")) for r in cast(Mapping[str, Any], exc.response).get("CancellationReasons") or []}
    return bool(reasons & _RETRY_REASONS) and reasons <= _RETRY_REASONS | {"None"}


if TYPE_CHECKING:
    from agentvm.ports import UsageLedger

    def _implements_usage_ledger(ledger: DynamoDBUsageLedger) -> UsageLedger:  # mypy checks the port's signatures
        return ledger
