"""`avm usage export|show` and `avm budgets set|list|delete`: the usage ledger and budgets. Against a
running server (the default: `--url`, `--token`) they are the key's tenant's, over `/v1/usage` and
`/v1/budgets`; with `--data-dir` or `--table` they are read and written straight in the store, for
any `--tenant` (see avm/deployment.py). There, `avm usage export` without `--tenant` exports every
tenant: the operator's file for finance tools (FOCUS 1.0 CSV)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from agentvm.domain.usage import Budget
from agentvm.errors import InvalidRequest
from agentvm.services.billing import FORMATS, GROUPS, BillingService, window
from agentvm.services.keys import Caller
from agentvm_client.management import ManagementClient
from avm.deployment import add_target_args, open_deployment, refuse_tenant, require_tenant, target
from avm.server_call import over_server

TENANT_HELP = "the tenant (with --data-dir or --table; a server: your key's tenant)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    u = sub.add_parser("usage", help="usage records of a deployment: exports (FOCUS 1.0, JSON lines), totals")
    actions = u.add_subparsers(dest="usage_command", required=True)
    e = actions.add_parser("export", help="a period's usage as a FOCUS 1.0 CSV or JSON lines file")
    e.add_argument("--period", required=True, help="a month (2026-11) or a day (2026-11-05), UTC")
    e.add_argument("--format", choices=FORMATS, default="focus")
    e.add_argument("--out", type=Path, help="file to write (default: standard output)")
    e.add_argument("--tenant", help="one tenant (with --data-dir or --table; default: every tenant; a server: "
                                    "your key's tenant)")
    s = actions.add_parser("show", help="a tenant's usage totals of a period, grouped")
    s.add_argument("--tenant", help=TENANT_HELP)
    s.add_argument("--period", required=True, help="a month (2026-11) or a day (2026-11-05), UTC")
    s.add_argument("--group-by", default="model", help=f"comma-separated: {', '.join(GROUPS)}")
    b = sub.add_parser("budgets", help="monthly budgets and rate limits of tenants and keys")
    bactions = b.add_subparsers(dest="budgets_command", required=True)
    bs = bactions.add_parser("set", help="set a tenant's (or one key's) monthly budget and/or turns per minute")
    bs.add_argument("--tenant", help=TENANT_HELP)
    bs.add_argument("--key", help="one key of the tenant (default: the tenant's own budget)")
    bs.add_argument("--monthly", help="billed USD per calendar month (UTC), e.g. 25.00")
    bs.add_argument("--rpm", type=int, help="turns started per minute")
    bl = bactions.add_parser("list", help="a tenant's budgets with this month's spend")
    bl.add_argument("--tenant", help=TENANT_HELP)
    bd = bactions.add_parser("delete", help="remove a tenant's (or one key's) budget")
    bd.add_argument("--tenant", help=TENANT_HELP)
    bd.add_argument("--key")
    for action in (e, s, bs, bl, bd):
        add_target_args(action)


def _exported(args: argparse.Namespace, text: str, whose: str) -> int:
    if args.out is None:
        sys.stdout.write(text)
        return 0
    args.out.write_text(text, encoding="utf-8")
    rows = max(0, text.count("\n") - 1) if args.format == "focus" else text.count("\n")
    print(f"wrote {args.out} ({rows} rows, {args.format}, {args.period}, {whose})")
    return 0


def _groups(args: argparse.Namespace) -> list[str]:
    return [g.strip() for g in args.group_by.split(",") if g.strip()]


async def run_usage(args: argparse.Namespace) -> int:
    if target(args) == "server":
        refuse_tenant(args, f"usage {args.usage_command}")
        window(args.period)  # a bad period: the same one line as on a store, before any request

        async def work(avm: ManagementClient) -> int:
            if args.usage_command == "export":
                return _exported(args, await avm.billing.export(args.period, args.format), "your tenant")
            report = await avm.billing.usage(period=args.period, group_by=",".join(_groups(args)))
            print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
            return 0
        return await over_server(args, "usage", work, local=True, timeout=300)
    if args.usage_command == "show":
        require_tenant(args, "usage show")
    async with open_deployment(args) as d:
        billing = BillingService(d.ledger, d.keys)
        if args.usage_command == "export":
            _media, text = await billing.export(args.tenant, args.period, args.format)
            return _exported(args, text, f"tenant {args.tenant}" if args.tenant else "every tenant")
        w = window(args.period)
        report = await billing.usage(args.tenant, since_ms=w.since_ms, until_ms=w.until_ms, group_by=_groups(args))
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
        return 0


async def run_budgets(args: argparse.Namespace) -> int:
    if args.budgets_command == "set" and args.rpm is not None and args.rpm < 1:
        raise InvalidRequest("budgets set: --rpm: must be a positive number of turns", field="rpm")
    if target(args) == "server":
        refuse_tenant(args, f"budgets {args.budgets_command}")
        return await over_server(args, "budgets", _budgets_over_http(args), local=True)
    tenant = require_tenant(args, f"budgets {args.budgets_command}")
    async with open_deployment(args, create=args.budgets_command == "set") as d:
        operator = Caller(tenant, admin=True)
        billing = BillingService(d.ledger, d.keys)
        if args.budgets_command == "set":
            b: Budget = await billing.set_budget(operator, key_id=args.key, monthly=args.monthly,
                                                 requests_per_minute=args.rpm)
            print(_line(b.key_id, b.monthly, b.requests_per_minute))
            print("running servers apply it within 30 s")
            return 0
        if args.budgets_command == "delete":
            await billing.delete_budget(operator, args.key)
            print(f"deleted the budget of {'key ' + args.key if args.key else 'tenant ' + tenant}")
            return 0
        _report(f"tenant {tenant}", await billing.budgets(operator))
        return 0


def _budgets_over_http(args: argparse.Namespace) -> Callable[[ManagementClient], Awaitable[int]]:
    async def work(avm: ManagementClient) -> int:
        if args.budgets_command == "set":
            b = await avm.billing.set_budget(key_id=args.key, monthly=args.monthly, requests_per_minute=args.rpm)
            print(_line(b["keyId"], b["monthlyBudget"], b["requestsPerMinute"]))
            print("running servers apply it within 30 s")
        elif args.budgets_command == "delete":
            await avm.billing.delete_budget(args.key)
            print(f"deleted the budget of {'key ' + args.key if args.key else 'your tenant'}")
        else:
            _report("your tenant", await avm.billing.budgets())
        return 0
    return work


def _report(whose: str, report: dict[str, Any]) -> None:
    print(f"{whose}  {report['period']}: spent {report['spent']} USD, reserved {report['reserved']} USD")
    for row in report["budgets"]:
        print(_line(row["keyId"], row["monthlyBudget"], row["requestsPerMinute"]) + f"  spent {row['spent']}")


def _line(key_id: str | None, monthly: Decimal | str | None, rpm: int | None) -> str:
    who = f"key {key_id}" if key_id else "tenant"
    amount = "-" if monthly is None else f"{monthly} USD/month"
    return f"{who}: {amount}, {rpm if rpm is not None else '-'} turns/min"
