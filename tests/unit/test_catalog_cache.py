"""The config center reuses the token API's catalog for a moment (services/config.py, CATALOG_CACHE_S):
a change made through it applies to the next call at once, one made behind its back (another process
writing the same store) once the moment has passed, and the layers are not read again meanwhile."""

from __future__ import annotations

from decimal import Decimal

import orjson

from agentvm.config import Settings
from agentvm.domain.models import ConfigChange
from agentvm.services.config import CATALOG_CACHE_S, ConfigService, from_settings

ENTRY = {"deepseek": {"type": "openai", "baseUrl": "https://api.deepseek.com/v1", "apiKeyEnv": "DEEPSEEK_KEY",
                      "models": {"deepseek-chat": {"input": "0.27", "output": "1.10", "cacheRead": "0.07",
                                                   "cacheWrite": "0.27"}}}}


class CountingStore:
    """A `ConfigStore` in memory that counts the reads of its runtime layer."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.reads = 0

    async def runtime_values(self) -> dict[str, str]:
        self.reads += 1
        return dict(self.values)

    async def set_value(self, key: str, value_json: str | None, *, secret: bool, change: ConfigChange) -> None:
        if value_json is None:
            self.values.pop(key, None)
        else:
            self.values[key] = value_json

    async def changes(self, limit: int = 100) -> list[ConfigChange]:
        return []


class NoEnv:
    async def get(self, name: str) -> str | None:
        return None

    async def get_all(self, prefix: str = "") -> dict[str, str]:
        return {}


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def service(store: CountingStore, clock: Clock) -> ConfigService:
    config = from_settings(Settings(), store, NoEnv(), file=None)
    config._clock = clock  # the one clock of this test (from_settings takes none)
    return config


async def ids(config: ConfigService, *, anthropic: bool = False) -> list[str]:
    catalog, _ = await config.catalog(anthropic=anthropic)
    return [m.id for m in catalog.listed()]


async def test_the_catalog_is_read_once_within_the_cache_time() -> None:
    store, clock = CountingStore(), Clock()
    config = service(store, clock)
    assert await ids(config) == ["scripted/echo"]
    assert store.reads == 1
    for _ in range(5):
        clock.now += CATALOG_CACHE_S / 10
        assert await ids(config) == ["scripted/echo"]
    assert store.reads == 1
    # another key (an Anthropic key configured) is its own entry
    assert (await ids(config, anthropic=True))[0] == "anthropic/claude-opus-4-6"
    assert store.reads == 2


async def test_a_change_made_here_applies_to_the_next_call_at_once() -> None:
    store, clock = CountingStore(), Clock()
    config = service(store, clock)
    assert await ids(config) == ["scripted/echo"]
    await config.set("llm.providers", ENTRY, actor="test")
    assert await ids(config) == ["scripted/echo", "deepseek/deepseek-chat"]
    await config.set("defaults.markup", "1.2", actor="test")
    assert (await config.catalog(anthropic=False))[1] == Decimal("1.2")
    await config.unset("llm.providers", actor="test")
    assert await ids(config) == ["scripted/echo"]
    assert clock.now == 500.0  # no time passed: every change was seen through the generation, not the clock


async def test_a_change_made_elsewhere_applies_once_the_cache_time_passed() -> None:
    store, clock = CountingStore(), Clock()
    config = service(store, clock)
    assert await ids(config) == ["scripted/echo"]
    store.values["llm.providers"] = orjson.dumps(ENTRY).decode()  # another process wrote the shared store
    clock.now += CATALOG_CACHE_S * 0.9
    assert await ids(config) == ["scripted/echo"]
    clock.now += CATALOG_CACHE_S * 0.2
    assert await ids(config) == ["scripted/echo", "deepseek/deepseek-chat"]
    assert store.reads == 2
    clock.now -= 10  # a clock that went back never keeps a catalog longer
    assert await ids(config) == ["scripted/echo", "deepseek/deepseek-chat"]
    assert store.reads == 3
