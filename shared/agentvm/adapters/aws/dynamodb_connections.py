"""The ConnectionRegistry port in the AgentVM table (beside the Store's items).

| Entity       | PK                 | SK              | TTL        |
|--------------|--------------------|-----------------|------------|
| Connection   | WSCONN#{conn}      | CONN            | expires_at |
| Subscription | SUBS#{t}#{sid}     | CONN#{conn}     | expires_at |
|   (reverse)  | WSCONN#{conn}      | SUB#{t}#{sid}   | expires_at |
| Watch        | WATCH#{t}#{cid}    | CONN#{conn}     | expires_at |
|   (reverse)  | WSCONN#{conn}      | WATCH#{t}#{cid} | expires_at |

A session's subscribers and a container's watchers are one Query each; the reverse items let
`$disconnect` remove everything of a connection with one Query and one batch, and `$default` read
the connection with what it already subscribes to and watches in one Query (so a repeated
subscription costs no write). Every item expires
shortly after API Gateway's 2-hour connection cap, so a missed `$disconnect` leaves nothing behind.
A connection accepted without credentials is stored with `auth_pending` and an empty tenant until its
first-frame `auth` sets both (`authenticate`, conditional: the first `auth` frame wins). A connection
that asked for batched frames (`?frames=batch`) has `frames = "batch"` on its record and on each of its
subscription items, so the fan-out of `chat_turn` knows it from the one Query of the subscribers.

**Tenant scope** (`tenant_scope`: the container task, whose credentials reach only its tenant's keys,
adapters/aws/tenant_scope.py): the `WSCONN#` items are another tenant's as much as anyone's (a
worker that could write `WSCONN#{conn}` / `CONN` could give its own connection another tenant), so a
scoped registry never reads or writes them. It writes a subscription's `SUBS#` item only (the
reverse item exists already: `ws_default` wrote it when the connection subscribed), and for a gone
connection it deletes the `SUBS#` items of the sessions it saw the connection in; `$disconnect` and
the TTL remove the rest. Anything else that needs `WSCONN#` raises.
"""

from __future__ import annotations

import time
from typing import Any

from botocore.exceptions import ClientError

from agentvm.adapters.aws.dynamodb_items import TTL_ATTRIBUTE, _k, _n, _s
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.domain.models import ConnectionRecord, Subscription

CONNECTION_TTL_S = 2 * 3600 + 600


class DynamoDBConnections:
    def __init__(self, store: DynamoDBStore, *, ttl_s: int = CONNECTION_TTL_S, tenant_scope: str | None = None) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.tenant_scope = tenant_scope
        self._seen: dict[str, set[str]] = {}  # scoped: connection id → SUBS# partitions it was found in

    def _scoped(self, tenant_id: str | None, what: str) -> bool:
        """True in tenant scope (and `tenant_id` must be the scope's); False when unscoped."""
        if self.tenant_scope is None:
            return False
        if tenant_id != self.tenant_scope:
            raise PermissionError(f"a registry scoped to one tenant cannot {what}")
        return True

    def _expires(self) -> dict[str, str]:
        return _n(int(time.time()) + self.ttl_s)

    async def _put_all(self, items: list[dict[str, Any]]) -> None:
        requests: list[Any] = [{"PutRequest": {"Item": i}} for i in items]
        await self.store.client.batch_write_item(RequestItems={self.store.table_name: requests})

    async def put_connection(self, record: ConnectionRecord) -> None:
        self._scoped(None, "store connection records")
        item: dict[str, Any] = {"PK": _s(f"WSCONN#{_k(record.connection_id)}"), "SK": _s("CONN"),
                                "tenant_id": _s(record.tenant_id), "connected_at": _n(record.connected_at),
                                TTL_ATTRIBUTE: self._expires()}
        if record.key_id is not None:
            item["key_id"] = _s(record.key_id)
        if not record.authenticated:
            item["auth_pending"] = {"BOOL": True}
        if record.batch:
            item["frames"] = _s("batch")
        await self.store.client.put_item(TableName=self.store.table_name, Item=item)

    async def authenticate(self, connection_id: str, tenant_id: str, key_id: str | None) -> bool:
        """Give a connection accepted without credentials its principal (a first `auth` frame). False
        when the connection is gone or was authenticated already (the first `auth` frame wins)."""
        self._scoped(None, "authenticate connections")
        update = "SET tenant_id = :t REMOVE auth_pending" if key_id is None else \
            "SET tenant_id = :t, key_id = :k REMOVE auth_pending"
        values: dict[str, Any] = {":t": _s(tenant_id), ":yes": {"BOOL": True}}
        if key_id is not None:
            values[":k"] = _s(key_id)
        try:
            await self.store.client.update_item(
                TableName=self.store.table_name, Key={"PK": _s(f"WSCONN#{_k(connection_id)}"), "SK": _s("CONN")},
                UpdateExpression=update, ConditionExpression="auth_pending = :yes", ExpressionAttributeValues=values)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise
        return True

    async def get_connection(self, connection_id: str) -> ConnectionRecord | None:
        """The record with what the connection subscribes to and watches: one Query of its partition."""
        self._scoped(None, "read connection records")
        items = await self._query(f"WSCONN#{_k(connection_id)}")
        record = next((i for i in items if i["SK"]["S"] == "CONN"), None)
        if record is None:
            return None
        key = record.get("key_id")
        sessions = frozenset(i["session_id"]["S"] for i in items if "session_id" in i)
        containers = frozenset(i["container_id"]["S"] for i in items if "container_id" in i)
        pending = record.get("auth_pending", {}).get("BOOL", False)
        return ConnectionRecord(connection_id, record["tenant_id"]["S"], key["S"] if key else None,
                                int(record["connected_at"]["N"]), sessions, containers, authenticated=not pending,
                                batch=record.get("frames", {}).get("S") == "batch")

    async def delete_connection(self, connection_id: str) -> None:
        client, table = self.store.client, self.store.table_name
        if self.tenant_scope is not None:
            conn = _s(f"CONN#{_k(connection_id)}")
            scoped: list[Any] = [{"DeleteRequest": {"Key": {"PK": _s(pk), "SK": conn}}}
                                 for pk in sorted(self._seen.pop(connection_id, set()))]
            for start in range(0, len(scoped), 25):
                await client.batch_write_item(RequestItems={table: scoped[start:start + 25]})
            return
        pk = f"WSCONN#{_k(connection_id)}"
        res = await client.query(TableName=table, KeyConditionExpression="PK = :pk",
                                 ExpressionAttributeValues={":pk": _s(pk)}, ProjectionExpression="PK, SK")
        keys: list[dict[str, Any]] = []
        for item in res.get("Items", []):
            keys.append({"PK": item["PK"], "SK": item["SK"]})
            sk = item["SK"]["S"]
            if sk.startswith("SUB#"):
                keys.append({"PK": _s("SUBS#" + sk[len("SUB#"):]), "SK": _s(f"CONN#{_k(connection_id)}")})
            elif sk.startswith("WATCH#"):
                keys.append({"PK": _s(sk), "SK": _s(f"CONN#{_k(connection_id)}")})
        for start in range(0, len(keys), 25):
            chunk: list[Any] = [{"DeleteRequest": {"Key": k}} for k in keys[start:start + 25]]
            await client.batch_write_item(RequestItems={table: chunk})

    async def put_subscription(self, tenant_id: str, session_id: str, sub: Subscription) -> None:
        scope = f"{_k(tenant_id)}#{_k(session_id)}"
        conn = _k(sub.connection_id)
        expires = self._expires()
        forward = {"PK": _s(f"SUBS#{scope}"), "SK": _s(f"CONN#{conn}"), "connection_id": _s(sub.connection_id),
                   "after_seq": _n(sub.after_seq), "replayed_seq": _n(sub.replayed_seq),
                   "pending": {"BOOL": sub.pending}, "since_seq": _n(sub.since_seq), TTL_ATTRIBUTE: expires}
        if sub.batch:
            forward["frames"] = _s("batch")
        if self._scoped(tenant_id, "subscribe for another tenant"):
            self._seen.setdefault(sub.connection_id, set()).add(f"SUBS#{scope}")
            await self.store.client.put_item(TableName=self.store.table_name, Item=forward)
            return
        await self._put_all([
            forward,
            {"PK": _s(f"WSCONN#{conn}"), "SK": _s(f"SUB#{scope}"), "session_id": _s(session_id),
             TTL_ATTRIBUTE: expires},
        ])

    async def subscribers(self, tenant_id: str, session_id: str, *, consistent: bool = True) -> list[Subscription]:
        pk = f"SUBS#{_k(tenant_id)}#{_k(session_id)}"
        items = await self._query(pk, consistent=consistent)
        if self._scoped(tenant_id, "read another tenant's subscribers"):
            for i in items:
                self._seen.setdefault(i["connection_id"]["S"], set()).add(pk)
        return [Subscription(i["connection_id"]["S"], int(i["after_seq"]["N"]), int(i["replayed_seq"]["N"]),
                             bool(i["pending"]["BOOL"]), int(i["since_seq"]["N"]) if "since_seq" in i else 0,
                             batch=i.get("frames", {}).get("S") == "batch")
                for i in items]

    async def watch(self, tenant_id: str, container_id: str, connection_id: str) -> None:
        scope = f"WATCH#{_k(tenant_id)}#{_k(container_id)}"
        conn = _k(connection_id)
        expires = self._expires()
        if self._scoped(tenant_id, "watch for another tenant"):
            await self.store.client.put_item(TableName=self.store.table_name, Item={
                "PK": _s(scope), "SK": _s(f"CONN#{conn}"), "connection_id": _s(connection_id), TTL_ATTRIBUTE: expires})
            return
        await self._put_all([
            {"PK": _s(scope), "SK": _s(f"CONN#{conn}"), "connection_id": _s(connection_id), TTL_ATTRIBUTE: expires},
            {"PK": _s(f"WSCONN#{conn}"), "SK": _s(scope), "container_id": _s(container_id), TTL_ATTRIBUTE: expires},
        ])

    async def watchers(self, tenant_id: str, container_id: str) -> list[str]:
        self._scoped(tenant_id, "read another tenant's watchers")
        items = await self._query(f"WATCH#{_k(tenant_id)}#{_k(container_id)}")
        return [i["connection_id"]["S"] for i in items]

    async def _query(self, pk: str, *, consistent: bool = True) -> list[dict[str, Any]]:
        client, table = self.store.client, self.store.table_name
        now = time.time()
        out: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"TableName": table, "KeyConditionExpression": "PK = :pk",
                                  "ExpressionAttributeValues": {":pk": _s(pk)}, "ConsistentRead": consistent}
        while True:
            res = await client.query(**kwargs)
            out.extend(i for i in res.get("Items", []) if int(i[TTL_ATTRIBUTE]["N"]) > now)
            last = res.get("LastEvaluatedKey")
            if not last:
                return out
            kwargs["ExclusiveStartKey"] = last
