"""`avm usage export|show` and `avm budgets set|list|delete` on avm serve's database: the operator's
side of the ledger (the cloud table works the same through --table; the adapters share a contract)."""

from __future__ import annotations

import asyncio
import calendar
import csv
from decimal import Decimal
from pathlib import Path

import orjson
import pytest

from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.adapters.local.sqlite_usage import SqliteUsageLedger
from agentvm.domain.models import Usage
from agentvm.domain.usage import UsageRecord
from agentvm.money import cost_of
from avm.cli import main


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, "".join(f"{line}\n" for line in err.splitlines() if line.startswith("avm"))


def record(tenant: str, n: int, day: int, model: str, usage: Usage) -> UsageRecord:
    at = calendar.timegm((2026, 11, day, 9, 30, 0)) * 1000
    cost = cost_of(usage, model)
    return UsageRecord(f"turn_{n}#llm#1", tenant, None, "cont", "img", "sess", f"turn_{n}", "llm", "anthropic", model,
                       usage, cost.list, cost.billed, "function", "completed", at - 2000, at)


RECORDS = [record("acme", 1, 3, "claude-sonnet-4-5", Usage(1000, 200, 300)),
           record("acme", 2, 4, "claude-haiku-4-5", Usage(500, 50)),
           record("globex", 3, 4, "claude-sonnet-4-5", Usage(800, 80))]


async def seed(data: Path) -> None:
    store = SqliteStore(data / "agentvm.db")
    await store.open()
    try:
        for r in RECORDS:
            await SqliteUsageLedger(store).settle(r, reserved=Decimal(0), reserved_period="2026-11", key_held=False)
    finally:
        await store.close()


def test_usage_export_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    asyncio.run(seed(data))
    out_file = tmp_path / "nov.csv"
    code, out, err = cli(capsys, "usage", "export", "--period", "2026-11", "--out", str(out_file),
                         "--data-dir", str(data))
    assert (code, err) == (0, "")
    assert out == f"wrote {out_file} (7 rows, focus, 2026-11, every tenant)\n"  # 3 + 2 + 2 token classes
    rows = list(csv.DictReader(out_file.open()))
    assert {r["BillingAccountId"] for r in rows} == {"acme", "globex"}
    assert sum(Decimal(r["BilledCost"]) for r in rows) == sum(r.billed_cost for r in RECORDS)

    code, out, _ = cli(capsys, "usage", "export", "--period", "2026-11-04", "--format", "jsonl", "--tenant", "acme",
                       "--data-dir", str(data))
    assert code == 0 and [orjson.loads(line)["recordId"] for line in out.splitlines()] == ["turn_2#llm#1"]

    code, out, _ = cli(capsys, "usage", "show", "--tenant", "acme", "--period", "2026-11", "--group-by", "model,day",
                       "--data-dir", str(data))
    report = orjson.loads(out)
    assert code == 0 and [(r["model"], r["day"]) for r in report["rows"]] == [
        ("claude-haiku-4-5", "2026-11-04"), ("claude-sonnet-4-5", "2026-11-03")]
    assert Decimal(report["total"]["billedCost"]) == RECORDS[0].billed_cost + RECORDS[1].billed_cost

    code, _, err = cli(capsys, "usage", "export", "--period", "2026-1", "--data-dir", str(data))
    assert (code, err) == (2, "avm: period: must be a month (2026-11) or a day (2026-11-05)\n")
    code, _, err = cli(capsys, "usage", "show", "--tenant", "acme", "--period", "2026-11", "--group-by", "colour",
                       "--data-dir", str(data))
    assert (code, err) == (2, "avm: groupBy: unknown group 'colour'; one or more of tenant, container, model, day, "
                              "key, kind\n")


def test_budgets_set_list_delete(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    code, out, _ = cli(capsys, "budgets", "set", "--tenant", "acme", "--monthly", "25.00", "--rpm", "60",
                       "--data-dir", str(data))
    assert (code, out) == (0, "tenant: 25.00 USD/month, 60 turns/min\nrunning servers apply it within 30 s\n")
    code, _, err = cli(capsys, "budgets", "set", "--tenant", "acme", "--key", "avmk_none", "--monthly", "5",
                       "--data-dir", str(data))
    assert (code, err) == (2, "avm: API key not found: avmk_none\n")
    code, _, err = cli(capsys, "budgets", "set", "--tenant", "acme", "--monthly", "lots", "--data-dir", str(data))
    assert (code, err) == (2, 'avm: monthlyBudget: must be a decimal amount in USD, such as "25.00"\n')
    code, out, _ = cli(capsys, "budgets", "list", "--tenant", "acme", "--data-dir", str(data))
    assert code == 0 and out.splitlines()[1] == "tenant: 25.00 USD/month, 60 turns/min  spent 0"
    code, out, _ = cli(capsys, "budgets", "delete", "--tenant", "acme", "--data-dir", str(data))
    assert (code, out) == (0, "deleted the budget of tenant acme\n")
    code, _, err = cli(capsys, "budgets", "delete", "--tenant", "acme", "--data-dir", str(data))
    assert (code, err) == (2, "avm: Budget not found: this tenant\n")
