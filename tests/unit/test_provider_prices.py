"""The list prices of non-Anthropic catalog models (money.PROVIDER_PRICES): served snapshot names find
their family, pricier siblings are not under-billed, and the bill is list × markup to the 1e-8."""

from __future__ import annotations

from decimal import Decimal

import pytest

from agentvm.domain.models import Usage
from agentvm.money import DEFAULT_PRICES, PROVIDER_PRICES, cost_of, price_for


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
