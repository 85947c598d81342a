"""The cloud composition root. One `CloudRuntime` per Lambda execution environment: clients are
created on first use and reused by every invocation; one event loop is kept for the environment
(botocore clients are loop-independent, and asyncio primitives must not hop between loops)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from typing import Any, TypeVar

from agentvm.adapters.aws.apigw_gateway import ApiGatewayGateway
from agentvm.adapters.aws.dynamodb_connections import DynamoDBConnections
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.config import Settings
from agentvm.errors import InvalidRequest

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one invocation's work on the environment's event loop."""
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    return _loop.run_until_complete(coro)


class CloudRuntime:
    def __init__(self, settings: Settings) -> None:
        if not settings.table_name:
            raise InvalidRequest("AVM_TABLE_NAME is not set: the cloud runtime needs its DynamoDB table",
                                 field="table_name")
        self.settings = settings
        self.store = DynamoDBStore(settings.table_name, endpoint_url=settings.aws_endpoint_url,
                                   region_name=settings.aws_region)
        self.registry = DynamoDBConnections(self.store)

    @functools.cached_property
    def gateway(self) -> ApiGatewayGateway:
        if not self.settings.ws_endpoint:
            raise InvalidRequest("AVM_WS_ENDPOINT is not set: cannot post to WebSocket connections",
                                 field="ws_endpoint")
        return ApiGatewayGateway(self.settings.ws_endpoint, region_name=self.settings.aws_region)

    async def ready(self) -> CloudRuntime:
        await self.store.open()
        return self


@functools.cache
def runtime() -> CloudRuntime:
    """The execution environment's runtime, built from the environment on first use."""
    return CloudRuntime(Settings())
