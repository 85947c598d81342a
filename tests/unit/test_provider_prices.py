"""The list prices of non-Anthropic catalog models (money.PROVIDER_PRICES): served snapshot names find
their family, pricier siblings are not under-billed, and the bill is list × markup to the 1e-8."""

from __future__ import annotations

from decimal import Decimal

import pytest

from agentvm.domain.models import Usage
from agentvm.money import DEFAULT_PRICES, PROVIDER_PRICES, ModelPrice, cost_of, price_for


@pytest.mark.parametrize(("model", "key"), [
    ("openai/gpt-4o-mini-2024-07-18", "openai/gpt-4o-mini"),
    ("openai/gpt-4o-2024-08-06", "openai/gpt-4o"),
    ("openai/gpt-4o-2024-05-13", "openai/gpt-4o-2024-05-13"),
    ("openai/gpt-4.1-mini-2025-04-14", "openai/gpt-4.1-mini"),
    ("openai/gpt-4.1-2025-04-14", "openai/gpt-4.1"),
    ("bedrock/anthropic.claude-3-5-haiku-20241022-v1:0", "bedrock/anthropic.claude-3-5-haiku"),
    ("bedrock/us.anthropic.claude-haiku-4-5-20251001-v1:0", "bedrock/us.anthropic.claude-haiku-4-5"),
    ("bedrock/amazon.nova-lite-v1:0", "bedrock/amazon.nova-lite-v1"),
])
def test_a_served_model_name_finds_its_family(model: str, key: str) -> None:
    assert price_for(model, PROVIDER_PRICES) is PROVIDER_PRICES[key]


def test_the_table_is_provider_scoped_and_apart_from_the_anthropic_one() -> None:
    assert all(k.split("/", 1)[0] in ("openai", "bedrock") and "/" in k for k in PROVIDER_PRICES)
    assert not set(PROVIDER_PRICES) & set(DEFAULT_PRICES)
    # geographic Claude 4.5 profiles cost 10 % more than global ones
    us, glob = PROVIDER_PRICES["bedrock/us.anthropic.claude-haiku-4-5"], \
        PROVIDER_PRICES["bedrock/global.anthropic.claude-haiku-4-5"]
    assert (us.input, us.output, us.cache_write, us.cache_read) == tuple(
        p * Decimal("1.1") for p in (glob.input, glob.output, glob.cache_write, glob.cache_read))
    assert all(isinstance(v, Decimal) for p in PROVIDER_PRICES.values()
               for v in (p.input, p.output, p.cache_write, p.cache_read))


def test_a_call_is_billed_at_list_times_markup() -> None:
    # the OpenAI driver's usage of a call that read 1024 of its 1200 prompt tokens from the cache
    cost = cost_of(Usage(176, 7, 1024, 0), "openai/gpt-4o-mini-2024-07-18", prices=PROVIDER_PRICES)
    # 176 × 0.15 + 7 × 0.60 + 1024 × 0.075 = 107.4 per million
    assert (cost.list, cost.billed) == (Decimal("0.00010740"), Decimal("0.00011277"))
    bedrock = cost_of(Usage(18, 4, 2048, 96), "bedrock/anthropic.claude-3-5-haiku-20241022-v1:0",
                      prices=PROVIDER_PRICES)
    # 18 × 0.80 + 4 × 4 + 2048 × 0.08 + 96 × 1 = 290.24 per million
    assert (bedrock.list, bedrock.billed) == (Decimal("0.00029024"), Decimal("0.00030475"))


def test_an_unpriced_model_of_openai_or_bedrock_takes_the_shipped_list_price() -> None:
    from agentvm.services.model_catalog import build_catalog, check_providers

    providers = check_providers({
        "oa": {"type": "openai", "baseUrl": "https://api.openai.com/v1", "apiKeyEnv": "OPENAI_API_KEY",
               "models": {"gpt-4o-mini-2024-07-18": {}, "gpt-4.1": {"input": "1", "output": "2", "cacheRead": "0",
                                                                    "cacheWrite": "1"}}},
        "br": {"type": "bedrock", "region": "us-east-1",
               "models": {"us.anthropic.claude-haiku-4-5-20251001-v1:0": {"maxOutput": 64000}}},
    })
    catalog = build_catalog(DEFAULT_PRICES, providers, anthropic=False)
    mini, own, haiku = (catalog.models[m] for m in ("oa/gpt-4o-mini-2024-07-18", "oa/gpt-4.1",
                                                    "br/us.anthropic.claude-haiku-4-5-20251001-v1:0"))
    assert mini.price == PROVIDER_PRICES["openai/gpt-4o-mini"]
    assert own.price == ModelPrice(Decimal(1), Decimal(2), Decimal(1), Decimal(0))  # the operator's prices win
    assert haiku.price == PROVIDER_PRICES["bedrock/us.anthropic.claude-haiku-4-5"] and haiku.max_output == 64000
    # billed at list × 1.05 like any catalog model: 1,000 in + 500 out of gpt-4o-mini
    assert cost_of(Usage(1000, 500), mini.upstream_model, prices={mini.upstream_model: mini.price}).billed == \
        Decimal("0.00047250")


@pytest.mark.parametrize(("entry", "error"), [
    # a model the table does not list, even on OpenAI's own API
    ({"type": "openai", "baseUrl": "https://api.openai.com/v1", "models": {"o9-super": {}}},
     "p.models.o9-super.input: missing (USD per million tokens; every model is priced; no shipped list price "
     "for this model)"),
    # any other OpenAI-compatible server sells its own prices, whatever the model's name
    ({"type": "openai", "baseUrl": "http://127.0.0.1:8000/v1", "models": {"gpt-4o": {}}},
     "p.models.gpt-4o.input: missing (USD per million tokens; every model is priced)"),
    ({"type": "openai", "baseUrl": "https://api.openai.com.evil.example/v1", "models": {"gpt-4o": {}}},
     "p.models.gpt-4o.input: missing (USD per million tokens; every model is priced)"),
    # some prices given: all four are needed
    ({"type": "bedrock", "models": {"amazon.nova-lite-v1:0": {"input": "1"}}},
     "p.models.amazon.nova-lite-v1:0.output: missing (USD per million tokens; every model is priced)"),
])
def test_a_model_without_prices_or_a_shipped_price_is_refused(entry: dict[str, object], error: str) -> None:
    from agentvm.services.model_catalog import check_providers

    with pytest.raises(ValueError) as exc:
        check_providers({"p": entry})
    assert str(exc.value) == error
