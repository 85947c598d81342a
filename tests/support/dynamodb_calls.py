"""Recording the DynamoDB operations a store sends (request-count tests)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from agentvm.adapters.aws.dynamodb_store import DynamoDBStore


class Calls:
    """Records every DynamoDB operation the store's client sends, with its parameters."""

    def __init__(self, store: DynamoDBStore) -> None:
        self.log: list[tuple[str, dict[str, Any]]] = []
        store.client.meta.events.register("before-parameter-build.dynamodb", self._record)

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.log.append((model.name, dict(params)))

    def take(self) -> list[str]:
        names = [name for name, _params in self.log]
        self.log.clear()
        return names

    async def ops(self, call: Awaitable[Any]) -> list[str]:
        self.log.clear()
        await call
        return self.take()
