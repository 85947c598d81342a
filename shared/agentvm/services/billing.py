"""Budgets, usage aggregates and usage exports of a tenant (the `/v1/budgets` and `/v1/usage` APIs,
`avm usage export`, the scheduled export function)."""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from agentvm.domain.models import Usage
from agentvm.domain.usage import Budget, UsageRecord, period_of
from agentvm.errors import Forbidden, InvalidRequest, NotFound
from agentvm.ids import now_ms
from agentvm.money import money_text
from agentvm.ports import KeyStore, UsageLedger
from agentvm.services.keys import Caller
from agentvm.services.metering import Meter

JSON = dict[str, Any]
GROUPS = ("tenant", "container", "model", "day", "key", "kind")
FORMATS = ("focus", "jsonl")
_PERIOD = re.compile(r"^(\d{4})-(\d{2})(?:-(\d{2}))?$")
MAX_BUDGET = Decimal(1_000_000_000)


#: The widest `usage` range: the DynamoDB ledger reads one partition per month of the range, so an
#: unbounded one (`since=0`: 684 months) would cost hundreds of queries per request.
MAX_USAGE_RANGE_MS = 366 * 86_400_000


@dataclass(frozen=True, slots=True)
class Window:
    """A billing period: a UTC month (`2026-11`) or day (`2026-11-05`), as epoch-ms bounds."""

    label: str
    since_ms: int
    until_ms: int

    @property
    def month(self) -> str:
        return self.label[:7]


def window(period: str, *, field: str = "period") -> Window:
    m = _PERIOD.match(period.strip()) if isinstance(period, str) else None
    if m is None:
        raise InvalidRequest(f"{field}: must be a month (2026-11) or a day (2026-11-05)", field=field)
    year, month, day = int(m[1]), int(m[2]), m[3]
    if not 1 <= month <= 12 or not 1970 <= year < 9999:  # (the end of 9999-12 is in a year ISO 8601 cannot write)
        raise InvalidRequest(f"{field}: no such month: {period}", field=field)
    last = calendar.monthrange(year, month)[1]
    if day is not None and not 1 <= int(day) <= last:
        raise InvalidRequest(f"{field}: no such day: {period}", field=field)
    if day is None:
        start = calendar.timegm((year, month, 1, 0, 0, 0))
        end = calendar.timegm((year + month // 12, month % 12 + 1, 1, 0, 0, 0))
    else:
        start = calendar.timegm((year, month, int(day), 0, 0, 0))
        end = start + 86_400
    return Window(period.strip(), start * 1000, end * 1000)


def day_of(ms: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ms / 1000))


def aggregate(records: Iterable[UsageRecord], group_by: Sequence[str]) -> list[JSON]:
    """Sums per group (calls, tokens, sandbox time, list and billed cost), groups in key order."""
    rows: dict[tuple[Any, ...], JSON] = {}
    for r in records:
        values = {"tenant": r.tenant_id, "container": r.container_id, "model": r.model, "day": day_of(r.ended_at),
                  "key": r.key_id, "kind": r.kind}
        group = tuple(values[g] for g in group_by)
        row = rows.get(group)
        if row is None:
            row = rows[group] = {"group": {g: values[g] for g in group_by}, "calls": 0, "usage": Usage(),
                                 "sandboxMs": 0, "list": Decimal(0), "billed": Decimal(0)}
        row["calls"] += 1 if r.kind == "llm" else 0
        row["usage"] += r.usage
        row["sandboxMs"] += r.sandbox_ms
        row["list"] += r.list_cost
        row["billed"] += r.billed_cost
    out = []
    for group in sorted(rows, key=lambda g: tuple("" if v is None else str(v) for v in g)):
        row = rows[group]
        out.append({**row["group"], "calls": row["calls"], "usage": row["usage"].to_wire(),
                    "sandboxMs": row["sandboxMs"], "listCost": money_text(row["list"]),
                    "billedCost": money_text(row["billed"]), "currency": "USD"})
    return out


def money_field(value: Any, field: str) -> Decimal:
    try:
        d = Decimal(str(value).strip())
    except InvalidOperation:
        raise InvalidRequest(f"{field}: must be a decimal amount in USD, such as \"25.00\"", field=field) from None
    if not d.is_finite() or d < 0 or d > MAX_BUDGET:
        raise InvalidRequest(f"{field}: must be from 0 to {MAX_BUDGET} USD", field=field)
    return d


class BillingService:
    def __init__(self, ledger: UsageLedger, keys: KeyStore | None, meter: Meter | None = None) -> None:
        self.ledger = ledger
        self.keys = keys
        self.meter = meter

    async def budgets(self, caller: Caller) -> JSON:
        """The tenant's budgets with this month's counters."""
        period = period_of(now_ms())
        out = []
        for b in await self.ledger.list_budgets(caller.tenant_id):
            spend = await self.ledger.spend(caller.tenant_id, b.key_id, period)
            out.append({**b.to_wire(), "period": period, "spent": money_text(spend.spent),
                        "reserved": money_text(spend.reserved)})
        tenant_spend = await self.ledger.spend(caller.tenant_id, None, period)
        return {"period": period, "spent": money_text(tenant_spend.spent),
                "reserved": money_text(tenant_spend.reserved), "currency": "USD", "budgets": out}

    async def set_budget(self, caller: Caller, *, key_id: str | None, monthly: Any,
                         requests_per_minute: Any) -> Budget:
        _admin(caller)
        if key_id is not None:
            await self._own_key(caller, key_id)
        amount = None if monthly is None else money_field(monthly, "monthlyBudget")
        rpm = requests_per_minute
        if rpm is not None and (not isinstance(rpm, int) or isinstance(rpm, bool) or not 1 <= rpm <= 1_000_000):
            raise InvalidRequest("requestsPerMinute: must be an integer from 1 to 1000000", field="requestsPerMinute")
        if amount is None and rpm is None:
            raise InvalidRequest("monthlyBudget: give monthlyBudget, requestsPerMinute or both (DELETE removes a "
                                 "budget)", field="monthlyBudget")
        budget = Budget(caller.tenant_id, key_id, amount, rpm, now_ms())
        await self.ledger.put_budget(budget)
        self._changed(caller.tenant_id)
        return budget

    async def delete_budget(self, caller: Caller, key_id: str | None) -> None:
        _admin(caller)
        if not await self.ledger.delete_budget(caller.tenant_id, key_id):
            what = f"API key {key_id}" if key_id else "this tenant"
            raise NotFound(f"Budget not found: {what}", field="keyId" if key_id else None)
        self._changed(caller.tenant_id)

    async def usage(self, tenant_id: str, *, since_ms: int, until_ms: int, group_by: Sequence[str]) -> JSON:
        for g in group_by:
            if g not in GROUPS:
                raise InvalidRequest(f"groupBy: unknown group {g!r}; one or more of {', '.join(GROUPS)}",
                                     field="groupBy")
        if until_ms <= since_ms:
            raise InvalidRequest("until: must be after since", field="until")
        if until_ms - since_ms > MAX_USAGE_RANGE_MS:
            raise InvalidRequest(f"since: a range of at most {MAX_USAGE_RANGE_MS // 86_400_000} days (ask one year at "
                                 "a time, or export months with /v1/usage/export)", field="since")
        records = await self.ledger.list_usage(tenant_id, since_ms=since_ms, until_ms=until_ms)
        total = aggregate(records, ())
        return {"since": since_ms, "until": until_ms, "groupBy": list(group_by),
                "total": total[0] if total else _empty_total(),
                "rows": aggregate(records, group_by)}

    async def export(self, tenant_id: str | None, period: str, fmt: str) -> tuple[str, str]:
        """(media type, text) of a period's usage: FOCUS 1.0 CSV or JSON lines; every tenant's when
        `tenant_id` is None (the operator's export)."""
        from agentvm.services.usage_export import focus_csv, usage_jsonl

        if fmt not in FORMATS:
            raise InvalidRequest(f"format: must be one of {', '.join(FORMATS)}", field="format")
        w = window(period)
        records = await self.ledger.list_usage(tenant_id, since_ms=w.since_ms, until_ms=w.until_ms)
        if fmt == "jsonl":
            return "application/x-ndjson", usage_jsonl(records)
        return "text/csv", focus_csv(records, billing_period=w.month)

    async def _own_key(self, caller: Caller, key_id: str) -> None:
        key = await self.keys.get_key(key_id) if self.keys is not None else None
        if key is None or key.tenant_id != caller.tenant_id:
            raise NotFound(f"API key not found: {key_id}", field="keyId")

    def _changed(self, tenant_id: str) -> None:
        if self.meter is not None:
            self.meter.forget(tenant_id)


def _empty_total() -> JSON:
    return {"calls": 0, "usage": Usage().to_wire(), "sandboxMs": 0, "listCost": "0", "billedCost": "0",
            "currency": "USD"}


def _admin(caller: Caller) -> None:
    if not caller.admin:
        raise Forbidden("Budgets are changed with an admin key")
