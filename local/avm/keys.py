"""`avm keys create|list|revoke`: API keys. Against a running server (`--url`, `--token`; default
$AVM_URL/$AVM_TOKEN) they are the key's tenant's, over `/v1/auth/keys` (an admin key creates and
revokes). With `--data-dir` (avm serve's database) or `--table` (or $AVM_TABLE_NAME: the cloud
tier's DynamoDB table) they are written straight to the key store, for any `--tenant`: this is how
an operator makes a tenant's first key, and the only way to make an `operator` key.

Keys are stored only as salted hashes; the token is printed once.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from agentvm.errors import InvalidRequest
from agentvm_client.management import ManagementClient
from avm.deployment import open_deployment, refuse_tenant, require_tenant, target, target_options, tenant_option
from avm.runner import Args, Group, run
from avm.server_call import over_server

DAY_MS = 86_400_000


@click.group(cls=Group, short_help="API keys: of your tenant on a server, or of any tenant in a store",
             help="API keys. Against a server (--url, --token; default $AVM_URL/$AVM_TOKEN): your key's tenant's "
                  "(an admin key creates and revokes). With --data-dir (avm serve's database) or --table (the "
                  "cloud tier's DynamoDB table): any --tenant's, written straight to the key store; this is how "
                  "a tenant's first key is made. Keys are stored only as salted hashes; a token is shown once.")
def keys() -> None:
    pass


@keys.command(help="Issue a key; the token is shown once.")
@tenant_option
@click.option("--scope", multiple=True, type=click.Choice(["user", "admin", "operator"]),
              help="repeatable; default: user. operator: the deployment's configuration and /metrics "
                   "(with --data-dir or --table only)")
@click.option("--name", help="a label to recognise the key by")
@click.option("--expires-days", type=int, help="expire after this many days (default: never)")
@target_options
def create(**_: Any) -> int:
    return run(run_keys)


@keys.command("list", help="A tenant's keys (no secrets).")
@tenant_option
@target_options
def list_(**_: Any) -> int:
    return run(run_keys)


@keys.command(help="Revoke a key of a tenant.")
@tenant_option
@click.argument("key_id", metavar="KEY_ID")
@target_options
def revoke(**_: Any) -> int:
    return run(run_keys)


def _created(w: dict[str, Any], token: str, where: str) -> None:
    print(f"key id: {w['keyId']}  tenant: {w['tenantId']}  scopes: {','.join(w['scopes'])}")
    print(f"token (shown once, keep it secret): {token}")
    if where == "cloud":
        print(f"connect: wss://<WebSocketUrl>?token={token}  (or the header `Authorization: Bearer <token>`)")
    else:
        print("use: `Authorization: Bearer <token>` on HTTP, the same header or ?token= on the WebSocket")


def _listed(w: dict[str, Any]) -> None:
    print(f"{w['keyId']}  {w['status']:<8} {','.join(w['scopes']):<11} {w['name'] or '-'}")


async def run_keys(args: Args) -> int:
    command = f"keys {args.action}"
    if args.action == "create" and args.expires_days is not None and args.expires_days <= 0:
        raise InvalidRequest("keys create: --expires-days: must be a positive number of days", field="expires_days")
    if target(args) == "server":
        refuse_tenant(args, command)
        return await over_server(args, "keys", _over_http(args), local=True)
    return await _in_store(args, require_tenant(args, command))


def _over_http(args: Args) -> Any:
    async def work(avm: ManagementClient) -> int:
        if args.action == "create":
            body = await avm.keys.create(scopes=list(args.scope) or ["user"], name=args.name,
                                         expires_days=args.expires_days)
            _created(body, body["token"], "server")
        elif args.action == "list":
            for w in await avm.keys.list():
                _listed(w)
        else:
            await avm.keys.revoke(args.key_id)
            print(f"revoked {args.key_id}")
        return 0
    return work


async def _in_store(args: Args, tenant: str) -> int:
    from agentvm.auth.api_keys import new_key
    from agentvm.services.keys import key_wire

    now = int(time.time() * 1000)
    async with open_deployment(args, create=args.action == "create") as deployment:
        keys, where = deployment.keys, deployment.where
        if args.action == "create":
            expires = None if args.expires_days is None else now + args.expires_days * DAY_MS
            key, token = new_key(tenant, tuple(args.scope or ["user"]), name=args.name, expires_at=expires)
            await keys.put_key(key)
            _created(key_wire(key, now), token, where)
            return 0
        if args.action == "list":
            for key in await keys.list_keys(tenant):
                _listed(key_wire(key, now))
            return 0
        if not await keys.revoke_key(tenant, args.key_id, now):
            print(f"avm keys: API key not found: {args.key_id} (tenant {tenant})", file=sys.stderr)
            return 1
        print(f"revoked {args.key_id}")
        return 0
