"""`avm usage export|show`: the usage ledger. Against a running server (the default: `--url`,
`--token`) it is the key's tenant's, over `/v1/usage`; with `--data-dir` or `--table` it is read
straight from the store, for any `--tenant` (see avm/deployment.py). There, `avm usage export` without
`--tenant` exports every tenant: the operator's file for finance tools (FOCUS 1.0 CSV)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import orjson

from agentvm.services.billing import FORMATS, GROUPS, BillingService, window
from agentvm_client.management import ManagementClient
from avm.deployment import open_deployment, refuse_tenant, require_tenant, target, target_options, tenant_option
from avm.runner import Args, Group, run
from avm.server_call import over_server

PERIOD_HELP = "a month (2026-11) or a day (2026-11-05), UTC"


@click.group(cls=Group, short_help="usage records of a deployment: exports (FOCUS 1.0, JSON lines), totals",
             help="The usage ledger. Against a server (--url, --token; default $AVM_URL/$AVM_TOKEN): your key's "
                  "tenant's. With --data-dir (avm serve's database) or --table (the cloud tier's DynamoDB "
                  "table): any --tenant's, or every tenant's export (FOCUS 1.0 CSV for finance tools).")
def usage() -> None:
    pass


@usage.command(help="A period's usage as a FOCUS 1.0 CSV or JSON lines file.")
@click.option("--period", required=True, help=PERIOD_HELP)
@click.option("--format", type=click.Choice(FORMATS), default="focus", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), help="file to write (default: standard output)")
@click.option("--tenant", help="one tenant (with --data-dir or --table; default: every tenant; a server: your key's "
                               "tenant)")
@target_options
def export(**_: Any) -> int:
    return run(run_usage)


@usage.command(help="A tenant's usage totals of a period, grouped.")
@tenant_option
@click.option("--period", required=True, help=PERIOD_HELP)
@click.option("--group-by", default="model", show_default=True, help=f"comma-separated: {', '.join(GROUPS)}")
@target_options
def show(**_: Any) -> int:
    return run(run_usage)


def _exported(args: Args, text: str, whose: str) -> int:
    if args.out is None:
        sys.stdout.write(text)
        return 0
    args.out.write_text(text, encoding="utf-8")
    rows = max(0, text.count("\n") - 1) if args.format == "focus" else text.count("\n")
    print(f"wrote {args.out} ({rows} rows, {args.format}, {args.period}, {whose})")
    return 0


def _groups(args: Args) -> list[str]:
    return [g.strip() for g in args.group_by.split(",") if g.strip()]


async def run_usage(args: Args) -> int:
    if target(args) == "server":
        refuse_tenant(args, f"usage {args.action}")
        window(args.period)  # a bad period: the same one line as on a store, before any request

        async def work(avm: ManagementClient) -> int:
            if args.action == "export":
                return _exported(args, await avm.billing.export(args.period, args.format), "your tenant")
            report = await avm.billing.usage(period=args.period, group_by=",".join(_groups(args)))
            print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
            return 0
        return await over_server(args, "usage", work, local=True, timeout=300)
    if args.action == "show":
        require_tenant(args, "usage show")
    async with open_deployment(args) as d:
        billing = BillingService(d.ledger, d.keys)
        if args.action == "export":
            _media, text = await billing.export(args.tenant, args.period, args.format)
            return _exported(args, text, f"tenant {args.tenant}" if args.tenant else "every tenant")
        w = window(args.period)
        report = await billing.usage(args.tenant, since_ms=w.since_ms, until_ms=w.until_ms, group_by=_groups(args))
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
        return 0
