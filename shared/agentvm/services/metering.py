"""Metering: rate limits, budget holds and the usage ledger around every LLM call.

Before each call the worst case (an upper bound of the input tokens at the dearer of the input and
cache-write prices, plus `max_tokens` at the output price, × markup) is held on the tenant's month
(and the key's, when the key has a budget) in one atomic step of the ledger; when the call ends, its
usage record is written once and its real billed cost replaces the hold. Concurrent turns therefore
cannot take a month's billed cost past a budget, and a refused call spends no token.

The input bound, per content block type (docs/billing.md, "The hold is an upper bound"): text of any
kind (messages, system prompt, tool definitions and results, plain-text documents) one token per
UTF-8 byte, since no token is shorter than a byte; an image `IMAGE_TOKENS`; a PDF (or any document
whose text is not in the request) the model's whole context window; `TOOL_SYSTEM_TOKENS` for the
tool-use system prompt Anthropic adds when tools are given; and never more than the context window,
since the API refuses a longer request unbilled. Should a provider still bill a call above its hold,
the call is billed as reported, `budget hold exceeded` is logged and counted (`on_overrun`), and the
ledger refuses the tenant's next holds while spent + reserved exceeds the budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from decimal import ROUND_CEILING, Decimal

from agentvm.domain.models import Turn, Usage
from agentvm.domain.usage import Budget, Hold, UnitPrices, UsageRecord, minute_of, period_of
from agentvm.drivers.base import LLMRequest
from agentvm.drivers.token_bounds import worst_input_tokens
from agentvm.errors import QuotaExceeded, RateLimited
from agentvm.ids import now_ms
from agentvm.money import COST_QUANTUM, MILLION, Cost, ModelPrice, money_text, price_for
from agentvm.ports import UsageLedger

log = logging.getLogger(__name__)

def worst_cost(request: LLMRequest, *, markup: Decimal, prices: Mapping[str, ModelPrice] | None) -> Decimal:
    p = price_for(request.model, prices)
    raw = (Decimal(worst_input_tokens(request)) * max(p.input, p.cache_write)
           + Decimal(request.max_tokens) * p.output) / MILLION
    return (raw * markup).quantize(COST_QUANTUM, rounding=ROUND_CEILING)


class Meter:
    """Holds, settles and limits LLM calls over a `UsageLedger` (the engine's `CallMeter` port). Budgets
    are read through a short cache (`budget_cache_s`); `forget` drops a tenant's entry when this process
    changes its budgets."""

    def __init__(self, ledger: UsageLedger, *, budget_cache_s: float = 30.0,
                 clock: Callable[[], int] = now_ms, on_overrun: Callable[[str | None], None] | None = None) -> None:
        self.ledger = ledger
        self.budget_cache_s = budget_cache_s
        self._clock = clock
        self.on_overrun = on_overrun  # called with the model of a call billed above its hold
        self._budgets: dict[str, tuple[float, dict[str | None, Budget]]] = {}

    async def budgets(self, tenant_id: str) -> dict[str | None, Budget]:
        hit = self._budgets.get(tenant_id)
        if hit is not None and time.monotonic() - hit[0] < self.budget_cache_s:
            return hit[1]
        found = {b.key_id: b for b in await self.ledger.list_budgets(tenant_id)}
        if len(self._budgets) > 10_000:
            self._budgets.clear()
        self._budgets[tenant_id] = (time.monotonic(), found)
        return found

    def forget(self, tenant_id: str) -> None:
        self._budgets.pop(tenant_id, None)

    async def admit(self, turn: Turn) -> None:
        """Count a new turn against the requests-per-minute limits; `RateLimited` when one is full."""
        budgets = await self.budgets(turn.tenant_id)
        tenant, key = budgets.get(None), budgets.get(turn.key_id) if turn.key_id else None
        tenant_limit = tenant.requests_per_minute if tenant else None
        key_limit = key.requests_per_minute if key else None
        if tenant_limit is None and key_limit is None:
            return
        refused = await self.ledger.admit(turn.tenant_id, turn.key_id, minute_of(self._clock()),
                                          tenant_limit=tenant_limit, key_limit=key_limit)
        if refused is not None:
            limit = tenant_limit if refused == "tenant" else key_limit
            whose = "this tenant" if refused == "tenant" else "this API key"
            raise RateLimited(f"Rate limit reached: {whose} may start {limit} turns per minute. Try again "
                              "in a minute.")

    async def hold(self, turn: Turn, request: LLMRequest, *, markup: Decimal,
                   prices: Mapping[str, ModelPrice] | None = None) -> Hold:
        """Hold the call's worst case on the budgets that apply; `QuotaExceeded` when it does not fit."""
        now = self._clock()
        period = period_of(now)
        budgets = await self.budgets(turn.tenant_id)
        tenant, key = budgets.get(None), budgets.get(turn.key_id) if turn.key_id else None
        tenant_cap = tenant.monthly if tenant else None
        key_cap = key.monthly if key else None
        if tenant_cap is None and key_cap is None:
            return Hold(period, Decimal(0), False, now)
        amount = worst_cost(request, markup=markup, prices=prices)
        refused = await self.ledger.reserve(turn.tenant_id, turn.key_id, period, amount, turn_id=turn.turn_id,
                                            tenant_cap=tenant_cap, key_cap=key_cap, at_ms=now)
        if refused is not None:
            cap = tenant_cap if refused == "tenant" else key_cap
            whose = "this tenant's" if refused == "tenant" else "this API key's"
            raise QuotaExceeded(
                f"Budget exceeded: {whose} monthly budget of {money_text(cap or Decimal(0))} USD for {period} "
                f"cannot cover this call (up to {money_text(amount)} USD for {request.max_tokens} output tokens).")
        return Hold(period, amount, key_cap is not None, now)

    async def release(self, turn: Turn, hold: Hold) -> None:
        if hold.amount:
            await self.ledger.release(turn.tenant_id, turn.key_id, hold.period, hold.amount, turn_id=turn.turn_id,
                                      key_held=hold.key_held)

    async def release_lost(self, turn: Turn) -> Decimal:
        """Give back what a turn whose runner died during an LLM call still holds (its months: the one
        it started in and this one). The call's tokens are not known, so nothing is billed for it."""
        periods = [period_of(turn.started_at or turn.created_at), period_of(self._clock())]
        return await self.ledger.release_turn(turn.tenant_id, turn.key_id, turn.turn_id, periods)

    async def settle(self, turn: Turn, hold: Hold, *, call: int, provider: str, model: str, usage: Usage,
                     cost: Cost, status: str, estimated: bool = False,
                     prices: UnitPrices | None = None) -> UsageRecord:
        """Write the call's usage record once (its `cost` as the engine computed it for the turn) and
        replace its hold by its billed cost. A ledger failure is logged with the whole record (the turn
        row keeps the usage too) and does not fail the turn. A call billed above its hold is billed all
        the same (it was spent), logged and counted; the ledger then refuses the tenant's next holds
        for as long as spent + reserved exceeds the budget."""
        record = UsageRecord(
            record_id=f"{turn.turn_id}#llm#{call}", tenant_id=turn.tenant_id, key_id=turn.key_id,
            container_id=turn.container_id, image_id=turn.image_id, session_id=turn.session_id,
            turn_id=turn.turn_id, kind="llm", provider=provider, model=model, usage=usage,
            list_cost=cost.list, billed_cost=cost.billed, tier=turn.tier, status=status,
            started_at=hold.started_at, ended_at=max(self._clock(), hold.started_at), estimated=estimated,
            prices=prices)
        if hold.amount and record.billed_cost > hold.amount:
            log.warning("budget hold exceeded: an LLM call was billed above its hold", extra={
                "tenant_id": turn.tenant_id, "turn_id": turn.turn_id, "record_id": record.record_id,
                "model": model, "held": money_text(hold.amount), "billed": money_text(record.billed_cost),
                "excess": money_text(record.billed_cost - hold.amount), "usage": usage.to_wire()})
            if self.on_overrun is not None:
                self.on_overrun(model)
        await self._write(record, hold)
        return record

    async def sandbox(self, turn: Turn, *, started_at: int) -> UsageRecord:
        """The container tier's time for a turn (free: users pay tokens), recorded once."""
        ended = max(self._clock(), started_at)
        record = UsageRecord(
            record_id=f"{turn.turn_id}#sandbox", tenant_id=turn.tenant_id, key_id=turn.key_id,
            container_id=turn.container_id, image_id=turn.image_id, session_id=turn.session_id,
            turn_id=turn.turn_id, kind="sandbox", provider="agentvm", model=None, usage=Usage(),
            list_cost=Decimal(0), billed_cost=Decimal(0), tier="container", status=str(turn.status),
            started_at=started_at, ended_at=ended, sandbox_ms=ended - started_at)
        await self._write(record, Hold(period_of(ended), Decimal(0), False, started_at))
        return record

    async def _write(self, record: UsageRecord, hold: Hold) -> None:
        """A failed settle is tried once more: the ledger completes an interrupted settle and never
        counts one twice (a record written by the first try is not written again)."""
        for attempt in (1, 2):
            try:
                await self.ledger.settle(record, reserved=hold.amount, reserved_period=hold.period,
                                         key_held=hold.key_held)
                return
            except Exception:
                if attempt == 2:
                    log.exception("usage record not written", extra={"usage_record": record.to_wire()})
