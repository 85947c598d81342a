"""Turns on the table (`TurnLog`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentvm.adapters.aws.dynamodb_items import _UNFINISHED, SHARDS, Item, _k, _s, _ts, _turn
from agentvm.adapters.aws.dynamodb_table import GSI_TENANT, DynamoTable
from agentvm.domain.cursors import next_turn_cursor, turn_cursor
from agentvm.domain.models import Turn


class DynamoTurns(DynamoTable):
    """`TurnLog` on DynamoDB: turns live in their session's partition, found by id through GSI3."""

    async def get_turn(self, tenant_id: str, turn_id: str) -> Turn | None:
        found = await self._by_id(f"TURN#{_k(tenant_id)}#{_k(turn_id)}")
        return _turn(found) if found is not None else None

    async def list_turns(self, tenant_id: str, session_id: str) -> list[Turn]:
        items = await self._session_history(tenant_id, session_id, "TURN#", "SESS", "TURN$")  # "$" follows "#"
        turns = [_turn(i) for i in items]
        turns.sort(key=lambda t: (t.created_at, t.turn_id))
        return turns

    async def list_tenant_turns(self, tenant_id: str, *, since_ms: int | None = None, until_ms: int | None = None,
                                limit: int = 50, cursor: str | None = None) -> tuple[list[Turn], str | None]:
        before = turn_cursor(cursor)
        low = f"{_ts(since_ms or 0)}#"
        high = f"{_ts(until_ms)}#" if until_ms is not None else "~"
        if before is not None:
            high = min(high, f"{_ts(before[0])}#{_k(before[1])}")
        items: list[Item] = []
        params: dict[str, Any] = {
            "TableName": self.table_name, "IndexName": GSI_TENANT, "ScanIndexForward": False,
            "KeyConditionExpression": "G1PK = :pk AND G1SK BETWEEN :low AND :high",
            "ExpressionAttributeValues": {":pk": _s(f"TENANT#{_k(tenant_id)}#TURN"), ":low": _s(low),
                                          ":high": _s(high)}}
        while len(items) <= limit:
            resp = await self.client.query(**params, Limit=limit + 1 - len(items))
            items += [i for i in resp.get("Items", []) if i["G1SK"]["S"] != high]  # BETWEEN includes high
            if "LastEvaluatedKey" not in resp:
                break
            params["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        turns = [_turn(i) for i in items]
        return turns[:limit], (next_turn_cursor(turns[limit - 1]) if len(turns) > limit else None)

    async def list_unfinished_turns(self) -> list[Turn]:
        found = await self._sparse_keys([f"TURN#{status}#{s}" for status in _UNFINISHED for s in range(SHARDS)])
        # A lagging index may list a turn under both statuses for a moment; BatchGetItem refuses duplicates.
        keys = {(k["PK"]["S"], k["SK"]["S"]): {"PK": k["PK"], "SK": k["SK"]} for k in found}
        items = await self._batch_get(list(keys.values()))
        turns = [t for t in map(_turn, items) if t.status in _UNFINISHED]  # the index lags the table
        turns.sort(key=lambda t: (t.created_at, t.tenant_id, t.turn_id))
        return turns


if TYPE_CHECKING:
    from agentvm.ports import TurnLog

    def _implements_port(repo: DynamoTurns) -> TurnLog:  # mypy checks the port's signatures
        return repo
