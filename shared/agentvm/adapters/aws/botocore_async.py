"""Awaitable botocore clients without aiobotocore.

aioboto3/aiobotocore pull in aiohttp and cost ~1.3 s of import on a Lambda cold start against
~0.2 s for botocore (docs/cloud-design.md). A plain botocore client is thread-safe; here its API
calls run on a small thread pool, so callers keep `await client.query(...)` and the event loop is
never blocked. Waiters become awaitable too; `meta` and `exceptions` pass through. As with
`asyncio.to_thread`, a call runs in the caller's context (its context variables reach botocore's
event handlers on the pool thread).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import botocore.session
from botocore.config import Config

# AWS calls wait on the network, not the CPU: a few threads serve many concurrent requests.
_THREADS = 16
_POOL = ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="aws")


def set_threads(threads: int) -> None:
    """Size the pool (and each new client's connection pool) for a process that runs many turns at
    once: a turn host makes ~2 AWS calls a second per running turn, and with 16 threads a fifth of
    them waited for one at 20 turns (docs/benchmarks.md). Call it at start-up, before any client."""
    global _THREADS, _POOL
    if threads != _THREADS:
        _POOL.shutdown(wait=False)
        _THREADS, _POOL = threads, ThreadPoolExecutor(max_workers=threads, thread_name_prefix="aws")


class _AsyncWaiter:
    def __init__(self, waiter: Any) -> None:
        self._waiter = waiter

    async def wait(self, **kwargs: Any) -> None:
        await _on_pool(functools.partial(self._waiter.wait, **kwargs))


class AsyncBotocoreClient:
    """Wraps a botocore client: `await client.<operation>(**params)` runs the call on the pool."""

    _PASSTHROUGH = frozenset({"meta", "exceptions", "can_paginate"})

    def __init__(self, client: Any) -> None:
        self.raw = client

    def get_waiter(self, name: str) -> _AsyncWaiter:
        return _AsyncWaiter(self.raw.get_waiter(name))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.raw, name)
        if name in self._PASSTHROUGH or name.startswith("_") or not callable(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await _on_pool(functools.partial(attr, *args, **kwargs))

        call.__name__ = name
        return call

    async def close(self) -> None:
        await _on_pool(self.raw.close)


async def _on_pool(call: Callable[[], Any]) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_POOL, contextvars.copy_context().run, call)


async def run_blocking(fn: Any, *args: Any) -> Any:
    """Run a blocking call (e.g. reading a response body) on the AWS pool."""
    return await _on_pool(functools.partial(fn, *args))


_CREATE_LOCK = threading.Lock()


@functools.cache
def default_session() -> botocore.session.Session:
    """The execution environment's botocore session: credentials are resolved and service models
    loaded once for every client (and event handlers registered on it see every call)."""
    return botocore.session.get_session()


def new_client(service: str, *, session: botocore.session.Session | None = None, endpoint_url: str | None = None,
               region_name: str | None = None, config: Config | None = None) -> AsyncBotocoreClient:
    """Create the client (cheap: no I/O happens until the first call)."""
    s = session or default_session()
    if _THREADS > 10:  # botocore keeps 10 connections per client by default
        pool = Config(max_pool_connections=_THREADS)
        config = pool if config is None else config.merge(pool)
    with _CREATE_LOCK:  # clients are thread-safe, creating them from one session is not
        return AsyncBotocoreClient(s.create_client(service, endpoint_url=endpoint_url, region_name=region_name,
                                                   config=config))


def dummy_session(region: str = "us-east-1") -> botocore.session.Session:
    """A session with dummy credentials (tests and moto); never reads profiles or instance metadata."""
    s = botocore.session.Session()
    s.set_credentials("testing", "testing")
    s.set_config_variable("region", region)
    return s
