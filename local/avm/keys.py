"""`avm keys create|list|revoke`: API keys of a deployment, written straight to its key store: the
local database of `avm serve` (`--data-dir`, default $AVM_DATA_DIR or ~/.agentvm) or, with
`--table` (or $AVM_TABLE_NAME), the cloud tier's DynamoDB table. This is how an operator makes a
tenant's first key; with an admin key, a tenant manages its own keys over `/v1/auth/keys`.

Keys are stored only as salted hashes; the token is printed once.
"""

from __future__ import annotations

import argparse
import sys
import time

from agentvm.errors import InvalidRequest
from avm.deployment import add_target_args, open_deployment

DAY_MS = 86_400_000


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("keys", help="API keys of avm serve or of a cloud deployment")
    actions = p.add_subparsers(dest="keys_command", required=True)
    c = actions.add_parser("create", help="issue a key; the token is shown once")
    c.add_argument("--tenant", required=True, help="tenant the key belongs to")
    c.add_argument("--scope", action="append", choices=["user", "admin", "operator"],
                   help="repeatable; default: user. operator: the deployment's configuration and /metrics")
    c.add_argument("--name", help="a label to recognise the key by")
    c.add_argument("--expires-days", type=int, help="expire after this many days (default: never)")
    ls = actions.add_parser("list", help="a tenant's keys (no secrets)")
    ls.add_argument("--tenant", required=True)
    r = actions.add_parser("revoke", help="revoke a key of a tenant")
    r.add_argument("--tenant", required=True)
    r.add_argument("key_id", metavar="KEY_ID")
    for action in (c, ls, r):
        add_target_args(action)


async def run_keys(args: argparse.Namespace) -> int:
    from agentvm.auth.api_keys import new_key
    from agentvm.services.keys import key_wire

    now = int(time.time() * 1000)
    if args.keys_command == "create" and args.expires_days is not None and args.expires_days <= 0:
        raise InvalidRequest("keys create: --expires-days: must be a positive number of days", field="expires_days")
    async with open_deployment(args) as deployment:
        keys, where = deployment.keys, deployment.where
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
