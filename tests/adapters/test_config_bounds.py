"""Operator input is validated like user input (issue 15, point 6): every money and limit key of the
config center refuses NaN, ±Infinity, negative, absurdly large and boolean values in every layer (a
runtime update on either config store, the environment, the config file), every numeric setting
does the same, and a bad value stored outside the API (an SSM parameter put by hand, a row written
by another version) is ignored with a warning instead of failing every turn."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import annotated_types
import botocore.session
import orjson
import pytest
from pydantic import ValidationError

from agentvm.adapters.local.local_env import ProcessEnv
from agentvm.adapters.local.sqlite_config import SqliteConfigStore
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.config import Settings
from agentvm.domain.models import ConfigChange
from agentvm.engine.runner import EngineOptions
from agentvm.errors import InvalidRequest
from agentvm.money import DEFAULT_MARKUP
from agentvm.ports import ConfigStore
from agentvm.services.config import ConfigService, from_settings
from tests.adapters.test_config_store import Clock, SsmBackend

# Every key of the config center is one or the other: a key added later must be classified here.
NUMERIC_KEYS = ("llm.maxTokens", "system.maxToolIterations", "system.streamFlushMs", "system.streamMaxFlushMs",
                "defaults.markup", "billing.prices", "llm.providers")
# keys whose numbers sit in a row of a mapping (`in_row`)
ROW_KEYS = ("billing.prices", "llm.providers")
TEXT_KEYS = ("llm.model", "llm.apiKey", "llm.baseUrl")
ENV = {"llm.maxTokens": "AVM_LLM_MAX_TOKENS", "system.maxToolIterations": "AVM_MAX_TOOL_ITERATIONS",
       "system.streamFlushMs": "AVM_STREAM_FLUSH_MS", "system.streamMaxFlushMs": "AVM_STREAM_MAX_FLUSH_MS",
       "defaults.markup": "AVM_MARKUP", "billing.prices": "AVM_PRICES", "llm.providers": "AVM_LLM_PROVIDERS"}

# as JSON values (a PUT body or a stored runtime value)
BAD_VALUES: list[Any] = ["NaN", "nan", "sNaN", "Infinity", "-Infinity", "inf", math.nan, math.inf, -math.inf,
                         -1, "-1", -0.5, 10**30, "1e30", "1E+999999", True, False, None, [], {}]
# as text (an environment variable); `{}` is where a price row puts it
BAD_TEXTS = ["NaN", "nan", "Infinity", "-Infinity", "inf", "-1", "1e30", "100000000000000000000000000000", "true"]
# as YAML scalars (the config file)
BAD_YAML = [".nan", ".inf", "-.inf", "-1", "1e30", "100000000000000000000000000000", "true", "false", "'NaN'"]


def in_row(value: Any, key: str = "billing.prices") -> dict[str, Any]:
    """`value` as the input price of a billing.prices row, or of an llm.providers model (the other prices
    valid)."""
    row = {"input": value, "output": "1", "cacheWrite": "1", "cacheRead": "1"}
    if key == "llm.providers":
        return {"deepseek": {"type": "openai", "baseUrl": "https://api.deepseek.com", "models": {"deepseek-chat": row}}}
    return {"claude-sonnet-4": row}


def service(store: ConfigStore, env: dict[str, str] | None = None, file: Path | None = None) -> ConfigService:
    settings = Settings()
    built = from_settings(settings, store, ProcessEnv(env or {}), file=file)
    built.overrides.clear()  # only what the test gives (the test process's AVM_* variables aside)
    return built


@pytest.fixture
async def sqlite_config(tmp_path: Path) -> AsyncIterator[SqliteConfigStore]:
    store = SqliteStore(tmp_path / "agentvm.db")
    await store.open()
    yield SqliteConfigStore(store)
    await store.close()


def test_every_key_is_classified() -> None:
    keys = set(service(ConfigStoreStub()).keys)
    assert keys == set(NUMERIC_KEYS) | set(TEXT_KEYS)


class ConfigStoreStub:
    """Holds runtime values only (for the checks that never reach a store)."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    async def runtime_values(self) -> dict[str, str]:
        return dict(self.values)

    async def set_value(self, key: str, value_json: str | None, *, secret: bool, change: ConfigChange) -> None:
        raise AssertionError("a refused value must not be written")

    async def changes(self, limit: int = 100) -> list[ConfigChange]:
        return []


@pytest.mark.parametrize("bad", BAD_VALUES, ids=repr)
@pytest.mark.parametrize("key", NUMERIC_KEYS)
async def test_an_update_with_a_bad_number_is_refused_naming_the_key(key: str, bad: Any,
                                                                     sqlite_config: SqliteConfigStore) -> None:
    config = service(sqlite_config)
    value = in_row(bad, key) if key in ROW_KEYS else bad
    with pytest.raises(InvalidRequest) as refused:
        await config.set(key, value, actor="test")
    assert refused.value.field == key
    assert refused.value.message.startswith(f"{key}: ")
    assert await sqlite_config.runtime_values() == {}
    assert await sqlite_config.changes() == []


@pytest.mark.parametrize("bad", BAD_TEXTS)
@pytest.mark.parametrize("key", NUMERIC_KEYS)
async def test_a_bad_environment_variable_stops_start_up_naming_it(key: str, bad: str) -> None:
    text = orjson.dumps(in_row(bad, key)).decode() if key in ROW_KEYS else bad
    config = service(ConfigStoreStub(), {ENV[key]: text})
    with pytest.raises(InvalidRequest) as refused:
        await config.check_startup()
    assert refused.value.message.startswith(f"invalid setting {key} ({ENV[key]}): ")
    assert refused.value.field == key


@pytest.mark.parametrize("bad", BAD_YAML)
@pytest.mark.parametrize("key", NUMERIC_KEYS)
async def test_a_bad_config_file_value_stops_start_up_naming_it(key: str, bad: str, tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    if key == "billing.prices":
        file.write_text(f"billing:\n  prices:\n    claude-sonnet-4:\n      input: {bad}\n      output: 1\n"
                        "      cacheWrite: 1\n      cacheRead: 1\n")
    elif key == "llm.providers":
        file.write_text(f"llm:\n  providers:\n    ds:\n      type: openai\n      baseUrl: https://x.example\n"
                        f"      models:\n        m:\n          input: {bad}\n          output: 1\n"
                        "          cacheWrite: 1\n          cacheRead: 1\n")
    else:
        section, leaf = key.split(".")
        file.write_text(f"{section}:\n  {leaf}: {bad}\n")
    with pytest.raises(InvalidRequest) as refused:
        await service(ConfigStoreStub(), file=file).check_startup()
    assert refused.value.message.startswith(f"{file}: {key}: "), refused.value.message


async def test_the_exact_reasons(sqlite_config: SqliteConfigStore) -> None:
    config = service(sqlite_config)
    cases: list[tuple[str, Any, str]] = [
        ("defaults.markup", "NaN", "defaults.markup: must be a decimal number such as 1.05"),
        ("defaults.markup", "-Infinity", "defaults.markup: must be a decimal number such as 1.05"),
        ("defaults.markup", True, "defaults.markup: must be a decimal number such as 1.05"),
        ("defaults.markup", "10.01", "defaults.markup: must be from 1 to 10 (a price multiplier)"),
        ("billing.prices", in_row("Infinity"),
         "billing.prices: claude-sonnet-4.input: must be a decimal number (USD per million tokens)"),
        ("billing.prices", in_row("1000.01"),
         "billing.prices: claude-sonnet-4.input: must be at most 1000 (USD per million tokens)"),
        ("billing.prices", in_row(-0.01), "billing.prices: claude-sonnet-4.input: must be zero or more"),
        ("system.maxToolIterations", True, "system.maxToolIterations: must be an integer from 1 to 1000"),
        ("llm.maxTokens", 4096.0, "llm.maxTokens: must be an integer from 1 to 200000"),
        ("system.streamFlushMs", "5001", "system.streamFlushMs: must be an integer from 0 to 5000"),
    ]
    for key, value, message in cases:
        with pytest.raises(InvalidRequest) as refused:
            await config.set(key, value, actor="test")
        assert refused.value.message == message
    # the bounds themselves are accepted
    assert (await config.set("defaults.markup", "10", actor="test"))["defaults.markup"]["value"] == "10"
    done = await config.set("billing.prices", in_row("1000"), actor="test")
    assert done["billing.prices"]["value"]["claude-sonnet-4"]["input"] == "1000"


# ---- values stored outside the API: ignored, never reaching a turn ------------------------------


@pytest.fixture
async def ssm_config(session: botocore.session.Session, moto_endpoint: str) -> AsyncIterator[ConfigStore]:
    backend = SsmBackend(session, moto_endpoint, Clock())
    await backend.create_table()
    yield await backend.new()
    await backend.close()


@pytest.fixture(params=["sqlite", "ssm"])
def any_config(request: pytest.FixtureRequest) -> ConfigStore:
    store: ConfigStore = request.getfixturevalue(f"{request.param}_config")
    return store


async def test_a_bad_stored_value_is_ignored_with_a_warning(any_config: ConfigStore,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    store = any_config
    hand = ConfigChange("defaults.markup", None, '"NaN"', "by hand", 1)
    await store.set_value("defaults.markup", '"NaN"', secret=False, change=hand)
    await store.set_value("billing.prices", orjson.dumps(in_row("Infinity")).decode(), secret=False,
                          change=ConfigChange("billing.prices", None, "…", "by hand", 2))
    await store.set_value("system.maxToolIterations", "true", secret=False,
                          change=ConfigChange("system.maxToolIterations", None, "true", "by hand", 3))
    config = service(store)
    with caplog.at_level(logging.WARNING, logger="agentvm.services.config"):
        options = await config.engine_options(EngineOptions(default_model="scripted", max_tokens=4096))
    assert options.markup == DEFAULT_MARKUP == Decimal("1.05")
    assert options.max_iterations == 25
    assert options.prices is not None and options.prices["claude-sonnet-4"].input == Decimal(3)
    described = await config.describe()
    assert described["defaults.markup"]["source"] == "default"
    ignored = sorted(r.__dict__["config_key"] for r in caplog.records if r.name == "agentvm.services.config")
    assert ignored == ["billing.prices", "defaults.markup", "system.maxToolIterations"]
    assert "NaN" not in caplog.text and "Infinity" not in caplog.text


# ---- Settings: every numeric field --------------------------------------------------------------


def numeric_settings() -> list[str]:
    return [name for name, f in Settings.model_fields.items() if f.annotation in (int, float)]


def test_every_numeric_setting_has_both_bounds() -> None:
    names = numeric_settings()
    assert {"port", "llm_timeout_s", "tool_timeout_s", "archive_max_bytes", "db_check_s"} <= set(names)
    for name in names:
        kinds = {type(m) for m in Settings.model_fields[name].metadata}
        assert kinds & {annotated_types.Ge, annotated_types.Gt}, f"{name}: no lower bound"
        assert kinds & {annotated_types.Le, annotated_types.Lt}, f"{name}: no upper bound"


@pytest.mark.parametrize("bad", [*BAD_TEXTS, "-inf", "1e999"])
@pytest.mark.parametrize("name", numeric_settings())
def test_a_bad_numeric_setting_is_refused_naming_it(name: str, bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"AVM_{name.upper()}", bad)
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert [e["loc"] for e in refused.value.errors()] == [(name,)]
