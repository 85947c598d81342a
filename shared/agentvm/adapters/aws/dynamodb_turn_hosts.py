"""The TurnHostDirectory port on the AgentVM table.

| Item       | PK         | SK            | attributes                                            |
|------------|------------|---------------|-------------------------------------------------------|
| Turn host  | TURNHOST   | HOST#{id}     | until (ms), capacity, running, accepting, expires_at  |
|            |            |               | + address, port, token (a host with its own front)    |

A host writes its item at start, on every heartbeat and whenever it starts or stops accepting (one
PutItem, one write unit); it deletes it when it drains. A host killed without a word leaves its item:
`until` says for how long it still counts (dispatchers check it), the table's TTL (`expires_at`, an
hour later) removes it. Listing is one eventually consistent Query of the one partition (half a read
unit for up to 8 hosts); `ws_default` caches it (hosting/turn_tiers.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentvm.adapters.aws.dynamodb_items import TTL_ATTRIBUTE, _int, _k, _key, _n, _s
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.domain.turn_hosts import TurnHostRecord

PK = "TURNHOST"
_TTL_AFTER_S = 3600


class DynamoDBTurnHosts:
    def __init__(self, store: DynamoDBStore) -> None:
        self.store = store

    async def heartbeat(self, host: TurnHostRecord) -> None:
        item = {**_key(PK, f"HOST#{_k(host.host_id)}"), "host_id": _s(host.host_id), "until": _n(host.until_ms),
                "capacity": _n(host.capacity), "running": _n(host.running), "accepting": {"BOOL": host.accepting},
                TTL_ATTRIBUTE: _n(host.until_ms // 1000 + _TTL_AFTER_S)}
        if host.address:
            item.update(address=_s(host.address), port=_n(host.port), token=_s(host.token))
        await self.store.client.put_item(TableName=self.store.table_name, Item=item)

    async def deregister(self, host_id: str) -> None:
        await self.store.client.delete_item(TableName=self.store.table_name, Key=_key(PK, f"HOST#{_k(host_id)}"))

    async def list_hosts(self) -> list[TurnHostRecord]:
        items = await self.store._query(KeyConditionExpression="PK = :pk", ConsistentRead=False,
                                        ExpressionAttributeValues={":pk": _s(PK)})
        return [TurnHostRecord(i["host_id"]["S"], _int(i, "until"), _int(i, "capacity"), _int(i, "running"),
                               bool(i.get("accepting", {}).get("BOOL")), i.get("address", {}).get("S", ""),
                               int(i.get("port", {}).get("N", "0")), i.get("token", {}).get("S", "")) for i in items]


if TYPE_CHECKING:
    from agentvm.ports import TurnHostDirectory

    def _implements_port(directory: DynamoDBTurnHosts) -> TurnHostDirectory:  # mypy checks the port's signatures
        return directory
