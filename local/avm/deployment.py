"""Where the operator's commands (`avm keys`, `avm usage`, `avm budgets`) act: a running server over
its HTTP API (`--url`/`--token`, default $AVM_URL/$AVM_TOKEN: the tenant of the key), the local
database of `avm serve` (only with `--data-dir` given: never a default, and a command that only reads
never creates one), or, with `--table` (or $AVM_TABLE_NAME), the cloud tier's DynamoDB table."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from agentvm.errors import InvalidRequest
from avm.runner import Args, complete_dir
from avm.server_args import F, server_options

if TYPE_CHECKING:
    from agentvm.ports import KeyStore, UsageLedger

DB_NAME = "agentvm.db"
TENANT_HELP = "the tenant (with --data-dir or --table; a server: your key's tenant)"


def tenant_option(command: F) -> F:
    return click.option("--tenant", help=TENANT_HELP)(command)


def target_options(command: F) -> F:
    command = click.option("--data-dir", type=click.Path(path_type=Path), metavar="DIR", shell_complete=complete_dir,
                           help="avm serve's data directory: read its database directly (without it: the server "
                                "of --url)")(command)
    command = click.option("--table", metavar="TABLE",
                           help="a cloud deployment's DynamoDB table (default: $AVM_TABLE_NAME; stack output "
                                "TableName), written directly")(command)
    return server_options(command)


def target(args: Args) -> str:
    """"cloud" (a table), "local" (an explicit --data-dir) or "server" (everything else)."""
    from agentvm.config import Settings

    if args.table or Settings().table_name:
        return "cloud"
    return "local" if args.data_dir is not None else "server"


def require_tenant(args: Args, command: str) -> str:
    if not args.tenant:
        raise InvalidRequest(f"{command}: --tenant: required with --data-dir or --table (which tenant)",
                             field="tenant")
    return str(args.tenant)


def refuse_tenant(args: Args, command: str) -> None:
    """A server answers for its caller's tenant only: a `--tenant` there would be silently ignored."""
    if getattr(args, "tenant", None):
        raise InvalidRequest(f"{command}: --tenant: a server answers for the tenant of your key (--token); "
                             "another tenant's: --data-dir DIR (avm serve's database) or --table TABLE",
                             field="tenant")


def local_database(data_dir: Path, *, create: bool) -> Path:
    """`data_dir`'s database; InvalidRequest when there is none and `create` is false."""
    if not (data_dir / DB_NAME).is_file():
        if not create:
            raise InvalidRequest(f"--data-dir {data_dir}: no database there ({DB_NAME}); give the directory "
                                 "avm serve was started with (its --data-dir, default ~/.agentvm)", field="data_dir")
        if data_dir.exists() and not data_dir.is_dir():
            raise InvalidRequest(f"--data-dir {data_dir}: not a directory", field="data_dir")
        data_dir.mkdir(parents=True, exist_ok=True)
    return data_dir / DB_NAME


@dataclass(slots=True)
class Deployment:
    where: str  # "local" or "cloud"
    keys: KeyStore
    ledger: UsageLedger


@contextlib.asynccontextmanager
async def open_deployment(args: Args, *, create: bool = False) -> AsyncIterator[Deployment]:
    """The store of `--table` or of the explicit `--data-dir`; `create`: a command that writes may
    create the database (a first key before the first `avm serve`), one that only reads may not."""
    from agentvm.config import Settings

    settings = Settings()
    table = args.table or settings.table_name
    if table:
        try:
            from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
            from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
            from agentvm.adapters.aws.dynamodb_usage import DynamoDBUsageLedger
        except ImportError:
            raise InvalidRequest("the AWS client libraries are missing: pip install 'agentvm[aws]'",
                                 field="table") from None
        store = DynamoDBStore(table, endpoint_url=settings.aws_endpoint_url, region_name=settings.aws_region)
        await store.open()
        try:
            yield Deployment("cloud", DynamoDBKeys(store), DynamoDBUsageLedger(store))
        finally:
            await store.close()
        return
    from agentvm.adapters.local.sqlite_keys import SqliteKeys
    from agentvm.adapters.local.sqlite_store import SqliteStore
    from agentvm.adapters.local.sqlite_usage import SqliteUsageLedger

    if args.data_dir is None:  # callers choose the server first; never a default directory
        raise InvalidRequest("--data-dir: required to read a local database", field="data_dir")
    local = SqliteStore(local_database(args.data_dir, create=create))
    await local.open()
    try:
        yield Deployment("local", SqliteKeys(local), SqliteUsageLedger(local))
    finally:
        await local.close()
