"""Secrets Manager secrets and SSM parameters, cached per execution environment.

A warm Lambda serves many invocations; reading the LLM key or the runtime configuration on each
one would add a network round trip (and a billed API call) to every request. Values are cached for
`ttl_s` (default 5 min, so a rotated secret or a changed parameter is picked up within that time),
and concurrent callers that miss share one in-flight request instead of each sending their own.
Failures are not cached: the next call tries again.

On top of them, the ports: `AwsEnv` (the `Env` of a deployment: the parameters under one SSM path,
where a value `secret:<arn-or-name>` stands for a Secrets Manager secret) and `SecretLLMProvider`
(the `LLMProvider`: the LLM key from a secret).

Errors are `UpstreamError`s that name the secret id or parameter path and the AWS error code, never
a value (AWS error messages are left out too, as they are not ours to vet).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

import botocore.session
import orjson
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotocoreConnectionError

from agentvm.adapters.aws.botocore_async import AsyncBotocoreClient
from agentvm.adapters.aws.clients import LazyClient
from agentvm.errors import InvalidRequest, UpstreamError

T = TypeVar("T")

#: A secret whose string is a JSON object with exactly one of these keys (and a string value)
#: yields that value, so both the plain-text form and the console's key/value form work.
ACCEPTED_JSON_KEYS: Final = ("apiKey", "api_key", "LLM_API_KEY", "ANTHROPIC_API_KEY")

_RETRYABLE_CODES: Final = frozenset({"ThrottlingException", "Throttling", "TooManyRequestsException",
                                     "TooManyUpdates", "InternalServiceError", "InternalServerError",
                                     "ServiceUnavailable"})
_SSM_PAGE: Final = 10  # GetParametersByPath's maximum page size

#: A parameter value of the form `secret:<arn-or-name>` is read from Secrets Manager.
SECRET_PREFIX: Final = "secret:"


class _TtlCache(Generic[T]):
    """Values per key for `ttl_s`; the misses for one key share a single fetch."""

    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._values: dict[str, tuple[T, float]] = {}
        self._inflight: dict[str, asyncio.Task[T]] = {}

    async def get(self, key: str, fetch: Callable[[], Awaitable[T]]) -> T:
        hit = self._values.get(key)
        if hit is not None and self._clock() - hit[1] < self._ttl_s:
            return hit[0]
        loop = asyncio.get_running_loop()
        task = self._inflight.get(key)
        if task is None or task.get_loop() is not loop:  # a task of a finished loop would never complete
            task = loop.create_task(self._load(key, fetch))
            task.add_done_callback(_consume_exception)
            self._inflight[key] = task
        # Shielded: a caller that is cancelled does not cancel the fetch the others are waiting for.
        return await asyncio.shield(task)

    async def _load(self, key: str, fetch: Callable[[], Awaitable[T]]) -> T:
        try:
            value = await fetch()
            self._values[key] = (value, self._clock())
            return value
        finally:
            if self._inflight.get(key) is asyncio.current_task():
                del self._inflight[key]


def _consume_exception(task: asyncio.Task[Any]) -> None:
    # Every waiter gets the exception; this only stops asyncio from logging it when none was left.
    if not task.cancelled():
        task.exception()


class SecretValues:
    """`get(secret_id)`: a secret's string from Secrets Manager, one GetSecretValue per `ttl_s`."""

    def __init__(self, *, session: botocore.session.Session | None = None, endpoint_url: str | None = None,
                 region_name: str | None = None, ttl_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = LazyClient("secretsmanager", session=session, endpoint_url=endpoint_url,
                                  region_name=region_name)
        self._cache: _TtlCache[str] = _TtlCache(ttl_s, clock)

    async def get(self, secret_id: str) -> str:
        """The secret's string, or the value of its single accepted JSON key (`ACCEPTED_JSON_KEYS`)."""
        if not secret_id:
            raise InvalidRequest("secret id must not be empty", field="secret_id")
        return await self._cache.get(secret_id, lambda: self._fetch(secret_id))

    async def close(self) -> None:
        await self._client.close()

    async def _fetch(self, secret_id: str) -> str:
        what = f"Secrets Manager secret {secret_id!r}"
        client = await self._client.get()
        try:
            res = await client.get_secret_value(SecretId=secret_id)
        except (ClientError, BotoCoreError) as exc:
            raise _upstream(what, exc) from None  # `from None`: AWS's own message stays out of tracebacks
        raw = res.get("SecretString")
        if not isinstance(raw, str):
            raise UpstreamError(f"{what} has no string value (binary secrets are not supported)")
        return _unwrap(raw)


class ParameterValues:
    """`get_path(path)`: every SSM parameter under a path, decrypted, one read per `ttl_s`."""

    def __init__(self, *, session: botocore.session.Session | None = None, endpoint_url: str | None = None,
                 region_name: str | None = None, ttl_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = LazyClient("ssm", session=session, endpoint_url=endpoint_url, region_name=region_name)
        self._cache: _TtlCache[dict[str, str]] = _TtlCache(ttl_s, clock)

    async def get_path(self, path: str) -> dict[str, str]:
        """Parameters under `path` (recursively), keyed relative to it: `/app/prod` + `llm/model`.

        A StringList comes back as SSM sends it, comma-separated. The result is a copy: callers may
        change it without touching the cache.
        """
        prefix = "/" + path.strip("/")
        return dict(await self._cache.get(prefix, lambda: self._fetch(prefix)))

    async def close(self) -> None:
        await self._client.close()

    async def _fetch(self, prefix: str) -> dict[str, str]:
        try:
            return await parameters_by_path(await self._client.get(), prefix)
        except (ClientError, BotoCoreError) as exc:
            raise _upstream(f"SSM parameter path {prefix!r}", exc) from None


async def parameters_by_path(client: AsyncBotocoreClient, prefix: str) -> dict[str, str]:
    """Every parameter under `prefix` (`/a/b`, or `/`), recursively and decrypted, named relative to it;
    every page. Botocore errors come through as they are."""
    kwargs: dict[str, Any] = {"Path": prefix, "Recursive": True, "WithDecryption": True, "MaxResults": _SSM_PAGE}
    strip = len(prefix.rstrip("/")) + 1
    out: dict[str, str] = {}
    while True:
        res = await client.get_parameters_by_path(**kwargs)
        for param in res.get("Parameters", []):
            out[param["Name"][strip:]] = param["Value"]
        token = res.get("NextToken")
        if not token:
            return out
        kwargs["NextToken"] = token


class AwsEnv:
    """`Env` over the SSM parameters under `path`, named relative to it (`llm/model`).

    Both caches do the work: ParameterValues reads the path once per TTL, SecretValues each secret
    once per TTL. Without `secrets`, a `secret:` value is an error rather than handed out as is."""

    def __init__(self, parameters: ParameterValues, path: str, secrets: SecretValues | None = None) -> None:
        self.parameters = parameters
        self.path = path
        self.secrets = secrets

    async def get(self, name: str) -> str | None:
        raw = (await self.parameters.get_path(self.path)).get(name)
        return None if raw is None else await self._resolve(name, raw)

    async def get_all(self, prefix: str = "") -> dict[str, str]:
        params = await self.parameters.get_path(self.path)
        names = [name for name in params if name.startswith(prefix)]
        values = await asyncio.gather(*(self._resolve(name, params[name]) for name in names))
        return dict(zip(names, values, strict=True))

    async def _resolve(self, name: str, raw: str) -> str:
        if not raw.startswith(SECRET_PREFIX):
            return raw
        if self.secrets is None:
            raise UpstreamError(f"SSM parameter {name!r} under {self.path!r} refers to a secret, "
                                "but no Secrets Manager reader is configured")
        return await self.secrets.get(raw[len(SECRET_PREFIX):])


class SecretLLMProvider:
    """`LLMProvider`: `explicit` when given (Settings.llm_api_key), else the secret `secret_id`
    (Settings.llm_secret_arn, cached by SecretValues), else None. An empty value counts as none."""

    def __init__(self, secrets: SecretValues, secret_id: str | None, explicit: str | None = None) -> None:
        self.secrets = secrets
        self.secret_id = secret_id
        self._explicit = explicit or None

    async def api_key(self) -> str | None:
        if self._explicit:
            return self._explicit
        if not self.secret_id:
            return None
        return await self.secrets.get(self.secret_id) or None


def _unwrap(raw: str) -> str:
    if not raw.lstrip().startswith("{"):
        return raw
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    if isinstance(doc, dict) and len(doc) == 1:
        ((name, value),) = doc.items()
        if name in ACCEPTED_JSON_KEYS and isinstance(value, str):
            return value
    return raw


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "")) or "UnknownError"


def upstream_error(action: str, what: str, exc: ClientError | BotoCoreError) -> UpstreamError:
    """The error without AWS's message (not ours to vet): what, the code, and whether to retry."""
    if isinstance(exc, ClientError):
        code = error_code(exc)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        return UpstreamError(f"Cannot {action} {what}: {code}", retryable=code in _RETRYABLE_CODES or status >= 500)
    # Connection failures and timeouts may pass; bad credentials or parameters will not.
    retryable = isinstance(exc, (BotocoreConnectionError, HTTPClientError))
    return UpstreamError(f"Cannot {action} {what}: {type(exc).__name__}", retryable=retryable)


def _upstream(what: str, exc: ClientError | BotoCoreError) -> UpstreamError:
    if isinstance(exc, ClientError) and error_code(exc) == "ResourceNotFoundException":
        return UpstreamError(f"{what} not found")
    return upstream_error("read", what, exc)


if TYPE_CHECKING:
    from agentvm.ports import Env, LLMProvider

    def _implements_env(env: AwsEnv) -> Env:  # mypy checks the ports' signatures
        return env

    def _implements_llm_provider(provider: SecretLLMProvider) -> LLMProvider:
        return provider
