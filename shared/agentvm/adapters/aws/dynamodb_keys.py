"""The KeyStore port in the AgentVM table (beside the Store's items).

| Entity  | PK              | SK  | Index keys: GSI partition / sort          | TTL |
|---------|-----------------|-----|-------------------------------------------|-----|
| API key | APIKEY#{key_id} | KEY | 1: TENANT#{t}#KEY / {created}#{key_id}    | –   |

Authentication reads a key by its public id alone (one strongly consistent GetItem, so a
revocation is seen at once by the next uncached lookup); the tenant's key list goes through GSI1
like the other tenant-wide lists, newest first. Keys never expire from the table: a revoked or
expired key stays listed, so its owner can see what happened to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from agentvm.adapters.aws.dynamodb_items import _conditional_failed, _int, _k, _n, _opt_int, _opt_s, _put_opt, _s, _ts
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.dynamodb_table import GSI_TENANT
from agentvm.domain.models import ApiKey
from agentvm.errors import Conflict

_SK = "KEY"


def _pk(key_id: str) -> str:
    return f"APIKEY#{_k(key_id)}"


class DynamoDBKeys:
    def __init__(self, store: DynamoDBStore) -> None:
        self.store = store

    async def put_key(self, key: ApiKey) -> None:
        item: dict[str, Any] = {
            "PK": _s(_pk(key.key_id)), "SK": _s(_SK),
            "G1PK": _s(f"TENANT#{_k(key.tenant_id)}#KEY"), "G1SK": _s(f"{_ts(key.created_at)}#{_k(key.key_id)}"),
            "key_id": _s(key.key_id), "tenant_id": _s(key.tenant_id), "salt": _s(key.salt),
            "secret_hash": _s(key.secret_hash), "scopes": {"L": [_s(scope) for scope in key.scopes]},
            "created_at": _n(key.created_at),
        }
        _put_opt(item, "expires_at_ms", key.expires_at)  # not `expires_at`: that name is the table's TTL
        _put_opt(item, "revoked_at", key.revoked_at)
        _put_opt(item, "name", key.name)
        try:
            await self.store.client.put_item(TableName=self.store.table_name, Item=item,
                                             ConditionExpression="attribute_not_exists(PK)")
        except ClientError as exc:
            if _conditional_failed(exc):
                raise Conflict(f"API key already exists: {key.key_id}", field="key_id") from exc
            raise

    async def get_key(self, key_id: str) -> ApiKey | None:
        res = await self.store.client.get_item(TableName=self.store.table_name, ConsistentRead=True,
                                               Key={"PK": _s(_pk(key_id)), "SK": _s(_SK)})
        item = res.get("Item")
        return _api_key(item) if item else None

    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        kwargs: dict[str, Any] = {
            "TableName": self.store.table_name, "IndexName": GSI_TENANT, "KeyConditionExpression": "G1PK = :pk",
            "ExpressionAttributeValues": {":pk": _s(f"TENANT#{_k(tenant_id)}#KEY")}, "ScanIndexForward": False,
        }
        keys: list[ApiKey] = []
        while True:
            res = await self.store.client.query(**kwargs)
            keys.extend(_api_key(i) for i in res.get("Items", []) if i["tenant_id"]["S"] == tenant_id)
            last = res.get("LastEvaluatedKey")
            if not last:
                return keys
            kwargs["ExclusiveStartKey"] = last

    async def revoke_key(self, tenant_id: str, key_id: str, at_ms: int) -> bool:
        # The tenant is part of the condition: another tenant's key id fails exactly like a missing one.
        try:
            await self.store.client.update_item(
                TableName=self.store.table_name, Key={"PK": _s(_pk(key_id)), "SK": _s(_SK)},
                UpdateExpression="SET revoked_at = if_not_exists(revoked_at, :at)",
                ConditionExpression="attribute_exists(PK) AND tenant_id = :t",
                ExpressionAttributeValues={":at": _n(at_ms), ":t": _s(tenant_id)})
        except ClientError as exc:
            if _conditional_failed(exc):
                return False
            raise
        return True


def _api_key(i: Mapping[str, Any]) -> ApiKey:
    return ApiKey(key_id=i["key_id"]["S"], tenant_id=i["tenant_id"]["S"], salt=i["salt"]["S"],
                  secret_hash=i["secret_hash"]["S"], scopes=tuple(str(s["S"]) for s in i["scopes"]["L"]),
                  created_at=_int(i, "created_at"), expires_at=_opt_int(i, "expires_at_ms"),
                  revoked_at=_opt_int(i, "revoked_at"), name=_opt_s(i, "name"))


if TYPE_CHECKING:
    from agentvm.ports import KeyStore

    def _implements_key_store(keys: DynamoDBKeys) -> KeyStore:  # mypy checks the port's signatures
        return keys
