"""The token API's catalog, provider registry and metered gateway (services/model_catalog.py,
model_drivers.py, token_gateway.py), over the real SQLite ledger."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from agentvm.adapters.local.local_env import ProcessEnv
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.adapters.local.sqlite_usage import SqliteUsageLedger
from agentvm.api.openai_wire import to_request
from agentvm.domain.models import Principal, Usage
from agentvm.domain.usage import Budget, UsageRecord, period_of
from agentvm.drivers.base import DriverEvent, LLMRequest, MessageStart, MessageStop, TextDelta
from agentvm.drivers.scripted import ScriptedDriver
from agentvm.errors import InvalidRequest, NotConfigured, NotFound, QuotaExceeded, UpstreamError
from agentvm.ids import now_ms
from agentvm.money import DEFAULT_PRICES, ModelPrice
from agentvm.services.metering import Meter
from agentvm.services.model_catalog import ModelCatalog, ProviderSpec, build_catalog, check_providers
from agentvm.services.model_drivers import ModelDrivers
from agentvm.services.token_gateway import Billed, TokenGateway

DEEPSEEK = {"deepseek": {"type": "openai", "baseUrl": "https://api.deepseek.com/v1/", "apiKeyEnv": "DEEPSEEK_KEY",
                         "models": {"deepseek-chat": {"input": "0.27", "output": "1.10", "cacheRead": "0.07",
                                                      "cacheWrite": 0.27, "contextWindow": 64000, "maxOutput": 8192}}}}


def test_the_catalog_lists_anthropic_models_with_a_key_and_the_scripted_model_without() -> None:
    providers = check_providers(DEEPSEEK)
    keyed = build_catalog(DEFAULT_PRICES, providers, anthropic=True)
    assert [m.id for m in keyed.listed()] == [
        "anthropic/claude-opus-4-6", "anthropic/claude-opus-4-5", "anthropic/claude-sonnet-4-5",
        "anthropic/claude-haiku-4-5", "deepseek/deepseek-chat"]
    haiku = keyed.resolve("claude-haiku-4-5")  # an image's bare name: an alias
    assert haiku is not None and (haiku.id, haiku.upstream_model, haiku.price, haiku.max_output) == (
        "anthropic/claude-haiku-4-5", "claude-haiku-4-5",
        ModelPrice(Decimal(1), Decimal(5), Decimal("1.25"), Decimal("0.10")), 64_000)
    dated = keyed.resolve("anthropic/claude-sonnet-4-5-20250929")  # priced by its prefix, not listed
    assert dated is not None and not dated.listed and dated.price.output == Decimal(15)
    deepseek = keyed.resolve("deepseek/deepseek-chat")
    assert deepseek is not None and deepseek.price == ModelPrice(Decimal("0.27"), Decimal("1.10"), Decimal("0.27"),
                                                                 Decimal("0.07"))
    assert (deepseek.ledger_model, haiku.ledger_model) == ("deepseek/deepseek-chat", "claude-haiku-4-5")
    assert keyed.providers["deepseek"] == ProviderSpec("deepseek", "openai", "https://api.deepseek.com/v1",
                                                       "DEEPSEEK_KEY")
    assert keyed.resolve("scripted/echo") is None and keyed.resolve("gpt-4o") is None
    offline = build_catalog(DEFAULT_PRICES, {}, anthropic=False)
    assert [m.id for m in offline.listed()] == ["scripted/echo"]
    assert offline.resolve("scripted") == offline.resolve("scripted/echo")
    assert offline.resolve("claude-haiku-4-5") is None  # no key: no Anthropic model


@pytest.mark.parametrize(("value", "message"), [
    ({"x": {"type": "grpc", "models": {}}}, "x.type: must be one of anthropic, openai, bedrock"),
    ({"x": {"type": "openai", "baseUrl": "https://h", "apiKeyEnv": "sk-ant-api03-abc=", "models": {"m": {}}}},
     "x.apiKeyEnv: must be the name of a variable (such as OPENAI_API_KEY), not a key"),
    ({"x": {"type": "bedrock", "region": "moon", "models": {"m": {}}}}, "x.region: must be an AWS region such as "
                                                                        "us-east-1"),
    ({"x": {"type": "bedrock", "models": {}}}, "x.models: must be an object of at least one model with its prices"),
    ({"x": {"type": "bedrock", "models": {"m": {"input": "NaN", "output": 1, "cacheRead": 1, "cacheWrite": 1}}}},
     "x.models.m.input: must be from 0 to 1000 (USD per million tokens)"),
    ({"Big Co": {"type": "openai"}}, "Big Co: a provider name is lowercase letters, digits, - and _"),
    ({"agent": {"type": "openai"}}, "agent: this provider name is built in"),
    ("{not json", "must be a JSON object of providers"),
])
def test_a_bad_provider_entry_is_refused_naming_it(value: object, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        check_providers(value)
    assert str(refused.value) == message


class LiveEnv:
    """An `Env` that sees changes (ProcessEnv takes a snapshot)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    async def get(self, name: str) -> str | None:
        return self.values.get(name)

    async def get_all(self, prefix: str = "") -> dict[str, str]:
        return {k: v for k, v in self.values.items() if k.startswith(prefix)}


class Recorder:
    name = "openai"

    def __init__(self, spec: ProviderSpec, key: str | None) -> None:
        self.spec, self.key = spec, key

    async def stream(self, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
        yield MessageStart("m1", request.model, Usage(10, 1))
        yield MessageStop("end_turn", Usage(10, 2))


async def test_the_registry_makes_a_configured_providers_driver_once_per_key() -> None:
    catalog = build_catalog(DEFAULT_PRICES, check_providers(DEEPSEEK), anthropic=False)
    model = catalog.resolve("deepseek/deepseek-chat")
    assert model is not None
    env: dict[str, str] = {}
    none_for_openai = ModelDrivers(builtin={}, factories={}, env=LiveEnv(env))
    with pytest.raises(NotConfigured) as refused:
        await none_for_openai.driver_for(model, catalog)
    assert refused.value.message == ("model: provider deepseek is of type openai, which this server cannot call "
                                     "(available: none)")
    drivers = ModelDrivers(builtin={}, factories={"openai": Recorder}, env=LiveEnv(env))
    with pytest.raises(NotConfigured) as no_key:
        await drivers.driver_for(model, catalog)
    assert no_key.value.message == "model: provider deepseek's key (DEEPSEEK_KEY) is not set"
    env["DEEPSEEK_KEY"] = "sk-one"
    first = await drivers.driver_for(model, catalog)
    assert isinstance(first, Recorder) and (first.key, first.spec.base_url) == ("sk-one", "https://api.deepseek.com/v1")
    assert await drivers.driver_for(model, catalog) is first
    env["DEEPSEEK_KEY"] = "sk-two"  # a rotated key: a new driver
    second = await drivers.driver_for(model, catalog)
    assert second is not first and isinstance(second, Recorder) and second.key == "sk-two"


# ---- the gateway over the real ledger ------------------------------------------------------------

class Slow:
    """Streams words with explicit final usage; `fail_at` raises an upstream error before that event."""

    name = "anthropic"

    def __init__(self, words: int = 5, fail_at: int | None = None) -> None:
        self.words, self.fail_at = words, fail_at

    async def stream(self, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
        if self.fail_at == 0:
            raise UpstreamError("overloaded", code="overloaded_error")
        yield MessageStart("msg_1", request.model, Usage(1000, 1))
        for i in range(self.words):
            if self.fail_at == i + 1:
                raise UpstreamError("connection lost", code="connection_error")
            yield TextDelta("word ")
        yield MessageStop("end_turn", Usage(1000, 40))


class HeldLedger(SqliteUsageLedger):
    """The SQLite ledger whose settles wait for `go` (a write that takes its time)."""

    def __init__(self, store: SqliteStore) -> None:
        super().__init__(store)
        self.go = asyncio.Event()
        self.settling = 0

    async def settle(self, record: UsageRecord, *, reserved: Decimal, reserved_period: str, key_held: bool) -> bool:
        self.settling += 1
        await self.go.wait()
        return await super().settle(record, reserved=reserved, reserved_period=reserved_period, key_held=key_held)


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, driver: object, *, held: bool = False
                  ) -> AsyncIterator[tuple[TokenGateway, SqliteUsageLedger]]:
    store = SqliteStore(tmp_path / "agentvm.db")
    await store.open()
    ledger = HeldLedger(store) if held else SqliteUsageLedger(store)
    catalog = build_catalog(DEFAULT_PRICES, {}, anthropic=True)

    async def current() -> tuple[ModelCatalog, Decimal]:
        return catalog, Decimal("1.05")

    drivers = ModelDrivers(builtin={"anthropic": driver}, factories={}, env=ProcessEnv({}))  # type: ignore[dict-item]
    try:
        yield TokenGateway(catalog=current, drivers=drivers, meter=Meter(ledger, budget_cache_s=0)), ledger
    finally:
        await store.close()


def request(max_tokens: int = 100) -> LLMRequest:
    return LLMRequest(model="", messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens)


async def records(ledger: SqliteUsageLedger, tenant: str = "t1") -> list[tuple[str, str, str, Usage, str, bool]]:
    found = await ledger.list_usage(tenant, since_ms=now_ms() - 86_400_000, until_ms=now_ms() + 1000)
    return [(r.provider, r.model or "", r.status, r.usage, str(r.billed_cost), r.estimated) for r in found]


async def test_a_completed_call_yields_its_bill_and_writes_one_record(tmp_path: Path) -> None:
    async with gateway(tmp_path, Slow()) as (gw, ledger):
        call = await gw.start(Principal("t1", "avmk_1"), "claude-haiku-4-5", request())
        events = [e async for e in call.events]
        billed = events[-1]
        assert isinstance(billed, Billed) and billed.record_id == f"{call.call_id}#llm#1"
        # 1000 input × 1 + 40 output × 5 = 1200 per million; × 1.05
        assert (billed.usage, billed.cost.list, billed.cost.billed) == (
            Usage(1000, 40), Decimal("0.00120000"), Decimal("0.00126000"))
        assert await records(ledger) == [("anthropic", "claude-haiku-4-5", "completed", Usage(1000, 40),
                                          "0.00126000", False)]


async def test_settled_before_the_answer_the_bill_waits_for_the_write(tmp_path: Path) -> None:
    async with gateway(tmp_path, Slow(), held=True) as (gw, ledger):
        assert isinstance(ledger, HeldLedger)
        call = await gw.start(Principal("t1"), "claude-haiku-4-5", request())
        seen: list[object] = []

        async def consume() -> None:
            async for event in call.events:
                seen.append(event)

        consuming = asyncio.ensure_future(consume())
        await asyncio.sleep(0.05)
        # everything the provider said went out; the bill waits for the write
        assert ledger.settling == 1 and not consuming.done() and isinstance(seen[-1], MessageStop)
        ledger.go.set()
        await asyncio.wait_for(consuming, 5)
        assert isinstance(seen[-1], Billed) and len(await records(ledger)) == 1


class Draining(Slow):
    """After MessageStop the stream waits for `drained` (a driver reading the rest of the provider's answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.drained = asyncio.Event()

    async def stream(self, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
        async for event in super().stream(request):
            yield event
        await self.drained.wait()


async def test_the_settle_starts_at_message_stop_while_the_driver_drains(tmp_path: Path) -> None:
    driver = Draining()
    async with gateway(tmp_path, driver, held=True) as (gw, ledger):
        assert isinstance(ledger, HeldLedger)
        call = await gw.start(Principal("t1"), "claude-haiku-4-5", request())
        seen = [await call.events.__anext__() for _ in range(7)]
        assert isinstance(seen[-1], MessageStop)
        await asyncio.sleep(0.05)
        # the bill is being written before the driver's stream ended
        assert ledger.settling == 1 and not driver.drained.is_set()
        ledger.go.set()
        driver.drained.set()
        billed = await asyncio.wait_for(call.events.__anext__(), 5)
        assert isinstance(billed, Billed) and billed.usage == Usage(1000, 40)
        with pytest.raises(StopAsyncIteration):
            await call.events.__anext__()
        assert ledger.settling == 1
        assert await records(ledger) == [("anthropic", "claude-haiku-4-5", "completed", Usage(1000, 40),
                                          "0.00126000", False)]


async def test_a_client_that_goes_away_is_billed_for_what_streamed_and_the_hold_is_given_back(
        tmp_path: Path) -> None:
    async with gateway(tmp_path, Slow(words=50)) as (gw, ledger):
        await ledger.put_budget(Budget("t1", monthly=Decimal(5)))
        call = await gw.start(Principal("t1"), "anthropic/claude-haiku-4-5", request(max_tokens=500))
        seen = 0
        async for event in call.events:
            seen += isinstance(event, TextDelta)
            if seen == 3:
                break
        await call.events.aclose()
        # three words of five bytes streamed, never reported: 15 output tokens estimated
        assert await records(ledger) == [("anthropic", "claude-haiku-4-5", "interrupted", Usage(1000, 16),
                                          "0.00113400", True)]
        spend = await ledger.spend("t1", None, period_of(now_ms()))
        assert (spend.reserved, spend.spent) == (Decimal(0), Decimal("0.00113400"))


async def test_an_upstream_failure_before_any_output_bills_nothing_and_releases_the_hold(tmp_path: Path) -> None:
    async with gateway(tmp_path, Slow(fail_at=0)) as (gw, ledger):
        await ledger.put_budget(Budget("t1", monthly=Decimal(5)))
        call = await gw.start(Principal("t1"), "claude-haiku-4-5", request())
        with pytest.raises(UpstreamError):
            await call.events.__anext__()
        assert await records(ledger) == []
        spend = await ledger.spend("t1", None, period_of(now_ms()))
        assert (spend.reserved, spend.spent) == (Decimal(0), Decimal(0))


async def test_refusals_come_before_the_provider_is_called(tmp_path: Path) -> None:
    async with gateway(tmp_path, Slow()) as (gw, ledger):
        with pytest.raises(NotFound) as unknown:
            await gw.start(Principal("t1"), "openai/gpt-5", request())
        assert unknown.value.field == "model"
        await ledger.put_budget(Budget("t1", monthly=Decimal("0.0001")))
        with pytest.raises(QuotaExceeded):
            await gw.start(Principal("t1"), "claude-haiku-4-5", request(max_tokens=1000))
        assert await records(ledger) == []


async def test_the_scripted_model_runs_free_without_a_key(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "agentvm.db")
    await store.open()
    try:
        ledger = SqliteUsageLedger(store)

        async def current() -> tuple[ModelCatalog, Decimal]:
            return build_catalog(DEFAULT_PRICES, {}, anthropic=False), Decimal("1.05")

        gw = TokenGateway(catalog=current, drivers=ModelDrivers(builtin={"scripted": ScriptedDriver()}, factories={},
                                                                env=ProcessEnv({})), meter=Meter(ledger))
        call = await gw.start(Principal("t1"), "scripted/echo", request())
        text = "".join([e.text async for e in call.events if isinstance(e, TextDelta)])
        assert text == "You said: hi"
        [(provider, model, status, _, billed, _)] = await records(ledger)
        assert (provider, model, status, billed) == ("scripted", "scripted", "completed", "0E-8")
    finally:
        await store.close()


async def test_a_default_max_tokens_is_lowered_to_the_models_output_and_an_explicit_one_is_refused(
        tmp_path: Path) -> None:
    seen: list[int] = []

    class Noting(Slow):
        async def stream(self, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
            seen.append(request.max_tokens)
            async for event in super().stream(request):
                yield event

    async with gateway(tmp_path, Noting()) as (gw, _):
        asked = to_request({"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "hi"}]})
        assert (asked.request.max_tokens, asked.max_tokens_param) == (4096, None)
        call = await gw.start(Principal("t1"), asked.model, replace(asked.request, max_tokens=100_000),
                              max_tokens_param=None)
        _ = [e async for e in call.events]
        assert seen == [64_000]
        big = to_request({"model": "claude-haiku-4-5", "max_completion_tokens": 100_000,
                          "messages": [{"role": "user", "content": "hi"}]})
        with pytest.raises(InvalidRequest) as refused:
            await gw.start(Principal("t1"), big.model, big.request, max_tokens_param=big.max_tokens_param)
        assert (refused.value.field, refused.value.message) == (
            "max_completion_tokens", "max_completion_tokens: 100000 is more than anthropic/claude-haiku-4-5 can "
                                     "write (64000)")
        assert seen == [64_000]


def test_openai_messages_become_anthropic_messages() -> None:
    asked = to_request({"model": "m", "stop": "END", "tool_choice": {"type": "function", "function": {"name": "f"}},
                        "messages": [
                            {"role": "developer", "content": "rule one"},
                            {"role": "system", "content": [{"type": "text", "text": "rule two"}]},
                            {"role": "user", "content": [{"type": "image_url", "image_url": {
                                "url": "https://example.com/cat.png"}}]},
                            {"role": "assistant", "content": None, "tool_calls": [
                                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}},
                                {"id": "c2", "type": "function", "function": {"name": "f", "arguments": ""}}]},
                            {"role": "tool", "tool_call_id": "c1", "content": "one"},
                            {"role": "tool", "tool_call_id": "c2", "content": "two"},
                            {"role": "user", "content": "and?"}]})
    r = asked.request
    assert (r.system, r.stop_sequences, r.tool_choice) == ("rule one\n\nrule two", ["END"],
                                                          {"type": "tool", "name": "f"})
    assert r.messages == [
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
                                          {"type": "tool_use", "id": "c2", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "one"},
                                     {"type": "tool_result", "tool_use_id": "c2", "content": "two"},
                                     {"type": "text", "text": "and?"}]}]
    for body, param in [({"model": "m", "messages": []}, "messages"),
                        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3},
                         "temperature"),
                        ({"model": "m", "messages": [{"role": "user", "content": "x"}],
                          "response_format": {"type": "yaml"}}, "response_format.type"),
                        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
                        ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id")]:
        with pytest.raises(InvalidRequest) as refused:
            to_request(body)
        assert refused.value.field == param
