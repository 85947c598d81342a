"""The UsageLedger port on the local SQLite database (`usage_records`, `budgets`, `spend` and
`rate_windows` from schema version 8, `holds` from 9, `usage_records.usage_estimated` from 11).
`key_id` '' stands for the tenant's own budget, counters and windows; a hold's row names its turn,
its month, its amount and the key whose counter it also holds ('' when only the tenant's).

Money is Decimal text; arithmetic happens in Python. Every method is one job of the store, and the
store runs each job in a savepoint of a `BEGIN IMMEDIATE` transaction on its single writer thread:
the read-check-write of `reserve`, `settle` and `admit` is atomic.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.domain.models import Usage
from agentvm.domain.usage import (
    Budget,
    CounterDeltas,
    Spend,
    UnitPrices,
    UsageRecord,
    precheck_hold,
    settle_deltas,
)

_RECORD_COLS = ("tenant_id, record_id, key_id, container_id, image_id, session_id, turn_id, kind, provider, "
                "model, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, sandbox_ms, "
                "list_cost, billed_cost, currency, tier, status, started_at, ended_at, usage_estimated, unit_prices")
_ZERO = Decimal(0)
_STREAM_PAGE = 1000
#: Rate windows older than this many minutes are dropped when their budget counts a new request.
_WINDOW_KEEP_MIN = 5


class SqliteUsageLedger:
    """`UsageLedger` over an open `SqliteStore` (it neither opens nor closes the store)."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    # ---- budgets -----------------------------------------------------------------------------

    async def put_budget(self, budget: Budget) -> None:
        def job(c: sqlite3.Connection) -> None:
            c.execute("INSERT OR REPLACE INTO budgets (tenant_id, key_id, monthly, requests_per_minute, updated_at) "
                      "VALUES (?,?,?,?,?)",
                      (budget.tenant_id, _kid(budget.key_id),
                       _text(budget.monthly) if budget.monthly is not None else None,
                       budget.requests_per_minute, budget.updated_at))
        await self.store.run(job)

    async def delete_budget(self, tenant_id: str, key_id: str | None) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            return c.execute("DELETE FROM budgets WHERE tenant_id=? AND key_id=?",
                             (tenant_id, _kid(key_id))).rowcount == 1
        return await self.store.run(job)

    async def list_budgets(self, tenant_id: str) -> list[Budget]:
        def job(c: sqlite3.Connection) -> list[Budget]:
            # '' (the tenant's own) sorts before every key id
            rows = c.execute("SELECT tenant_id, key_id, monthly, requests_per_minute, updated_at FROM budgets "
                             "WHERE tenant_id=? ORDER BY key_id", (tenant_id,)).fetchall()
            return [Budget(tenant_id=r[0], key_id=r[1] or None,
                           monthly=Decimal(r[2]) if r[2] is not None else None,
                           requests_per_minute=r[3], updated_at=r[4]) for r in rows]
        return await self.store.run(job)

    # ---- monthly counters --------------------------------------------------------------------

    async def reserve(self, tenant_id: str, key_id: str | None, period: str, amount: Decimal, *,
                      turn_id: str, tenant_cap: Decimal | None, key_cap: Decimal | None,
                      at_ms: int = 0) -> str | None:
        key_cap, verdict = precheck_hold(key_id, amount, tenant_cap, key_cap)
        if verdict != "check":
            return verdict

        def job(c: sqlite3.Connection) -> str | None:
            tenant = _spend(c, tenant_id, "", period)
            if tenant_cap is not None and tenant.spent + tenant.reserved + amount > tenant_cap:
                return "tenant"
            if key_cap is not None:
                key = _spend(c, tenant_id, _kid(key_id), period)
                if key.spent + key.reserved + amount > key_cap:
                    return "key"
                _put_spend(c, tenant_id, _kid(key_id), period, Spend(key.spent, key.reserved + amount))
            _put_spend(c, tenant_id, "", period, Spend(tenant.spent, tenant.reserved + amount))
            c.execute("INSERT OR REPLACE INTO holds (tenant_id, turn_id, key_id, period, amount) VALUES (?,?,?,?,?)",
                      (tenant_id, turn_id, "" if key_cap is None else _kid(key_id), period, _text(amount)))
            return None
        return await self.store.run(job)

    async def settle(self, record: UsageRecord, *, reserved: Decimal, reserved_period: str,
                     key_held: bool) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            cur = c.execute(f"INSERT OR IGNORE INTO usage_records ({_RECORD_COLS}) "
                            f"VALUES ({','.join('?' * 24)})", _record_row(record))
            if cur.rowcount != 1:
                return False
            held = reserved if reserved and _drop_hold(c, record.tenant_id, record.turn_id) else _ZERO
            _apply(c, record.tenant_id, settle_deltas(record, reserved=held, reserved_period=reserved_period,
                                                      key_held=key_held))
            return True
        return await self.store.run(job)

    async def release(self, tenant_id: str, key_id: str | None, period: str, amount: Decimal, *,
                      turn_id: str, key_held: bool) -> None:
        if amount == 0:
            return
        deltas: CounterDeltas = {(None, period): (_ZERO, -amount)}
        if key_held and key_id is not None:
            deltas[(key_id, period)] = (_ZERO, -amount)

        def job(c: sqlite3.Connection) -> None:
            if _drop_hold(c, tenant_id, turn_id):
                _apply(c, tenant_id, deltas)
        await self.store.run(job)

    async def release_turn(self, tenant_id: str, key_id: str | None, turn_id: str,
                           periods: Sequence[str]) -> Decimal:
        def job(c: sqlite3.Connection) -> Decimal:
            row = c.execute("SELECT key_id, period, amount FROM holds WHERE tenant_id=? AND turn_id=?",
                            (tenant_id, turn_id)).fetchone()
            if row is None or row[1] not in periods:
                return _ZERO
            held_key, period, amount = row[0], row[1], Decimal(row[2])
            _drop_hold(c, tenant_id, turn_id)
            deltas: CounterDeltas = {(None, period): (_ZERO, -amount)}
            if held_key:
                deltas[(held_key, period)] = (_ZERO, -amount)
            _apply(c, tenant_id, deltas)
            return amount
        return await self.store.run(job)

    async def spend(self, tenant_id: str, key_id: str | None, period: str) -> Spend:
        def job(c: sqlite3.Connection) -> Spend:
            return _spend(c, tenant_id, _kid(key_id), period)
        return await self.store.run(job)

    async def release_all_holds(self) -> int:
        """Drop every hold. For `avm serve` at start-up, when no LLM call on this database can be in
        flight: whatever is still held was left by a process that died during a call (`kill -9`),
        and would shrink the month's budget for good. Returns how many counters held something."""
        def job(c: sqlite3.Connection) -> int:
            held = [r[:3] for r in c.execute("SELECT tenant_id, key_id, period, reserved FROM spend").fetchall()
                    if Decimal(r[3]) != 0]
            c.executemany("UPDATE spend SET reserved='0' WHERE tenant_id=? AND key_id=? AND period=?", held)
            c.execute("DELETE FROM holds")
            return len(held)
        return await self.store.run(job)

    # ---- rate windows ------------------------------------------------------------------------

    async def admit(self, tenant_id: str, key_id: str | None, minute: int, *, tenant_limit: int | None,
                    key_limit: int | None) -> str | None:
        # Only windows with a limit are counted: nothing reads a window without one.
        windows: list[tuple[int, str, str]] = []  # (limit, key id or '', which limit)
        if tenant_limit is not None:
            windows.append((tenant_limit, "", "tenant"))
        if key_limit is not None and key_id is not None:
            windows.append((key_limit, key_id, "key"))
        for limit, _window_key, which in windows:
            if limit <= 0:
                return which
        if not windows:
            return None

        def job(c: sqlite3.Connection) -> str | None:
            counts = []
            for limit, kid, which in windows:
                row = c.execute("SELECT count FROM rate_windows WHERE tenant_id=? AND key_id=? AND minute=?",
                                (tenant_id, kid, minute)).fetchone()
                count = row[0] if row else 0
                if count >= limit:
                    return which
                counts.append((kid, count + 1))
            for kid, count in counts:
                c.execute("INSERT OR REPLACE INTO rate_windows (tenant_id, key_id, minute, count) VALUES (?,?,?,?)",
                          (tenant_id, kid, minute, count))
                c.execute("DELETE FROM rate_windows WHERE tenant_id=? AND key_id=? AND minute<?",
                          (tenant_id, kid, minute - _WINDOW_KEEP_MIN))
            return None
        return await self.store.run(job)

    # ---- records -----------------------------------------------------------------------------

    async def list_usage(self, tenant_id: str | None, *, since_ms: int, until_ms: int) -> list[UsageRecord]:
        def job(c: sqlite3.Connection) -> list[UsageRecord]:
            if tenant_id is None:
                rows = c.execute(f"SELECT {_RECORD_COLS} FROM usage_records WHERE ended_at>=? AND ended_at<? "
                                 "ORDER BY ended_at, record_id, tenant_id", (since_ms, until_ms)).fetchall()
            else:
                rows = c.execute(f"SELECT {_RECORD_COLS} FROM usage_records WHERE tenant_id=? AND ended_at>=? "
                                 "AND ended_at<? ORDER BY ended_at, record_id",
                                 (tenant_id, since_ms, until_ms)).fetchall()
            return [_record(r) for r in rows]
        return await self.store.run(job)

    async def stream_usage(self, tenant_id: str | None, *, since_ms: int,
                           until_ms: int) -> AsyncIterator[UsageRecord]:
        """Pages of `_STREAM_PAGE` rows, each after the last one read (keyset pagination)."""
        after: tuple[int, str, str] | None = None
        tenant = "" if tenant_id is None else "tenant_id=? AND "
        args: tuple[object, ...] = () if tenant_id is None else (tenant_id,)

        def job(c: sqlite3.Connection) -> list[tuple[Any, ...]]:
            where = "" if after is None else " AND (ended_at, tenant_id, record_id) > (?,?,?)"
            return c.execute(f"SELECT {_RECORD_COLS} FROM usage_records WHERE {tenant}ended_at>=? AND ended_at<?"
                             f"{where} ORDER BY ended_at, tenant_id, record_id LIMIT {_STREAM_PAGE}",
                             (*args, since_ms, until_ms, *(after or ()))).fetchall()
        while True:
            rows = await self.store.run(job)
            for row in rows:
                record = _record(row)
                yield record
            if len(rows) < _STREAM_PAGE:
                return
            after = (record.ended_at, record.tenant_id, record.record_id)


# ---- helpers -----------------------------------------------------------------------------------

def _apply(c: sqlite3.Connection, tenant_id: str, deltas: CounterDeltas) -> None:
    for (key_id, period), (spent, held) in deltas.items():
        cur = _spend(c, tenant_id, _kid(key_id), period)
        _put_spend(c, tenant_id, _kid(key_id), period, Spend(cur.spent + spent, cur.reserved + held))


def _drop_hold(c: sqlite3.Connection, tenant_id: str, turn_id: str) -> bool:
    """Remove the turn's hold row; False when it held nothing (already released)."""
    return c.execute("DELETE FROM holds WHERE tenant_id=? AND turn_id=?", (tenant_id, turn_id)).rowcount == 1


def _spend(c: sqlite3.Connection, tenant_id: str, kid: str, period: str) -> Spend:
    row = c.execute("SELECT spent, reserved FROM spend WHERE tenant_id=? AND key_id=? AND period=?",
                    (tenant_id, kid, period)).fetchone()
    return Spend(Decimal(row[0]), Decimal(row[1])) if row else Spend()


def _put_spend(c: sqlite3.Connection, tenant_id: str, kid: str, period: str, value: Spend) -> None:
    c.execute("INSERT OR REPLACE INTO spend (tenant_id, key_id, period, spent, reserved) VALUES (?,?,?,?,?)",
              (tenant_id, kid, period, _text(value.spent), _text(value.reserved)))


def _kid(key_id: str | None) -> str:
    return "" if key_id is None else key_id


def _text(value: Decimal) -> str:
    """Decimal as plain text (never an exponent: `0.00000105`, not `1.05E-6`)."""
    return format(value, "f")


def _record_row(r: UsageRecord) -> tuple[Any, ...]:
    u = r.usage
    return (r.tenant_id, r.record_id, r.key_id, r.container_id, r.image_id, r.session_id, r.turn_id, r.kind,
            r.provider, r.model, u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens,
            r.sandbox_ms, _text(r.list_cost), _text(r.billed_cost), r.currency, r.tier, r.status, r.started_at,
            r.ended_at, int(r.estimated), r.prices.to_text() if r.prices is not None else None)


def _record(r: tuple[Any, ...]) -> UsageRecord:
    return UsageRecord(record_id=r[1], tenant_id=r[0], key_id=r[2], container_id=r[3], image_id=r[4],
                       session_id=r[5], turn_id=r[6], kind=r[7], provider=r[8], model=r[9],
                       usage=Usage(r[10], r[11], r[12], r[13]), sandbox_ms=r[14], list_cost=Decimal(r[15]),
                       billed_cost=Decimal(r[16]), currency=r[17], tier=r[18], status=r[19], started_at=r[20],
                       ended_at=r[21], estimated=bool(r[22]),
                       prices=UnitPrices.from_text(r[23]) if r[23] else None)


if TYPE_CHECKING:
    from agentvm.ports import UsageLedger

    def _implements_usage_ledger(ledger: SqliteUsageLedger) -> UsageLedger:  # mypy checks the port's signatures
        return ledger
