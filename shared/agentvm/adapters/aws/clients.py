"""One botocore client per service, created on first use and kept for the execution environment
(a Lambda container lives for many invocations). Calls are awaitable (`botocore_async`)."""

from __future__ import annotations

from typing import Literal

import botocore.session
from botocore.config import Config

from agentvm.adapters.aws.botocore_async import AsyncBotocoreClient, new_client

Service = Literal["apigatewaymanagementapi", "ecs", "lambda", "secretsmanager", "sqs", "ssm"]


class LazyClient:
    def __init__(self, service: Service, *, session: botocore.session.Session | None = None,
                 endpoint_url: str | None = None, region_name: str | None = None,
                 config: Config | None = None) -> None:
        self.service = service
        self._session = session
        self._endpoint_url = endpoint_url
        self._region_name = region_name
        self._config = config or Config(connect_timeout=3, read_timeout=10, retries={"max_attempts": 2})
        self._client: AsyncBotocoreClient | None = None

    async def get(self) -> AsyncBotocoreClient:
        if self._client is None:
            self._client = new_client(self.service, session=self._session, endpoint_url=self._endpoint_url,
                                      region_name=self._region_name, config=self._config)
        return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()
