"""`avm keys create`: issue an API key for the cloud tier's table (its $connect checks it).

The key is stored only as a salted hash; the token is printed once. Listing, revoking and the
management API for keys come with the tenancy issue; this is what a first deployment needs.
"""

from __future__ import annotations

import argparse
import sys
import time

from agentvm.errors import InvalidRequest

DAY_MS = 86_400_000


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("keys", help="API keys of a cloud deployment")
    actions = p.add_subparsers(dest="keys_command", required=True)
    c = actions.add_parser("create", help="issue a key; the token is shown once")
    c.add_argument("--table", help="the deployment's DynamoDB table (default: $AVM_TABLE_NAME; stack output TableName)")
    c.add_argument("--tenant", required=True, help="tenant the key belongs to")
    c.add_argument("--scope", action="append", choices=["user", "admin"], help="repeatable; default: user")
    c.add_argument("--name", help="a label to recognise the key by")
    c.add_argument("--expires-days", type=int, help="expire after this many days (default: never)")


async def run_keys(args: argparse.Namespace) -> int:
    try:
        from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
        from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
    except ImportError:
        print("avm keys: the AWS client libraries are missing: pip install 'agentvm[aws]'", file=sys.stderr)
        return 2
    from agentvm.auth.api_keys import new_key
    from agentvm.config import Settings

    settings = Settings()
    table = args.table or settings.table_name
    if not table:
        raise InvalidRequest("keys create: --table: required (or set AVM_TABLE_NAME)", field="table")
    if args.expires_days is not None and args.expires_days <= 0:
        raise InvalidRequest("keys create: --expires-days: must be a positive number of days", field="expires_days")
    expires = None if args.expires_days is None else int(time.time() * 1000) + args.expires_days * DAY_MS
    key, token = new_key(args.tenant, tuple(args.scope or ["user"]), name=args.name, expires_at=expires)
    store = DynamoDBStore(table, endpoint_url=settings.aws_endpoint_url, region_name=settings.aws_region)
    await store.open()
    try:
        await DynamoDBKeys(store).put_key(key)
    finally:
        await store.close()
    print(f"key id: {key.key_id}  tenant: {key.tenant_id}  scopes: {','.join(key.scopes)}")
    print(f"token (shown once, keep it secret): {token}")
    print(f"connect: wss://<WebSocketUrl>?token={token}  (or the header `Authorization: Bearer <token>`)")
    return 0
