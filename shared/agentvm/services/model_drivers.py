"""The provider registry: which `Driver` serves a catalog model (services/model_catalog.py).

A composition root gives the driver factories by provider kind (`anthropic`, `openai`, `bedrock`: a
callable `(ProviderSpec, api_key) -> Driver`) and the drivers of the built-in providers (the runtime's
own Anthropic driver, the scripted driver). A configured provider's driver is made on its first call
and kept (its connection pool with it) until its base URL or key changes. Adding a driver family is
one factory in the composition roots; adding a provider of a known family is one `llm.providers`
entry in the configuration."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping

from agentvm.errors import NotConfigured
from agentvm.ports import Driver, Env
from agentvm.services.model_catalog import CatalogModel, ModelCatalog, ProviderSpec

DriverFactory = Callable[[ProviderSpec, str | None], Driver]


class ModelDrivers:
    def __init__(self, *, builtin: Mapping[str, Driver], factories: Mapping[str, DriverFactory], env: Env,
                 lazy: Mapping[str, Callable[[], Awaitable[Driver]]] | None = None) -> None:
        self._builtin = dict(builtin)
        # a built-in provider's driver made on first use (the cloud's: its key is read from a secret)
        self._lazy = dict(lazy or {})
        self._factories = dict(factories)
        self._env = env
        self._made: dict[str, tuple[str, Driver]] = {}  # provider name: (what it was made from, driver)

    @property
    def kinds(self) -> list[str]:
        return sorted(self._factories)

    async def driver_for(self, model: CatalogModel, catalog: ModelCatalog) -> Driver:
        builtin = self._builtin.get(model.provider)
        if builtin is not None:
            return builtin
        lazy = self._lazy.get(model.provider)
        if lazy is not None:
            return await lazy()
        spec = catalog.providers.get(model.provider)
        if spec is None:
            raise NotConfigured(f"model: provider {model.provider} is not configured", field="model")
        factory = self._factories.get(spec.kind)
        if factory is None:
            raise NotConfigured(f"model: provider {spec.name} is of type {spec.kind}, which this server cannot "
                                f"call (available: {', '.join(self.kinds) or 'none'})", field="model")
        key = await self._env.get(spec.api_key_env) if spec.api_key_env else None
        if spec.api_key_env and not key:
            raise NotConfigured(f"model: provider {spec.name}'s key ({spec.api_key_env}) is not set", field="model")
        # the key only as a digest: this map outlives requests
        made_from = hashlib.sha256(repr((spec, key)).encode()).hexdigest()
        known = self._made.get(spec.name)
        if known is not None and known[0] == made_from:
            return known[1]
        driver = factory(spec, key)
        self._made[spec.name] = (made_from, driver)
        return driver


def upstream_factories(*, timeout_s: float, max_retries: int, http_client: str = "httpx") -> dict[str, DriverFactory]:
    """The factories of the OpenAI-compatible and Bedrock families (docs/providers.md), the same for
    every runtime; each imports its driver when a provider of its kind is first called. `http_client`:
    the OpenAI-compatible driver's ("aiohttp" on `avm serve`, agentvm/drivers/upstream_http.py)."""

    def openai(spec: ProviderSpec, key: str | None) -> Driver:
        from agentvm.drivers.openai_compat import OpenAICompatDriver

        return OpenAICompatDriver.for_provider(spec.name, key, base_url=spec.base_url, timeout_s=timeout_s,
                                               max_retries=max_retries, http_client=http_client)

    def bedrock(spec: ProviderSpec, _key: str | None) -> Driver:
        from agentvm.drivers.bedrock_converse import BedrockConverseDriver

        # IAM credentials of the runtime (its role in the cloud): no key
        return BedrockConverseDriver(region=spec.region, name=spec.name, timeout_s=timeout_s,
                                     max_retries=max_retries)

    return {"openai": openai, "bedrock": bedrock}
