"""The SDK-free drivers' HTTP client to the provider: one POST of a JSON body, its answer read whole or
chunk by chunk.

Two clients honour the same contract, chosen by the composition root:

- `HttpxUpstream` (the default): `httpx`, which every runtime has, the Lambda layer included;
- `AiohttpUpstream` (`avm serve`): `aiohttp`, whose C HTTP parser makes a call about 1 ms cheaper than
  httpx's pure-Python h11 (docs/benchmarks.md, token API overhead). `aiohttp` is imported when its
  first session is made, never at import: it costs ~0.3 s, which a Lambda cold start would pay.

A client (and its keep-alive pool) is made on first use and reused; a call from another event loop
(e.g. a new `asyncio.run` per Lambda invocation) gets a new one, as connections belong to their loop.
`failure(exc)` names a client's own exceptions for the drivers' error mapping: "timeout", "connection",
or None (not a transport failure).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

import httpx

if TYPE_CHECKING:
    import aiohttp

Failure = Literal["timeout", "connection"]

# The connection pool the SDK uses; idle connections are kept for 5 s (httpx's default).
MAX_CONNECTIONS = 1000
MAX_KEEPALIVE = 100
KEEPALIVE_S = 5.0


class UpstreamResponse(Protocol):
    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]: ...


class UpstreamHttp(Protocol):
    def post(self, url: str, content: bytes) -> contextlib.AbstractAsyncContextManager[UpstreamResponse]: ...

    def failure(self, exc: BaseException) -> Failure | None: ...

    async def aclose(self) -> None: ...


class _PerLoop:
    """The client of the running loop, made on first use, with these headers and timeout."""

    def __init__(self, headers: Mapping[str, str], timeout_s: float) -> None:
        self._headers = dict(headers)
        self._timeout_s = timeout_s
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _current(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # A client of a previous (finished) loop cannot be closed from here; it is dropped.
            self._client = self._make()
            self._loop = loop
        return self._client

    @property
    def client(self) -> Any:
        """The client made last (None before the first call and after `aclose`)."""
        return self._client

    def _make(self) -> Any:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close the client and its pool (a later call makes a new one). A client of another event loop
        cannot be closed from this one: it is dropped."""
        client, loop = self._client, self._loop
        self._client = self._loop = None
        if client is not None and loop is asyncio.get_running_loop():
            await self._close(client)

    async def _close(self, client: Any) -> None:
        raise NotImplementedError


class _HttpxResponse:
    __slots__ = ("_response",)

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    async def read(self) -> bytes:
        return await self._response.aread()

    def chunks(self) -> AsyncIterator[bytes]:
        return self._response.aiter_bytes()


class HttpxUpstream(_PerLoop):
    def _make(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=httpx.Timeout(self._timeout_s),
                                 limits=httpx.Limits(max_connections=MAX_CONNECTIONS,
                                                     max_keepalive_connections=MAX_KEEPALIVE,
                                                     keepalive_expiry=KEEPALIVE_S),
                                 headers=self._headers)

    async def _close(self, client: httpx.AsyncClient) -> None:
        await client.aclose()

    @contextlib.asynccontextmanager
    async def post(self, url: str, content: bytes) -> AsyncIterator[UpstreamResponse]:
        async with self._current().stream("POST", url, content=content) as response:
            yield _HttpxResponse(response)

    def failure(self, exc: BaseException) -> Failure | None:
        if isinstance(exc, httpx.TimeoutException):
            return "timeout"
        if isinstance(exc, httpx.TransportError):
            return "connection"
        return None


class _AiohttpResponse:
    __slots__ = ("_response",)

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    async def read(self) -> bytes:
        return await self._response.read()

    def chunks(self) -> AsyncIterator[bytes]:
        return self._response.content.iter_any()


class AiohttpUpstream(_PerLoop):
    """As httpx is set up: each connect and each read bounded by `timeout_s` (not the whole answer: a
    long stream goes on), proxies from the environment (HTTP(S)_PROXY, NO_PROXY), answers decompressed.
    The proxy of a URL is looked up once: aiohttp's `trust_env` reads the environment at every request
    (~0.6 ms a call here)."""

    def __init__(self, headers: Mapping[str, str], timeout_s: float) -> None:
        super().__init__(headers, timeout_s)
        self._proxies: dict[str, dict[str, Any]] = {}  # by URL: the post's proxy arguments

    def _make(self) -> aiohttp.ClientSession:
        import aiohttp

        t = self._timeout_s
        return aiohttp.ClientSession(
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(total=None, connect=t, sock_connect=t, sock_read=t),
            connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, limit_per_host=0, keepalive_timeout=KEEPALIVE_S))

    async def _close(self, client: aiohttp.ClientSession) -> None:
        await client.close()

    @contextlib.asynccontextmanager
    async def post(self, url: str, content: bytes) -> AsyncIterator[UpstreamResponse]:
        proxy = self._proxies.get(url)
        if proxy is None:
            proxy = self._proxies[url] = _env_proxy(url)
        async with self._current().post(url, data=content, **proxy) as response:
            yield _AiohttpResponse(response)

    def failure(self, exc: BaseException) -> Failure | None:
        import aiohttp

        if isinstance(exc, TimeoutError):  # aiohttp's connect and read timeouts are TimeoutErrors
            return "timeout"
        if isinstance(exc, aiohttp.ClientError):  # connection refused or reset, a cut or malformed answer
            return "connection"
        return None


def _env_proxy(url: str) -> dict[str, Any]:
    """The proxy the environment sets for `url` as aiohttp's post arguments ({}: none)."""
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        proxy, auth = get_env_proxy_for_url(URL(url))
    except LookupError:
        return {}
    return {"proxy": proxy, "proxy_auth": auth}


def upstream_http(kind: str, headers: Mapping[str, str], timeout_s: float) -> UpstreamHttp:
    """The client named `kind` ("httpx" or "aiohttp")."""
    if kind == "aiohttp":
        return AiohttpUpstream(headers, timeout_s)
    if kind == "httpx":
        return HttpxUpstream(headers, timeout_s)
    raise ValueError(f"http client: {kind!r} is not one of httpx, aiohttp")
