"""Usage exports: the usage ledger's records as FOCUS 1.0 CSV (FinOps Open Cost and Usage Specification)
and as JSON Lines. Pure functions: records in, text out. Money is Decimal, never float.

Granularity
-----------
One row per record per charged token class. An LLM call (`kind` "llm") gives up to four rows, one for each
of its input, output, cache-read and cache-write tokens that is not zero (a call without any token still
gives one input row, so that every record appears and the sums hold). A container-tier turn's sandbox time
(`kind` "sandbox") gives one row in seconds, at no cost (users pay tokens).

A record's `list_cost` and `billed_cost` are split over its rows in proportion to each class's list price
(tokens × price per million): every row but the dearest is rounded down to 1e-8 USD and the dearest row
takes the remainder, so the rows of a record sum exactly to its costs and no row is negative. The file's
ListCost column therefore sums exactly to the records' `list_cost`, BilledCost to their `billed_cost`.

Columns (FOCUS 1.0, all 43; empty field = null)
------------------------------------------------
=========================== ===================================================================================
Column                      Value
=========================== ===================================================================================
AvailabilityZone            null
BilledCost                  the row's share of the record's `billed_cost` (list × markup), 1e-8 USD
BillingAccountId            the tenant id
BillingAccountName          the tenant's display name from `display_names`, else the tenant id
BillingCurrency             the record's currency ("USD")
BillingPeriodEnd            first instant of the next month, `2026-12-01T00:00:00Z` (exclusive)
BillingPeriodStart          first instant of `billing_period`, `2026-11-01T00:00:00Z`
ChargeCategory              "Usage"
ChargeClass                 null (no corrections)
ChargeDescription           e.g. "claude-sonnet-4-5 input tokens (Anthropic) at 3.0 USD per 1M tokens list price";
                            a configured provider's model by its upstream name: "gpt-4o-mini input tokens (oa) at …"
ChargeFrequency             "Usage-Based"
ChargePeriodEnd             the record's `ended_at` rounded up to the second (at least start + 1 s)
ChargePeriodStart           the record's `started_at` rounded down to the second, not before the billing period
CommitmentDiscountCategory  null
CommitmentDiscountId        null
CommitmentDiscountName      null
CommitmentDiscountStatus    null
CommitmentDiscountType      null
ConsumedQuantity            tokens of the row's class; sandbox: seconds (ms / 1000)
ConsumedUnit                "Tokens"; sandbox: "Seconds"
ContractedCost              = BilledCost (AgentVM's price is the list price × markup; no other discount)
ContractedUnitPrice         ListUnitPrice × the markup the record was billed at (its `prices`; else `markup`)
EffectiveCost               = BilledCost (nothing to amortize)
InvoiceIssuerName           "AgentVM"
ListCost                    the row's share of the record's `list_cost` (the model vendor's list price)
ListUnitPrice               USD per PricingUnit: the list price the call was billed at (the record's `prices`,
                            kept at settle time); a record without them (written before they were kept) from
                            `prices` (money.DEFAULT_PRICES); sandbox: 0
PricingCategory             "Standard"
PricingQuantity             tokens / 1,000,000; sandbox: seconds
PricingUnit                 "1000000 Tokens" (the price table is per million tokens); sandbox: "Seconds"
ProviderName                "AgentVM" (resells the model calls)
PublisherName               the model's vendor: "Anthropic" for provider "anthropic" ("OpenAI", "Amazon Bedrock",
                            "DeepSeek" for providers so named; else the configured provider's name); AgentVM
                            for the sandbox
RegionId                    null
RegionName                  null
ResourceId                  the session id
ResourceName                the session's display name from `display_names`, else null (ids are not names)
ResourceType                "Session"
ServiceCategory             "AI and Machine Learning"; sandbox: "Compute"
ServiceName                 "AgentVM LLM"; sandbox: "AgentVM Sandbox"
SkuId                       `<provider>/<price family>/<class>`: `anthropic/claude-sonnet-4/input`, `/output`,
                            `/cache-read`, `/cache-write`; a configured provider's model `<provider>/<model>/
                            <class>` (`oa/gpt-4o-mini/input`); sandbox: `agentvm/sandbox/container-time`
SkuPriceId                  SkuId + "/standard" (no amounts or dates in it: stable across periods)
SubAccountId                the container id
SubAccountName              the container's display name from `display_names`, else null
Tags                        JSON object of provider-defined tags, keys prefixed `agentvm/` as FOCUS requires:
                            tenant, container, image, session, turn, record, model, tier, key, status,
                            and `agentvm/usage-estimated: "true"` on a record whose output tokens are an
                            estimate (docs/billing.md; a null model or key is left out)
=========================== ===================================================================================

Decimals are plain fixed-point text that always holds a decimal point (`3.0`, `0.0012`, `0.00315000`), so that
readers never infer an integer column; date/times are ISO 8601 UTC with seconds and `Z`.

The official validator (focus_validator 1.0.0, `--validate-version 1.0`) still checks five columns under their
pre-1.0 names: Provider, Publisher, InvoiceIssuer and ResourceID (1.0 renamed them ProviderName, PublisherName,
InvoiceIssuerName and ResourceId), and ChargeType (now ChargeCategory) in its SkuPriceId rule.
`validator_aliases=True` appends those five columns, holding the same values as their 1.0 columns. They are off
by default: a file with both ResourceId and ResourceID breaks case-insensitive readers (SQL engines, Spark), and
FOCUS allows no custom column without the `x_` prefix. tests/billing validates both forms.
"""

from __future__ import annotations

import calendar
import csv
import io
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_DOWN, Decimal

import orjson

from agentvm.domain.usage import UsageRecord
from agentvm.money import COST_QUANTUM, DEFAULT_MARKUP, DEFAULT_PRICES, MILLION, ModelPrice, price_for

Row = dict[str, str | None]

FOCUS_VERSION = "1.0"
FOCUS_COLUMNS: tuple[str, ...] = (
    "AvailabilityZone", "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency",
    "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory", "ChargeClass", "ChargeDescription",
    "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart", "CommitmentDiscountCategory",
    "CommitmentDiscountId", "CommitmentDiscountName", "CommitmentDiscountStatus", "CommitmentDiscountType",
    "ConsumedQuantity", "ConsumedUnit", "ContractedCost", "ContractedUnitPrice", "EffectiveCost",
    "InvoiceIssuerName", "ListCost", "ListUnitPrice", "PricingCategory", "PricingQuantity", "PricingUnit",
    "ProviderName", "PublisherName", "RegionId", "RegionName", "ResourceId", "ResourceName", "ResourceType",
    "ServiceCategory", "ServiceName", "SkuId", "SkuPriceId", "SubAccountId", "SubAccountName", "Tags",
)
# focus_validator 1.0.0's "1.0" rules still use these pre-1.0 names (ChargeType in SkuPriceId's rule): alias
# -> FOCUS 1.0 column.
VALIDATOR_ALIASES: dict[str, str] = {
    "ChargeType": "ChargeCategory", "InvoiceIssuer": "InvoiceIssuerName", "Provider": "ProviderName",
    "Publisher": "PublisherName", "ResourceID": "ResourceId",
}

AGENTVM = "AgentVM"
TAG_PREFIX = "agentvm/"
TOKEN_UNIT = "Tokens"
TOKEN_PRICING_UNIT = "1000000 Tokens"  # UnitFormat `<unit-quantity> <plural-units>`: prices are per million
SECONDS = "Seconds"
SANDBOX_SKU = "agentvm/sandbox/container-time"
_PUBLISHERS = {"anthropic": "Anthropic", "scripted": AGENTVM, "agentvm": AGENTVM, "openai": "OpenAI",
               "bedrock": "Amazon Bedrock", "deepseek": "DeepSeek"}


@dataclass(frozen=True, slots=True)
class _Part:
    """One row's share of a record: what was consumed, how it is priced, and its weight in the split."""

    label: str  # "input", "output", "cache-read", "cache-write", "sandbox"
    consumed: Decimal
    consumed_unit: str
    pricing_quantity: Decimal
    pricing_unit: str
    unit_price: Decimal
    sku_id: str
    description: str

    @property
    def weight(self) -> Decimal:
        return self.pricing_quantity * self.unit_price


def focus_rows(records: Iterable[UsageRecord], *, billing_period: str,
               prices: Mapping[str, ModelPrice] | None = None, markup: Decimal = DEFAULT_MARKUP,
               display_names: Mapping[str, str] | None = None, validator_aliases: bool = False) -> list[Row]:
    """The FOCUS 1.0 rows of `records`, all charged in `billing_period` (`2026-11`; a record charged in
    another month is an error, never dropped silently): column -> text, None for null. Rows are ordered
    by tenant, charge time and record id. `display_names` maps tenant, container and session ids to
    display names; `markup` only sets ContractedUnitPrice (the costs are the records')."""
    period_start, period_end = _period_bounds(billing_period)
    table = dict(DEFAULT_PRICES if prices is None else prices)
    names = display_names or {}
    rows: list[Row] = []
    for record in sorted(records, key=lambda r: (r.tenant_id, r.ended_at, r.record_id)):
        rows.extend(_record_rows(record, billing_period, (period_start, period_end), table, markup, names,
                                 validator_aliases))
    return rows


def _record_rows(record: UsageRecord, billing_period: str, bounds: tuple[int, int], table: dict[str, ModelPrice],
                 markup: Decimal, names: Mapping[str, str], validator_aliases: bool) -> list[Row]:
    """The FOCUS rows of one record (see `focus_rows`)."""
    period_start, period_end = bounds
    period_start_iso, period_end_iso = _iso(period_start), _iso(period_end)
    rows: list[Row] = []
    if record.period != billing_period:
        raise ValueError(f"usage record {record.record_id} is charged in {record.period}, "
                         f"not in the billing period {billing_period}")
    parts = _parts(record, table)
    if record.prices is not None:
        markup = record.prices.markup  # the markup the call was billed at
    list_costs = _split(record.list_cost, parts)
    billed_costs = _split(record.billed_cost, parts)
    start_s = max(record.started_at // 1000, period_start)
    end_s = min(max(-(-record.ended_at // 1000), start_s + 1), period_end)
    tags = _tags(record)
    for part, list_cost, billed in zip(parts, list_costs, billed_costs, strict=True):
        row: Row = {
            "AvailabilityZone": None,
            "BilledCost": _num(billed),
            "BillingAccountId": record.tenant_id,
            "BillingAccountName": names.get(record.tenant_id, record.tenant_id),
            "BillingCurrency": record.currency,
            "BillingPeriodEnd": period_end_iso,
            "BillingPeriodStart": period_start_iso,
            "ChargeCategory": "Usage",
            "ChargeClass": None,
            "ChargeDescription": part.description,
            "ChargeFrequency": "Usage-Based",
            "ChargePeriodEnd": _iso(end_s),
            "ChargePeriodStart": _iso(start_s),
            "CommitmentDiscountCategory": None,
            "CommitmentDiscountId": None,
            "CommitmentDiscountName": None,
            "CommitmentDiscountStatus": None,
            "CommitmentDiscountType": None,
            "ConsumedQuantity": _num(part.consumed),
            "ConsumedUnit": part.consumed_unit,
            "ContractedCost": _num(billed),
            "ContractedUnitPrice": _num(part.unit_price * markup),
            "EffectiveCost": _num(billed),
            "InvoiceIssuerName": AGENTVM,
            "ListCost": _num(list_cost),
            "ListUnitPrice": _num(part.unit_price),
            "PricingCategory": "Standard",
            "PricingQuantity": _num(part.pricing_quantity),
            "PricingUnit": part.pricing_unit,
            "ProviderName": AGENTVM,
            "PublisherName": _publisher(record),
            "RegionId": None,
            "RegionName": None,
            "ResourceId": record.session_id,
            "ResourceName": names.get(record.session_id),
            "ResourceType": "Session",
            "ServiceCategory": "Compute" if record.kind == "sandbox" else "AI and Machine Learning",
            "ServiceName": "AgentVM Sandbox" if record.kind == "sandbox" else "AgentVM LLM",
            "SkuId": part.sku_id,
            "SkuPriceId": f"{part.sku_id}/standard",
            "SubAccountId": record.container_id,
            "SubAccountName": names.get(record.container_id),
            "Tags": tags,
        }
        if validator_aliases:
            for alias, column in VALIDATOR_ALIASES.items():
                row[alias] = row[column]
        rows.append(row)
    return rows


def focus_csv(records: Iterable[UsageRecord], *, billing_period: str,
              prices: Mapping[str, ModelPrice] | None = None, markup: Decimal = DEFAULT_MARKUP,
              display_names: Mapping[str, str] | None = None, validator_aliases: bool = False) -> str:
    """`records` as a FOCUS 1.0 CSV document (header first, `\\n` line ends, empty field = null); see the
    module docstring for the columns and `focus_rows` for the arguments."""
    columns = list(FOCUS_COLUMNS) + (list(VALIDATOR_ALIASES) if validator_aliases else [])
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in focus_rows(records, billing_period=billing_period, prices=prices, markup=markup,
                          display_names=display_names, validator_aliases=validator_aliases):
        writer.writerow(["" if row[c] is None else row[c] for c in columns])
    return out.getvalue()


class FocusCsvWriter:
    """FOCUS 1.0 CSV one record at a time, for exports too large to hold (the scheduled export streams them
    into a multipart upload): the same columns and text as `focus_csv`, rows in the order given."""

    def __init__(self, *, billing_period: str, prices: Mapping[str, ModelPrice] | None = None,
                 markup: Decimal = DEFAULT_MARKUP, display_names: Mapping[str, str] | None = None,
                 validator_aliases: bool = False) -> None:
        self.billing_period = billing_period
        self._bounds = _period_bounds(billing_period)
        self._table = dict(DEFAULT_PRICES if prices is None else prices)
        self._markup = markup
        self._names = display_names or {}
        self._aliases = validator_aliases
        self.columns = list(FOCUS_COLUMNS) + (list(VALIDATOR_ALIASES) if validator_aliases else [])
        self._out = io.StringIO()
        self._csv = csv.writer(self._out, lineterminator="\n")

    def header(self) -> str:
        return self._line(self.columns)

    def rows(self, record: UsageRecord) -> tuple[str, list[Row]]:
        """The record's CSV lines and its rows (the caller sums or counts them)."""
        rows = _record_rows(record, self.billing_period, self._bounds, self._table, self._markup, self._names,
                            self._aliases)
        for row in rows:
            self._csv.writerow(["" if row[c] is None else row[c] for c in self.columns])
        text = self._out.getvalue()
        self._out.seek(0)
        self._out.truncate()
        return text, rows

    def _line(self, values: list[str]) -> str:
        self._csv.writerow(values)
        text = self._out.getvalue()
        self._out.seek(0)
        self._out.truncate()
        return text


def usage_jsonl(records: Iterable[UsageRecord]) -> str:
    """One `UsageRecord.to_wire()` JSON object per line, in the given order (empty text for none)."""
    return "".join(orjson.dumps(record.to_wire()).decode() + "\n" for record in records)


# --- helpers ------------------------------------------------------------------------------------------


def _parts(record: UsageRecord, table: dict[str, ModelPrice]) -> list[_Part]:
    if record.kind == "sandbox":
        seconds = Decimal(record.sandbox_ms) / 1000
        return [_Part("sandbox", seconds, SECONDS, seconds, SECONDS, Decimal(0), SANDBOX_SKU,
                      "Container sandbox time of a turn (included: users pay tokens)")]
    if record.kind != "llm":
        raise ValueError(f"usage record {record.record_id} has an unknown kind {record.kind!r}")
    model = record.model or "unknown"
    family = _price_family(model, table)
    price = price_for(model, table) if table else ModelPrice(Decimal(0), Decimal(0), Decimal(0), Decimal(0))
    if record.prices is not None:
        # the prices the call was billed at (not the table's, nor today's configuration)
        p = record.prices
        price = ModelPrice(p.input, p.output, p.cache_write, p.cache_read)
        if model.startswith(f"{record.provider}/"):
            # a configured provider's model (its catalog id `provider/model`): SkuId provider/model/class
            model = family = model[len(record.provider) + 1:]
    usage = record.usage
    classes = [
        ("input", usage.input_tokens, price.input),
        ("output", usage.output_tokens, price.output),
        ("cache-read", usage.cache_read_tokens, price.cache_read),
        ("cache-write", usage.cache_write_tokens, price.cache_write),
    ]
    charged = [c for c in classes if c[1]] or classes[:1]
    vendor = _publisher(record)
    failed = "" if record.status == "completed" else f", {record.status} call"
    return [
        _Part(label, Decimal(tokens), TOKEN_UNIT, Decimal(tokens) / MILLION, TOKEN_PRICING_UNIT, unit_price,
              f"{record.provider}/{family}/{label}",
              f"{model} {label} tokens ({vendor}) at {_num(unit_price)} USD per 1M tokens list price{failed}")
        for label, tokens, unit_price in charged
    ]


def _split(amount: Decimal, parts: list[_Part]) -> list[Decimal]:
    """`amount` over `parts` in proportion to their weights, to 1e-8: all but the heaviest part (the last
    of equals) rounded down, the heaviest takes the remainder; the shares sum exactly to `amount`."""
    weights = [p.weight for p in parts]
    total = sum(weights, Decimal(0))
    heaviest = max(range(len(parts)), key=lambda i: (weights[i], i))
    shares = [Decimal(0).quantize(COST_QUANTUM)] * len(parts)
    if total:
        for i, weight in enumerate(weights):
            if i != heaviest:
                shares[i] = (amount * weight / total).quantize(COST_QUANTUM, rounding=ROUND_DOWN)
    rest = amount - sum(shares, Decimal(0))
    # Written to 1e-8 at least, but never rounded: the shares must sum to `amount` exactly.
    shares[heaviest] = rest.quantize(COST_QUANTUM) if rest == rest.quantize(COST_QUANTUM) else rest
    return shares


def _price_family(model: str, table: Mapping[str, ModelPrice]) -> str:
    """The price table key that prices `model` (the longest prefix, as money.price_for), else the model."""
    keys = [k for k in table if model.startswith(k)]
    return max(keys, key=len) if keys else model


def _publisher(record: UsageRecord) -> str:
    if record.kind == "sandbox":
        return AGENTVM
    return _PUBLISHERS.get(record.provider, record.provider)


def _tags(record: UsageRecord) -> str:
    values = {
        "tenant": record.tenant_id, "container": record.container_id, "image": record.image_id,
        "session": record.session_id, "turn": record.turn_id, "record": record.record_id,
        "model": record.model, "tier": record.tier, "key": record.key_id, "status": record.status,
    }
    tags = {TAG_PREFIX + k: v for k, v in values.items() if v is not None}
    if record.estimated:
        tags[TAG_PREFIX + "usage-estimated"] = "true"
    return orjson.dumps(tags, option=orjson.OPT_SORT_KEYS).decode()


def _period_bounds(billing_period: str) -> tuple[int, int]:
    """Epoch seconds of the first instant of the month `YYYY-MM` and of the next month."""
    try:
        year_text, month_text = billing_period.split("-")
        year, month = int(year_text), int(month_text)
        if len(year_text) != 4 or len(month_text) != 2 or not 1 <= month <= 12:
            raise ValueError
    except ValueError:
        raise ValueError(f"billing period {billing_period!r} is not a month like 2026-11") from None
    next_year, next_month = (year + 1, 1) if month == 12 else (year, month + 1)
    return _epoch(year, month), _epoch(next_year, next_month)


def _epoch(year: int, month: int) -> int:
    return calendar.timegm((year, month, 1, 0, 0, 0, 0, 0, 0))


def _iso(epoch_s: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


def _num(value: Decimal) -> str:
    """Plain fixed-point text with a decimal point (`3.0`, `0.0012`): never `1E-7`, never integer-looking."""
    text = format(value, "f")
    return text if "." in text else text + ".0"
