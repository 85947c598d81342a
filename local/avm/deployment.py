"""The store of a deployment for the operator's commands (`avm keys`, `avm usage`, `avm budgets`):
the local database of `avm serve` (`--data-dir`, default $AVM_DATA_DIR or ~/.agentvm) or, with
`--table` (or $AVM_TABLE_NAME), the cloud tier's DynamoDB table."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agentvm.errors import InvalidRequest

if TYPE_CHECKING:
    from agentvm.ports import KeyStore, UsageLedger


def add_target_args(action: argparse.ArgumentParser) -> None:
    action.add_argument("--table", help="a cloud deployment's DynamoDB table (default: $AVM_TABLE_NAME; stack "
                                        "output TableName); without it, the local database")
    action.add_argument("--data-dir", type=Path, help="avm serve's data directory (default: $AVM_DATA_DIR)")


@dataclass(slots=True)
class Deployment:
    where: str  # "local" or "cloud"
    keys: KeyStore
    ledger: UsageLedger


@contextlib.asynccontextmanager
async def open_deployment(args: argparse.Namespace) -> AsyncIterator[Deployment]:
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

    data_dir = args.data_dir or settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    local = SqliteStore(data_dir / "agentvm.db")
    await local.open()
    try:
        yield Deployment("local", SqliteKeys(local), SqliteUsageLedger(local))
    finally:
        await local.close()
