"""`avm budgets set|list|delete`: monthly budgets and rate limits. Against a running server (the
default: `--url`, `--token`) they are the key's tenant's, over `/v1/budgets`; with `--data-dir` or
`--table` they are read and written straight in the store, for any `--tenant` (see avm/deployment.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import click

from agentvm.domain.usage import Budget
from agentvm.errors import InvalidRequest
from agentvm.services.billing import BillingService
from agentvm.services.keys import Caller
from agentvm_client.management import ManagementClient
from avm.deployment import open_deployment, refuse_tenant, require_tenant, target, target_options, tenant_option
from avm.runner import Args, Group, run
from avm.server_call import over_server


@click.group(cls=Group, short_help="monthly budgets and rate limits of tenants and keys",
             help="Monthly budgets and turns per minute of a tenant or one of its keys. Against a server (--url, "
                  "--token; default $AVM_URL/$AVM_TOKEN): your key's tenant. With --data-dir (avm serve's "
                  "database) or --table (the cloud tier's DynamoDB table): any --tenant.")
def budgets() -> None:
    pass


@budgets.command("set", help="Set a tenant's or a key's monthly budget and/or turns per minute.")
@tenant_option
@click.option("--key", help="one key of the tenant (default: the tenant's own budget)")
@click.option("--monthly", help="billed USD per calendar month (UTC), e.g. 25.00")
@click.option("--rpm", type=int, help="turns started per minute")
@target_options
def set_(**_: Any) -> int:
    return run(run_budgets)


@budgets.command("list", help="A tenant's budgets with this month's spend.")
@tenant_option
@target_options
def list_(**_: Any) -> int:
    return run(run_budgets)


@budgets.command(help="Remove a tenant's (or one key's) budget.")
@tenant_option
@click.option("--key", help="one key of the tenant (default: the tenant's own budget)")
@target_options
def delete(**_: Any) -> int:
    return run(run_budgets)


async def run_budgets(args: Args) -> int:
    if args.action == "set" and args.rpm is not None and args.rpm < 1:
        raise InvalidRequest("budgets set: --rpm: must be a positive number of turns", field="rpm")
    if target(args) == "server":
        refuse_tenant(args, f"budgets {args.action}")
        return await over_server(args, "budgets", _budgets_over_http(args), local=True)
    tenant = require_tenant(args, f"budgets {args.action}")
    async with open_deployment(args, create=args.action == "set") as d:
        operator = Caller(tenant, admin=True)
        billing = BillingService(d.ledger, d.keys)
        if args.action == "set":
            b: Budget = await billing.set_budget(operator, key_id=args.key, monthly=args.monthly,
                                                 requests_per_minute=args.rpm)
            print(_line(b.key_id, b.monthly, b.requests_per_minute))
            print("running servers apply it within 30 s")
            return 0
        if args.action == "delete":
            await billing.delete_budget(operator, args.key)
            print(f"deleted the budget of {'key ' + args.key if args.key else 'tenant ' + tenant}")
            return 0
        _report(f"tenant {tenant}", await billing.budgets(operator))
        return 0


def _budgets_over_http(args: Args) -> Callable[[ManagementClient], Awaitable[int]]:
    async def work(avm: ManagementClient) -> int:
        if args.action == "set":
            b = await avm.billing.set_budget(key_id=args.key, monthly=args.monthly, requests_per_minute=args.rpm)
            print(_line(b["keyId"], b["monthlyBudget"], b["requestsPerMinute"]))
            print("running servers apply it within 30 s")
        elif args.action == "delete":
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
