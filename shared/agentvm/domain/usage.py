"""The usage ledger's records and the budgets that limit them. Money is Decimal, never float."""

from __future__ import annotations

import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

from agentvm.domain.models import Usage

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Hold:
    """What one LLM call holds on its budgets until it settles."""

    period: str
    amount: Decimal
    key_held: bool
    started_at: int


class ListPrices(Protocol):
    """USD per million tokens of each class (money.ModelPrice)."""

    @property
    def input(self) -> Decimal: ...
    @property
    def output(self) -> Decimal: ...
    @property
    def cache_write(self) -> Decimal: ...
    @property
    def cache_read(self) -> Decimal: ...


@dataclass(frozen=True, slots=True)
class UnitPrices:
    """The list prices an LLM call was billed at (USD per million tokens) and the markup over them, kept
    with its usage record: an export months later shows what was charged, not the prices configured
    then. Stored as one text field (`to_text`: five decimals, space-separated)."""

    input: Decimal
    output: Decimal
    cache_write: Decimal
    cache_read: Decimal
    markup: Decimal

    @classmethod
    def of(cls, price: ListPrices, markup: Decimal) -> UnitPrices:
        return cls(price.input, price.output, price.cache_write, price.cache_read, markup)

    def to_text(self) -> str:
        return " ".join(format(v, "f") for v in (self.input, self.output, self.cache_write, self.cache_read,
                                                 self.markup))

    @classmethod
    def from_text(cls, text: str) -> UnitPrices:
        values = [Decimal(v) for v in text.split()]
        if len(values) != 5:
            raise ValueError(f"unit prices {text!r}: five decimals expected (input output cacheWrite cacheRead "
                             "markup)")
        return cls(*values)

    def to_wire(self) -> JSON:
        return {"input": format(self.input, "f"), "output": format(self.output, "f"),
                "cacheWrite": format(self.cache_write, "f"), "cacheRead": format(self.cache_read, "f"),
                "markup": format(self.markup, "f")}


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One metered thing, written once: an LLM call (`kind` "llm", tokens and their cost) or the
    sandbox time of a container-tier turn (`kind` "sandbox", `sandbox_ms`, free: users pay tokens).

    `record_id` makes the write idempotent: `{turn_id}#llm#{n}` for the turn's n-th model call,
    `{turn_id}#sandbox` for its sandbox time."""

    record_id: str
    tenant_id: str
    key_id: str | None
    container_id: str
    image_id: str
    session_id: str
    turn_id: str
    kind: str  # "llm" | "sandbox"
    provider: str  # "anthropic" (the scripted driver reports "scripted")
    model: str | None
    usage: Usage
    list_cost: Decimal
    billed_cost: Decimal
    tier: str  # "function" | "container"
    status: str  # how the call ended: "completed", "failed", "interrupted"
    started_at: int  # epoch ms
    ended_at: int  # epoch ms: the charge time (its period is the billing month)
    sandbox_ms: int = 0
    currency: str = "USD"
    # True when the output tokens are AgentVM's estimate, not the provider's count: the stream broke
    # (or never reported its output) after output was streamed (docs/billing.md)
    estimated: bool = False
    # the list prices and markup the call was billed at; None for sandbox time and for records written
    # before they were kept (the FOCUS export then prices them from its price table)
    prices: UnitPrices | None = None

    @property
    def duration_ms(self) -> int:
        return max(0, self.ended_at - self.started_at)

    @property
    def period(self) -> str:
        return period_of(self.ended_at)

    def to_wire(self) -> JSON:
        return {
            "recordId": self.record_id, "tenantId": self.tenant_id, "keyId": self.key_id,
            "containerId": self.container_id, "imageId": self.image_id, "sessionId": self.session_id,
            "turnId": self.turn_id, "kind": self.kind, "provider": self.provider, "model": self.model,
            "usage": self.usage.to_wire(), "sandboxMs": self.sandbox_ms,
            "listCost": format(self.list_cost, "f"), "billedCost": format(self.billed_cost, "f"),
            "currency": self.currency, "tier": self.tier, "status": self.status,
            "startedAt": self.started_at, "endedAt": self.ended_at, "durationMs": self.duration_ms,
            "estimated": self.estimated, "prices": self.prices.to_wire() if self.prices is not None else None,
        }


@dataclass(frozen=True, slots=True)
class Budget:
    """A tenant's limits (`key_id` None) or one key's: billed money per calendar month (UTC) and turns
    started per minute. None: no limit of that kind."""

    tenant_id: str
    key_id: str | None = None
    monthly: Decimal | None = None
    requests_per_minute: int | None = None
    updated_at: int = 0

    def to_wire(self) -> JSON:
        return {"keyId": self.key_id,
                "monthlyBudget": format(self.monthly, "f") if self.monthly is not None else None,
                "requestsPerMinute": self.requests_per_minute, "updatedAt": self.updated_at}


@dataclass(frozen=True, slots=True)
class Spend:
    """A budget's month: settled billed cost, and what running calls hold reserved on top of it."""

    spent: Decimal = Decimal(0)
    reserved: Decimal = Decimal(0)


def precheck_hold(key_id: str | None, amount: Decimal, tenant_cap: Decimal | None,
                  key_cap: Decimal | None) -> tuple[Decimal | None, str | None]:
    """What a ledger's `reserve` decides before reading any counter: the key cap that applies (a
    call without a key has no key budget) and "check" (read the counters), None (no cap: hold
    nothing, write nothing) or "tenant" (more than the whole budget: refused whatever it holds)."""
    if key_id is None:
        key_cap = None
    if tenant_cap is None and key_cap is None:
        return None, None
    if tenant_cap is not None and amount > tenant_cap:
        return key_cap, "tenant"
    return key_cap, "check"


#: A ledger's counter changes: (key id, None for the tenant's own; period) -> (spent, reserved) change.
CounterDeltas = dict[tuple[str | None, str], tuple[Decimal, Decimal]]


def settle_deltas(record: UsageRecord, *, reserved: Decimal, reserved_period: str, key_held: bool) -> CounterDeltas:
    """What a ledger's `settle` changes: the hold leaves `reserved_period`, the billed cost joins the
    record's own period; for the tenant (key None) and, when `key_held` (the key has a budget), its
    key: a key's counter counts only while the key has a budget. One entry per counter."""
    zero = Decimal(0)
    deltas: CounterDeltas = {}

    def add(kid: str | None, period: str, spent: Decimal, held: Decimal) -> None:
        s, r = deltas.get((kid, period), (zero, zero))
        deltas[(kid, period)] = (s + spent, r + held)

    key = record.key_id
    if reserved != 0:
        add(None, reserved_period, zero, -reserved)
        if key_held and key is not None:
            add(key, reserved_period, zero, -reserved)
    if record.billed_cost != 0:
        add(None, record.period, record.billed_cost, zero)
        if key_held and key is not None:
            add(key, record.period, record.billed_cost, zero)
    return deltas


MODEL_FAMILIES = ("opus", "sonnet", "haiku")


def model_family(model: str | None) -> str:
    """A model id as a low-cardinality label or dimension value (docs/observability.md):
    claude-opus-4-5-20251101 → `claude-opus`; `claude-other`, `scripted`, `other`, or `none` (the
    turn never reached a model)."""
    if not model:
        return "none"
    name = model.lower()
    if name.startswith("scripted"):
        return "scripted"
    if name.startswith("claude"):
        return next((f"claude-{f}" for f in MODEL_FAMILIES if f in name), "claude-other")
    return "other"


def period_of(ms: int) -> str:
    """The UTC calendar month of an epoch-ms time: `2026-11`."""
    return time.strftime("%Y-%m", time.gmtime(ms / 1000))


def minute_of(ms: int) -> int:
    return ms // 60_000
