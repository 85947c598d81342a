"""`avm keys create|list|revoke`: API keys of a deployment, written straight to its key store: the
local database of `avm serve` (`--data-dir`, default $AVM_DATA_DIR or ~/.agentvm) or, with
`--table` (or $AVM_TABLE_NAME), the cloud tier's DynamoDB table. This is how an operator makes a
tenant's first key; with an admin key, a tenant manages its own keys over `/v1/auth/keys`.

Keys are stored only as salted hashes; the token is printed once.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from agentvm.errors import InvalidRequest

if TYPE_CHECKING:
    from agentvm.ports import KeyStore

DAY_MS = 86_400_000


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("keys", help="API keys of avm serve or of a cloud deployment")
    actions = p.add_subparsers(dest="keys_command", required=True)
    c = actions.add_parser("create", help="issue a key; the token is shown once")
    c.add_argument("--tenant", required=True, help="tenant the key belongs to")
    c.add_argument("--scope", action="append", choices=["user", "admin"], help="repeatable; default: user")
    c.add_argument("--name", help="a label to recognise the key by")
    c.add_argument("--expires-days", type=int, help="expire after this many days (default: never)")
    ls = actions.add_parser("list", help="a tenant's keys (no secrets)")
    ls.add_argument("--tenant", required=True)
    r = actions.add_parser("revoke", help="revoke a key of a tenant")
    r.add_argument("--tenant", required=True)
    r.add_argument("key_id", metavar="KEY_ID")
    for action in (c, ls, r):
        action.add_argument("--table", help="a cloud deployment's DynamoDB table (default: $AVM_TABLE_NAME; stack "
                                            "output TableName); without it, the local database")
        action.add_argument("--data-dir", type=Path, help="avm serve's data directory (default: $AVM_DATA_DIR)")


@contextlib.asynccontextmanager
async def _key_store(args: argparse.Namespace) -> AsyncIterator[tuple[KeyStore, str]]:
    from agentvm.config import Settings

    settings = Settings()
    table = args.table or settings.table_name
    if table:
        try:
            from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
            from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
        except ImportError:
            raise InvalidRequest("the AWS client libraries are missing: pip install 'agentvm[aws]'",
                                 field="table") from None
        store = DynamoDBStore(table, endpoint_url=settings.aws_endpoint_url, region_name=settings.aws_region)
        await store.open()
        try:
            yield DynamoDBKeys(store), "cloud"
        finally:
            await store.close()
        return
    from agentvm.adapters.local.sqlite_keys import SqliteKeys
    from agentvm.adapters.local.sqlite_store import SqliteStore

    data_dir = args.data_dir or settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    local = SqliteStore(data_dir / "agentvm.db")
    await local.open()
    try:
        yield SqliteKeys(local), "local"
    finally:
        await local.close()


async def run_keys(args: argparse.Namespace) -> int:
    from agentvm.auth.api_keys import new_key
    from agentvm.services.keys import key_wire

    now = int(time.time() * 1000)
    if args.keys_command == "create" and args.expires_days is not None and args.expires_days <= 0:
        raise InvalidRequest("keys create: --expires-days: must be a positive number of days", field="expires_days")
    async with _key_store(args) as (keys, where):
        if args.keys_command == "create":
            expires = None if args.expires_days is None else now + args.expires_days * DAY_MS
            key, token = new_key(args.tenant, tuple(args.scope or ["user"]), name=args.name, expires_at=expires)
            await keys.put_key(key)
            print(f"key id: {key.key_id}  tenant: {key.tenant_id}  scopes: {','.join(key.scopes)}")
            print(f"token (shown once, keep it secret): {token}")
            if where == "cloud":
                print(f"connect: wss://<WebSocketUrl>?token={token}  (or the header `Authorization: Bearer <token>`)")
            else:
                print("use: `Authorization: Bearer <token>` on HTTP, the same header or ?token= on the WebSocket")
            return 0
        if args.keys_command == "list":
            for key in await keys.list_keys(args.tenant):
                w = key_wire(key, now)
                print(f"{w['keyId']}  {w['status']:<8} {','.join(w['scopes']):<11} {w['name'] or '-'}")
            return 0
        if not await keys.revoke_key(args.tenant, args.key_id, now):
            print(f"avm keys: API key not found: {args.key_id} (tenant {args.tenant})", file=sys.stderr)
            return 1
        print(f"revoked {args.key_id}")
        return 0
