"""chat_stream's app served by uvicorn on a free port (as behind the Lambda Web Adapter), on a fresh
table of the moto endpoint, with an API key per tenant: the set-up of the cloud stream app's tests."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence

import pytest
import uvicorn

from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
from agentvm.auth.api_keys import new_key
from agentvm.cloud import runtime as cloud_runtime
from agentvm.cloud.stream_app import create_stream_app
from tests.support.servers import free_port


@contextlib.asynccontextmanager
async def stream_server(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tenants: Sequence[str]
                        ) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """Yields the app's base URL and a token per tenant."""
    monkeypatch.setenv("AVM_TABLE_NAME", f"agentvm-{uuid.uuid4().hex[:16]}")
    monkeypatch.setenv("AVM_AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AVM_WS_ENDPOINT", moto_endpoint)
    cloud_runtime.reset()
    rt = cloud_runtime.runtime()
    await rt.ready()
    await rt.store.create_table()
    tokens = {}
    for tenant in tenants:
        record, token = new_key(tenant)
        await DynamoDBKeys(rt.store).put_key(record)
        tokens[tenant] = token
    try:
        async with serving_stream_app() as url:
            yield url, tokens
    finally:
        await rt.store.close()
        cloud_runtime.reset()


@contextlib.asynccontextmanager
async def serving_stream_app() -> AsyncIterator[str]:
    """`create_stream_app()` (on the environment as it is) served by uvicorn on a free port, in this
    loop; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_stream_app(), host="127.0.0.1", port=port, lifespan="off",
                                           log_config=None, access_log=False))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.get_running_loop().create_task(server.serve())
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
