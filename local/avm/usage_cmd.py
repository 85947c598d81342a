"""`avm usage export|show` and `avm budgets set|list|delete`: the usage ledger and budgets of a
deployment, read and written straight in its store (see avm/deployment.py). `avm usage export`
without `--tenant` exports every tenant: the operator's file for finance tools (FOCUS 1.0 CSV)."""

from __future__ import annotations

import argparse
import sys
from decimal import Decimal
from pathlib import Path

import orjson

from agentvm.domain.usage import Budget
from agentvm.errors import InvalidRequest
from agentvm.services.billing import FORMATS, GROUPS, BillingService, window
from agentvm.services.keys import Caller
from avm.deployment import add_target_args, open_deployment


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    u = sub.add_parser("usage", help="usage records of a deployment: exports (FOCUS 1.0, JSON lines), totals")
    actions = u.add_subparsers(dest="usage_command", required=True)
    e = actions.add_parser("export", help="a period's usage as a FOCUS 1.0 CSV or JSON lines file")
    e.add_argument("--period", required=True, help="a month (2026-11) or a day (2026-11-05), UTC")
    e.add_argument("--format", choices=FORMATS, default="focus")
    e.add_argument("--out", type=Path, help="file to write (default: standard output)")
    e.add_argument("--tenant", help="one tenant (default: every tenant)")
    s = actions.add_parser("show", help="a tenant's usage totals of a period, grouped")
    s.add_argument("--tenant", required=True)
    s.add_argument("--period", required=True, help="a month (2026-11) or a day (2026-11-05), UTC")
    s.add_argument("--group-by", default="model", help=f"comma-separated: {', '.join(GROUPS)}")
    b = sub.add_parser("budgets", help="monthly budgets and rate limits of tenants and keys")
    bactions = b.add_subparsers(dest="budgets_command", required=True)
    bs = bactions.add_parser("set", help="set a tenant's (or one key's) monthly budget and/or turns per minute")
    bs.add_argument("--tenant", required=True)
    bs.add_argument("--key", help="one key of the tenant (default: the tenant's own budget)")
    bs.add_argument("--monthly", help="billed USD per calendar month (UTC), e.g. 25.00")
    bs.add_argument("--rpm", type=int, help="turns started per minute")
    bl = bactions.add_parser("list", help="a tenant's budgets with this month's spend")
    bl.add_argument("--tenant", required=True)
    bd = bactions.add_parser("delete", help="remove a tenant's (or one key's) budget")
    bd.add_argument("--tenant", required=True)
    bd.add_argument("--key")
    for action in (e, s, bs, bl, bd):
        add_target_args(action)


async def run_usage(args: argparse.Namespace) -> int:
    async with open_deployment(args) as d:
        billing = BillingService(d.ledger, d.keys)
        if args.usage_command == "export":
            media, text = await billing.export(args.tenant, args.period, args.format)
            if args.out is None:
                sys.stdout.write(text)
            else:
                args.out.write_text(text, encoding="utf-8")
                rows = max(0, text.count("\n") - 1) if media == "text/csv" else text.count("\n")
                print(f"wrote {args.out} ({rows} rows, {args.format}, {args.period}, "
                      f"{'tenant ' + args.tenant if args.tenant else 'every tenant'})")
            return 0
        w = window(args.period)
        groups = [g.strip() for g in args.group_by.split(",") if g.strip()]
        report = await billing.usage(args.tenant, since_ms=w.since_ms, until_ms=w.until_ms, group_by=groups)
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
        return 0


async def run_budgets(args: argparse.Namespace) -> int:
    async with open_deployment(args) as d:
        operator = Caller(args.tenant, admin=True)
        billing = BillingService(d.ledger, d.keys)
        if args.budgets_command == "set":
            if args.rpm is not None and args.rpm < 1:
                raise InvalidRequest("budgets set: --rpm: must be a positive number of turns", field="rpm")
            b: Budget = await billing.set_budget(operator, key_id=args.key, monthly=args.monthly,
                                                 requests_per_minute=args.rpm)
            print(_line(b.key_id, b.monthly, b.requests_per_minute))
            print("running servers apply it within 30 s")
            return 0
        if args.budgets_command == "delete":
            await billing.delete_budget(operator, args.key)
            print(f"deleted the budget of {'key ' + args.key if args.key else 'tenant ' + args.tenant}")
            return 0
        report = await billing.budgets(operator)
        print(f"tenant {args.tenant}  {report['period']}: spent {report['spent']} USD, "
              f"reserved {report['reserved']} USD")
        for row in report["budgets"]:
            print(_line(row["keyId"], row["monthlyBudget"], row["requestsPerMinute"]) + f"  spent {row['spent']}")
        return 0


def _line(key_id: str | None, monthly: Decimal | str | None, rpm: int | None) -> str:
    who = f"key {key_id}" if key_id else "tenant"
    amount = "-" if monthly is None else f"{monthly} USD/month"
    return f"{who}: {amount}, {rpm if rpm is not None else '-'} turns/min"
