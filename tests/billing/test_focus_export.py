"""The usage export: a scripted month of usage records (three tenants, models at different prices, cache
tokens, a failed call with only input tokens, a call without tokens, sandbox time) as FOCUS 1.0 CSV, whose
cost columns sum exactly to the records' costs, and which the official FOCUS validator accepts.

The validator (focus_validator 1.0.0) is run by `tests.support.focus` (its own virtualenv `<repo>/.venv-focus`,
`make focus-validator`; `make test` builds it), whose JUnit XML report is read: every check must pass. Its "1.0"
rules still look for five pre-1.0 column names (see `agentvm.services.usage_export`): the default export is
validated with exactly those five checks overridden (and this module checks the 1.0 columns they stand for),
the export with `validator_aliases=True` with no override at all.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from random import Random

import orjson
import pytest

from agentvm.domain.models import Usage
from agentvm.domain.usage import UnitPrices, UsageRecord
from agentvm.money import cost_of
from agentvm.services.usage_export import FOCUS_COLUMNS, VALIDATOR_ALIASES, focus_csv, focus_rows, usage_jsonl
from tests.support.focus import (
    LEGACY_NAME_CHECKS,
    Report,
    assert_clean,
    finish_validator,
    start_validator,
    validator_cwd,
    write_override,
)

PERIOD = "2026-11"
SONNET = "claude-sonnet-4-5-20250929"
HAIKU = "claude-haiku-4-5-20251001"
OPUS = "claude-opus-4-1-20250805"
CENT = Decimal("0.01")
QUANTUM = Decimal("0.00000001")

# FOCUS 1.0's 43 columns, written out here rather than taken from the module under test.
FOCUS_1_0_COLUMNS = [
    "AvailabilityZone", "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency",
    "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory", "ChargeClass", "ChargeDescription",
    "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart", "CommitmentDiscountCategory",
    "CommitmentDiscountId", "CommitmentDiscountName", "CommitmentDiscountStatus", "CommitmentDiscountType",
    "ConsumedQuantity", "ConsumedUnit", "ContractedCost", "ContractedUnitPrice", "EffectiveCost",
    "InvoiceIssuerName", "ListCost", "ListUnitPrice", "PricingCategory", "PricingQuantity", "PricingUnit",
    "ProviderName", "PublisherName", "RegionId", "RegionName", "ResourceId", "ResourceName", "ResourceType",
    "ServiceCategory", "ServiceName", "SkuId", "SkuPriceId", "SubAccountId", "SubAccountName", "Tags",
]
COST_COLUMNS = ["BilledCost", "ContractedCost", "EffectiveCost", "ListCost"]
DECIMAL_COLUMNS = [*COST_COLUMNS, "ConsumedQuantity", "ContractedUnitPrice", "ListUnitPrice", "PricingQuantity"]
DATE_COLUMNS = ["BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd"]
FIXED_POINT = re.compile(r"^-?\d+\.\d+$")
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


# --- the scripted month ------------------------------------------------------------------------------


def ms(day: int, hour: int = 0, minute: int = 0, second: int = 0, milli: int = 0, month: int = 11) -> int:
    when = datetime(2026, month, day, hour, minute, second, tzinfo=UTC) + timedelta(milliseconds=milli)
    return int(when.timestamp() * 1000)


def llm(n: int, tenant: str, model: str, usage: Usage, *, start: int, duration_ms: int = 2_500,
        status: str = "completed", provider: str = "anthropic", key: str | None = None) -> UsageRecord:
    cost = cost_of(usage, model)
    return UsageRecord(
        record_id=f"turn_{n}#llm#0", tenant_id=tenant, key_id=key, container_id=f"ctr_{tenant}_{n % 2}",
        image_id=f"img_{tenant}", session_id=f"ses_{tenant}_{n % 3}", turn_id=f"turn_{n}", kind="llm",
        provider=provider, model=model, usage=usage, list_cost=cost.list, billed_cost=cost.billed,
        tier="function", status=status, started_at=start, ended_at=start + duration_ms)


def sandbox(n: int, tenant: str, *, start: int, duration_ms: int) -> UsageRecord:
    return UsageRecord(
        record_id=f"turn_{n}#sandbox", tenant_id=tenant, key_id="key_ops", container_id=f"ctr_{tenant}_0",
        image_id=f"img_{tenant}", session_id=f"ses_{tenant}_0", turn_id=f"turn_{n}", kind="sandbox",
        provider="agentvm", model=None, usage=Usage(), list_cost=Decimal(0), billed_cost=Decimal(0),
        tier="container", status="completed", started_at=start, ended_at=start + duration_ms,
        sandbox_ms=duration_ms)


# The records the tests look at one by one.
FULL = llm(1, "ten_acme", SONNET, Usage(1_234, 567, 20_480, 3_001), start=ms(3, 9, 15, 7, 250), key="key_web")
FAILED = llm(2, "ten_acme", HAIKU, Usage(input_tokens=777), start=ms(3, 9, 16), status="failed")
SANDBOX = sandbox(3, "ten_acme", start=ms(3, 9, 15, 7), duration_ms=12_345)
# Started in October, charged (ended) in November: its charge period starts with the billing period.
STRADDLING = llm(4, "ten_globex", OPUS, Usage(9_999, 1_111, 0, 0), start=ms(31, 23, 59, 58, 500, month=10))
NO_TOKENS = llm(5, "ten_globex", SONNET, Usage(), start=ms(14, 12), status="interrupted")
SCRIPTED = llm(6, "ten_initech", "scripted", Usage(50, 20), start=ms(20, 8), provider="scripted")
LAST_MOMENT = llm(7, "ten_initech", HAIKU, Usage(3, 5, 0, 11), start=ms(30, 23, 59, 58), duration_ms=1_999)
# A configured provider's model, billed at the prices kept with its record (markup 1.2): 1000 × 0.15 +
# 200 × 0.60 = 270 per million, list 0.00027, billed 0.000324.
OA_PRICES = UnitPrices(Decimal("0.15"), Decimal("0.60"), Decimal("0.15"), Decimal("0.075"), Decimal("1.2"))
PRICED = replace(llm(8, "ten_globex", "oa/gpt-4o-mini", Usage(1_000, 200), start=ms(12, 10), provider="oa"),
                 list_cost=Decimal("0.00027000"), billed_cost=Decimal("0.00032400"), prices=OA_PRICES)


def scripted_month() -> list[UsageRecord]:
    rng = Random(20261101)
    records = [FULL, FAILED, SANDBOX, STRADDLING, NO_TOKENS, SCRIPTED, LAST_MOMENT, PRICED]
    tenants = ["ten_acme", "ten_globex", "ten_initech"]
    for n in range(100, 220):
        tenant = rng.choice(tenants)
        start = ms(rng.randint(1, 30), rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59),
                   rng.randint(0, 999))
        if n % 10 == 0:
            records.append(sandbox(n, tenant, start=start, duration_ms=rng.randint(1, 600_000)))
            continue
        usage = Usage(rng.randint(1, 60_000), rng.randint(0, 8_000),
                      rng.choice([0, rng.randint(1, 200_000)]), rng.choice([0, 0, rng.randint(1, 30_000)]))
        records.append(llm(n, tenant, rng.choice([SONNET, HAIKU, SONNET, OPUS]), usage, start=start,
                           duration_ms=rng.randint(200, 90_000), key=rng.choice([None, "key_web", "key_ops"])))
    return records


RECORDS = scripted_month()


def read_csv(text: str) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text))
    return list(reader.fieldnames or []), list(reader)


def rows_of(rows: list[dict[str, str]], record: UsageRecord) -> list[dict[str, str]]:
    return [r for r in rows if json.loads(r["Tags"])["agentvm/record"] == record.record_id]


def total(values: Iterator[Decimal] | list[Decimal]) -> Decimal:
    return sum(values, Decimal(0))


@pytest.fixture(scope="module")
def export() -> tuple[list[str], list[dict[str, str]]]:
    return read_csv(focus_csv(RECORDS, billing_period=PERIOD))


# --- the CSV -----------------------------------------------------------------------------------------


def test_header_is_the_focus_1_0_column_set(export: tuple[list[str], list[dict[str, str]]]) -> None:
    header, _ = export
    assert header == FOCUS_1_0_COLUMNS == list(FOCUS_COLUMNS)
    assert len(header) == 43


def test_cost_columns_sum_exactly_to_the_records(export: tuple[list[str], list[dict[str, str]]]) -> None:
    _, rows = export
    billed = total(r.billed_cost for r in RECORDS)
    listed = total(r.list_cost for r in RECORDS)
    assert billed > 10 * CENT and billed != listed  # a month worth checking, with the markup in it
    for column, expected in [("BilledCost", billed), ("EffectiveCost", billed), ("ContractedCost", billed),
                             ("ListCost", listed)]:
        got = total(Decimal(r[column]) for r in rows)
        assert got == expected, column  # exact: to the 1e-8 and therefore to the cent
        assert got.quantize(QUANTUM) == expected.quantize(QUANTUM)
        assert got.quantize(CENT) == expected.quantize(CENT)
    # Per tenant (the invoice) and per record (every split sums back exactly).
    for tenant in {r.tenant_id for r in RECORDS}:
        assert total(Decimal(r["BilledCost"]) for r in rows if r["BillingAccountId"] == tenant) == \
            total(r.billed_cost for r in RECORDS if r.tenant_id == tenant)
    for record in RECORDS:
        mine = rows_of(rows, record)
        assert mine, record.record_id
        assert total(Decimal(r["BilledCost"]) for r in mine) == record.billed_cost, record.record_id
        assert total(Decimal(r["ListCost"]) for r in mine) == record.list_cost, record.record_id
        assert all(Decimal(r[c]) >= 0 for r in mine for c in COST_COLUMNS)


def test_one_row_per_charged_token_class(export: tuple[list[str], list[dict[str, str]]]) -> None:
    _, rows = export
    full = rows_of(rows, FULL)
    assert [r["SkuId"] for r in full] == [f"anthropic/claude-sonnet-4/{c}"
                                          for c in ("input", "output", "cache-read", "cache-write")]
    assert [r["ConsumedQuantity"] for r in full] == ["1234.0", "567.0", "20480.0", "3001.0"]
    assert [r["PricingQuantity"] for r in full] == ["0.001234", "0.000567", "0.02048", "0.003001"]
    assert [r["ListUnitPrice"] for r in full] == ["3.0", "15.0", "0.30", "3.75"]
    assert [r["ContractedUnitPrice"] for r in full] == ["3.15", "15.75", "0.3150", "3.9375"]
    assert {r["ConsumedUnit"] for r in full} == {"Tokens"}
    assert {r["PricingUnit"] for r in full} == {"1000000 Tokens"}
    assert {r["SkuPriceId"] for r in full} == {r["SkuId"] + "/standard" for r in full}

    [failed] = rows_of(rows, FAILED)  # only input tokens: one row
    assert failed["SkuId"] == "anthropic/claude-haiku-4/input"
    assert (failed["ConsumedQuantity"], failed["ListUnitPrice"]) == ("777.0", "1.0")
    assert Decimal(failed["BilledCost"]) == FAILED.billed_cost > 0
    assert "failed call" in failed["ChargeDescription"]

    [empty] = rows_of(rows, NO_TOKENS)  # no token at all: still one row, at no cost
    assert (empty["ConsumedQuantity"], empty["BilledCost"], empty["ListCost"]) == ("0.0", "0.00000000", "0.00000000")

    [box] = rows_of(rows, SANDBOX)
    assert (box["ConsumedQuantity"], box["ConsumedUnit"], box["PricingQuantity"], box["PricingUnit"]) == \
        ("12.345", "Seconds", "12.345", "Seconds")
    assert (box["SkuId"], box["ServiceCategory"], box["ServiceName"]) == \
        ("agentvm/sandbox/container-time", "Compute", "AgentVM Sandbox")
    assert all(Decimal(box[c]) == 0 for c in COST_COLUMNS)

    [scripted_in, _] = rows_of(rows, SCRIPTED)
    assert scripted_in["SkuId"] == "scripted/scripted/input" and scripted_in["PublisherName"] == "AgentVM"

    charged = sum(max(1, sum(1 for t in (r.usage.input_tokens, r.usage.output_tokens, r.usage.cache_read_tokens,
                                         r.usage.cache_write_tokens) if t))
                  for r in RECORDS)
    assert len(rows) == charged


def test_values_are_well_formed(export: tuple[list[str], list[dict[str, str]]]) -> None:
    _, rows = export
    for row in rows:
        for column in DECIMAL_COLUMNS:
            assert FIXED_POINT.match(row[column]), (column, row[column])
        for column in DATE_COLUMNS:
            assert ISO_UTC.match(row[column]), (column, row[column])
        assert (row["BillingPeriodStart"], row["BillingPeriodEnd"]) == ("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z")
        assert row["BillingPeriodStart"] <= row["ChargePeriodStart"] < row["ChargePeriodEnd"] <= row["BillingPeriodEnd"]
        assert (row["ChargeCategory"], row["ChargeClass"], row["ChargeFrequency"], row["PricingCategory"]) == \
            ("Usage", "", "Usage-Based", "Standard")
        assert (row["ProviderName"], row["InvoiceIssuerName"], row["BillingCurrency"]) == ("AgentVM", "AgentVM", "USD")
        assert row["ServiceCategory"] in {"AI and Machine Learning", "Compute"}
        for column in ("CommitmentDiscountCategory", "CommitmentDiscountId", "CommitmentDiscountName",
                       "CommitmentDiscountStatus", "CommitmentDiscountType", "RegionId", "RegionName",
                       "AvailabilityZone", "ResourceName", "SubAccountName"):
            assert row[column] == "", column
        # The 1.0 columns the validator checks under older names only.
        for column in ("ProviderName", "PublisherName", "InvoiceIssuerName", "ResourceId", "ChargeCategory",
                       "SkuPriceId"):
            assert row[column], column
        # ListUnitPrice × PricingQuantity gives ListCost, up to the 1e-8 roundings of the split (≤ 4 rows).
        assert abs(Decimal(row["ListUnitPrice"]) * Decimal(row["PricingQuantity"]) - Decimal(row["ListCost"])) \
            <= 4 * QUANTUM
        assert abs(Decimal(row["ContractedUnitPrice"]) * Decimal(row["PricingQuantity"])
                   - Decimal(row["ContractedCost"])) <= 4 * QUANTUM
    [first] = [r for r in rows_of(rows, FULL) if r["SkuId"].endswith("/input")]
    assert (first["ChargePeriodStart"], first["ChargePeriodEnd"]) == ("2026-11-03T09:15:07Z", "2026-11-03T09:15:10Z")
    assert {r["ChargePeriodStart"] for r in rows_of(rows, STRADDLING)} == {"2026-11-01T00:00:00Z"}
    assert {r["ChargePeriodEnd"] for r in rows_of(rows, LAST_MOMENT)} == {"2026-12-01T00:00:00Z"}


def test_accounts_resources_and_tags(export: tuple[list[str], list[dict[str, str]]]) -> None:
    _, rows = export
    full = rows_of(rows, FULL)[0]
    assert (full["BillingAccountId"], full["BillingAccountName"], full["SubAccountId"], full["ResourceId"],
            full["ResourceType"], full["PublisherName"]) == \
        ("ten_acme", "ten_acme", FULL.container_id, FULL.session_id, "Session", "Anthropic")
    assert json.loads(full["Tags"]) == {
        "agentvm/tenant": "ten_acme", "agentvm/container": FULL.container_id, "agentvm/image": "img_ten_acme",
        "agentvm/session": FULL.session_id, "agentvm/turn": "turn_1", "agentvm/record": "turn_1#llm#0",
        "agentvm/model": SONNET, "agentvm/tier": "function", "agentvm/key": "key_web", "agentvm/status": "completed",
    }
    box = json.loads(rows_of(rows, SANDBOX)[0]["Tags"])
    assert "agentvm/model" not in box and box["agentvm/tier"] == "container"
    assert "agentvm/key" not in json.loads(rows_of(rows, FAILED)[0]["Tags"])

    named = focus_rows([FULL], billing_period=PERIOD, display_names={
        "ten_acme": "Acme Corp", FULL.container_id: "support-bot", FULL.session_id: "Refund question"})
    assert {(r["BillingAccountName"], r["SubAccountName"], r["ResourceName"]) for r in named} == \
        {("Acme Corp", "support-bot", "Refund question")}


def test_tiny_costs_split_exactly_and_never_below_zero() -> None:
    """Costs of a few 1e-8 over four classes: every row is rounded down but the dearest, which takes the rest."""
    tiny = replace(FULL, usage=Usage(1, 1, 1, 1), list_cost=Decimal("0.00000002"), billed_cost=Decimal("0.00000003"))
    rows = focus_rows([tiny], billing_period=PERIOD)
    assert [str(r["SkuId"]).rsplit("/", 1)[1] for r in rows] == ["input", "output", "cache-read", "cache-write"]
    assert [r["ListCost"] for r in rows] == ["0.00000000", "0.00000002", "0.00000000", "0.00000000"]
    assert [r["BilledCost"] for r in rows] == ["0.00000000", "0.00000003", "0.00000000", "0.00000000"]


def test_validator_aliases_repeat_the_1_0_columns() -> None:
    header, rows = read_csv(focus_csv(RECORDS[:5], billing_period=PERIOD, validator_aliases=True))
    assert header == [*FOCUS_1_0_COLUMNS, "ChargeType", "InvoiceIssuer", "Provider", "Publisher", "ResourceID"]
    for row in rows:
        assert all(row[alias] == row[column] for alias, column in VALIDATOR_ALIASES.items())


def test_markup_sets_the_contracted_unit_price() -> None:
    [row] = focus_rows([FAILED], billing_period=PERIOD, markup=Decimal("1.10"))
    assert (row["ListUnitPrice"], row["ContractedUnitPrice"]) == ("1.0", "1.10")


def test_a_record_with_its_prices_is_exported_at_them_not_at_the_table() -> None:
    rows = focus_rows([PRICED], billing_period=PERIOD, markup=Decimal("1.05"))
    assert [(r["SkuId"], r["PublisherName"], r["ListUnitPrice"], r["ContractedUnitPrice"], r["PricingQuantity"],
             r["ListCost"], r["BilledCost"]) for r in rows] == [
        ("oa/gpt-4o-mini/input", "oa", "0.15", "0.180", "0.001", "0.00015000", "0.00018000"),
        ("oa/gpt-4o-mini/output", "oa", "0.60", "0.720", "0.0002", "0.00012000", "0.00014400"),
    ]
    # a record without prices (written before they were kept) is still priced from the table
    old = focus_rows([replace(PRICED, prices=None, model=HAIKU, provider="anthropic")], billing_period=PERIOD)[0]
    assert (old["ListUnitPrice"], old["SkuId"]) == ("1.0", "anthropic/claude-haiku-4/input")


def test_a_record_of_another_month_or_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="charged in 2026-10"):
        focus_csv([llm(9, "ten_acme", HAIKU, Usage(1), start=ms(15, month=10))], billing_period=PERIOD)
    with pytest.raises(ValueError, match="not a month"):
        focus_csv([], billing_period="2026-13")
    with pytest.raises(ValueError, match="unknown kind"):
        focus_csv([replace(FAILED, kind="gpu")], billing_period=PERIOD)
    assert focus_csv([], billing_period=PERIOD) == ",".join(FOCUS_1_0_COLUMNS) + "\n"


def test_jsonl_is_one_wire_record_per_line() -> None:
    text = usage_jsonl(RECORDS)
    lines = text.splitlines()
    assert text.endswith("\n") and len(lines) == len(RECORDS)
    assert [orjson.loads(line) for line in lines] == [r.to_wire() for r in RECORDS]
    assert orjson.loads(lines[0])["billedCost"] == format(FULL.billed_cost, "f")
    assert usage_jsonl([]) == ""


# --- the official validator --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def validator_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Report]:
    """The validator on three files, in parallel: the export (with the legacy-name checks overridden), the
    export with the validator's aliases (no override), and a deliberately broken export."""
    cwd = validator_cwd()
    work = tmp_path_factory.mktemp("focus")
    override = write_override(work / "legacy-names.yaml")

    aliased = focus_csv(RECORDS, billing_period=PERIOD, validator_aliases=True)
    header, rows = read_csv(aliased)
    rows[0]["ChargeFrequency"] = "Sometimes"
    rows[1]["Tags"] = "not json"
    rows[2]["BillingPeriodStart"] = "2026-11-01T00:00:00+02:00"
    broken = io.StringIO()
    writer = csv.DictWriter(broken, [c for c in header if c != "BilledCost"], extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)

    runs = {"export": (focus_csv(RECORDS, billing_period=PERIOD), override),
            "aliased": (aliased, None), "broken": (broken.getvalue(), None)}
    procs = {}
    for name, (text, override_file) in runs.items():
        data = work / f"{name}.csv"
        data.write_text(text)
        procs[name] = start_validator(data, work / f"{name}.xml", cwd=cwd, override=override_file)
    return {name: finish_validator(proc, work / f"{name}.xml") for name, proc in procs.items()}


def test_validator_accepts_the_export(validator_reports: dict[str, Report]) -> None:
    assert_clean(validator_reports["export"], skipped=LEGACY_NAME_CHECKS)


def test_validator_accepts_the_export_with_aliases_and_no_override(validator_reports: dict[str, Report]) -> None:
    assert_clean(validator_reports["aliased"])


def test_validator_failures_are_detected(validator_reports: dict[str, Report]) -> None:
    """The validator exits 0 on a broken file: the report's failed checks are what fails a test."""
    report = validator_reports["broken"]
    assert report.returncode == 0 and report.tests >= 100
    assert {"BilledCost_Required", "ChargeFrequency_Enum", "Tags_IsJSONObject",
            "BillingPeriodStart_IsDateTime"} <= report.failed, report.problems()
    with pytest.raises(AssertionError):
        assert_clean(report)
