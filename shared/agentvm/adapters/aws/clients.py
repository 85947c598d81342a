"""One aiobotocore client per service, created on first use and kept for the execution
environment (a Lambda container lives for many invocations)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Literal

import aioboto3
from aiobotocore.config import AioConfig

Service = Literal["apigatewaymanagementapi", "lambda", "secretsmanager", "ssm"]


class LazyClient:
    def __init__(self, service: Service, *, session: aioboto3.Session | None = None, endpoint_url: str | None = None,
                 region_name: str | None = None, config: AioConfig | None = None) -> None:
        self.service = service
        self._session = session
        self._endpoint_url = endpoint_url
        self._region_name = region_name
        self._config = config or AioConfig(connect_timeout=3, read_timeout=10, retries={"max_attempts": 2})
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                stack = contextlib.AsyncExitStack()
                session = self._session or aioboto3.Session()
                self._client = await stack.enter_async_context(session.client(
                    self.service, endpoint_url=self._endpoint_url, region_name=self._region_name,
                    config=self._config))
                self._stack = stack
        return self._client

    async def close(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()
