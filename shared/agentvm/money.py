"""Prices and billed cost. Money is Decimal, never float."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from agentvm.domain.models import Usage

MILLION = Decimal(1_000_000)
# Costs are kept to 1e-8 USD so that sums of many small turns stay exact to the cent.
COST_QUANTUM = Decimal("0.00000001")


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """USD per million tokens."""

    input: Decimal
    output: Decimal
    cache_write: Decimal
    cache_read: Decimal


# Anthropic list prices, taken from the public pricing page (https://www.anthropic.com/pricing, the
# API table) on 2026-11-01, USD per million tokens. Cache write is the 5-minute cache write price
# (1.25 × input); cache read is 0.1 × input. Keys are model-name prefixes: the longest match wins.
PRICES_TAKEN_ON = "2026-11-01"
DEFAULT_PRICES: dict[str, ModelPrice] = {
    "claude-opus-4": ModelPrice(Decimal("15"), Decimal("75"), Decimal("18.75"), Decimal("1.50")),
    "claude-opus-4-5": ModelPrice(Decimal("5"), Decimal("25"), Decimal("6.25"), Decimal("0.50")),
    "claude-opus-4-6": ModelPrice(Decimal("5"), Decimal("25"), Decimal("6.25"), Decimal("0.50")),
    "claude-sonnet-4": ModelPrice(Decimal("3"), Decimal("15"), Decimal("3.75"), Decimal("0.30")),
    "claude-haiku-4": ModelPrice(Decimal("1"), Decimal("5"), Decimal("1.25"), Decimal("0.10")),
    "claude-3-5-haiku": ModelPrice(Decimal("0.80"), Decimal("4"), Decimal("1"), Decimal("0.08")),
    "claude-3-haiku": ModelPrice(Decimal("0.25"), Decimal("1.25"), Decimal("0.30"), Decimal("0.03")),
    "scripted": ModelPrice(Decimal("0"), Decimal("0"), Decimal("0"), Decimal("0")),
}
# The Anthropic models the token API's catalog lists (`anthropic/<id>`), with their context window
# and largest output in tokens (Anthropic's models overview, taken with the prices). Any other model
# name a price row covers is still accepted (`anthropic/claude-sonnet-4-5-20250929`): it is not listed.
LISTED_MODELS: dict[str, tuple[int, int]] = {
    "claude-opus-4-6": (1_000_000, 128_000),
    "claude-opus-4-5": (200_000, 64_000),
    "claude-sonnet-4-5": (200_000, 64_000),
    "claude-haiku-4-5": (200_000, 64_000),
}
DEFAULT_MARKUP = Decimal("1.05")
# priced (at zero) for the offline scripted driver: a known model only while that driver runs
OFFLINE_MODELS = ("scripted",)


def known_models(prices: Mapping[str, ModelPrice] | None = None, offline: bool = False) -> list[str]:
    """The model names (prefixes: `claude-sonnet-4` takes `claude-sonnet-4-5-20250929`) an image may
    name: the price table's, and the offline driver's when it is the one running turns."""
    table = DEFAULT_PRICES if prices is None else prices
    return sorted(name for name in table if offline or name not in OFFLINE_MODELS)


def is_known_model(model: str, names: Sequence[str]) -> bool:
    return any(model.startswith(name) for name in names)


def prices_wire(table: dict[str, ModelPrice]) -> dict[str, dict[str, str]]:
    return {model: {"input": str(p.input), "output": str(p.output), "cacheWrite": str(p.cache_write),
                    "cacheRead": str(p.cache_read)} for model, p in table.items()}


def price_for(model: str, prices: Mapping[str, ModelPrice] | None = None) -> ModelPrice:
    """The price of the longest table key that prefixes the model name (`claude-sonnet-4-5-2025…`)."""
    table = DEFAULT_PRICES if prices is None else prices
    best = ""
    for key in table:
        if model.startswith(key) and len(key) > len(best):
            best = key
    if not best:
        # Unknown models are priced like the most expensive family: never under-bill.
        return max(table.values(), key=lambda p: p.output)
    return table[best]


@dataclass(frozen=True, slots=True)
class Cost:
    list: Decimal
    billed: Decimal
    currency: str = "USD"

    def to_wire(self) -> dict[str, str]:
        return {"list": money_text(self.list), "billed": money_text(self.billed), "currency": self.currency}


def money_text(amount: Decimal) -> str:
    """Fixed-point text: `str(Decimal)` would write tiny amounts as `8.0E-7`."""
    return format(amount, "f")


def cost_of(usage: Usage, model: str, *, markup: Decimal = DEFAULT_MARKUP,
            prices: Mapping[str, ModelPrice] | None = None) -> Cost:
    p = price_for(model, prices)
    raw = (
        Decimal(usage.input_tokens) * p.input
        + Decimal(usage.output_tokens) * p.output
        + Decimal(usage.cache_write_tokens) * p.cache_write
        + Decimal(usage.cache_read_tokens) * p.cache_read
    ) / MILLION
    list_cost = raw.quantize(COST_QUANTUM, rounding=ROUND_HALF_UP)
    billed = (raw * markup).quantize(COST_QUANTUM, rounding=ROUND_HALF_UP)
    return Cost(list=list_cost, billed=billed)


# List prices of models on other providers, for the model catalog (issue 20), keyed
# `provider/model-prefix` as the catalog names them; read with `price_for(f"{provider}/{model}",
# PROVIDER_PRICES)`, so a served snapshot name (`gpt-4o-mini-2024-07-18`) finds its family. The
# Anthropic table and its logic above are separate and unchanged. A prefix is listed only where no
# pricier model shares it (hence `gpt-4o-2024-05-13` apart, and no bare `gpt-5`).
# Sources: OpenAI https://openai.com/api/pricing (standard tier; cache read = "cached input"; OpenAI
# has no cache-write charge, so cache write = input), and Amazon Bedrock
# https://aws.amazon.com/bedrock/pricing/ (on-demand, us-east-1; Claude cache write 1.25 × input and
# read 0.1 × input; geographic `us.` profiles of Claude 4.5 models cost 10 % more than `global.`;
# Nova has no cache-write price, so input is charged: never under-bill). Figures as those pages list
# them in 2026 (compiled on the date below); the operator's prices in the config center override them.
PROVIDER_PRICES_TAKEN_ON = "2026-11-26"
PROVIDER_PRICES: dict[str, ModelPrice] = {
    "openai/gpt-4o-mini": ModelPrice(Decimal("0.15"), Decimal("0.60"), Decimal("0.15"), Decimal("0.075")),
    "openai/gpt-4o": ModelPrice(Decimal("2.50"), Decimal("10"), Decimal("2.50"), Decimal("1.25")),
    "openai/gpt-4o-2024-05-13": ModelPrice(Decimal("5"), Decimal("15"), Decimal("5"), Decimal("5")),
    "openai/gpt-4.1": ModelPrice(Decimal("2"), Decimal("8"), Decimal("2"), Decimal("0.50")),
    "openai/gpt-4.1-mini": ModelPrice(Decimal("0.40"), Decimal("1.60"), Decimal("0.40"), Decimal("0.10")),
    "openai/gpt-4.1-nano": ModelPrice(Decimal("0.10"), Decimal("0.40"), Decimal("0.10"), Decimal("0.025")),
    "openai/gpt-5-mini": ModelPrice(Decimal("0.25"), Decimal("2"), Decimal("0.25"), Decimal("0.025")),
    "bedrock/anthropic.claude-3-5-haiku": ModelPrice(Decimal("0.80"), Decimal("4"), Decimal("1"), Decimal("0.08")),
    "bedrock/us.anthropic.claude-3-5-haiku": ModelPrice(Decimal("0.80"), Decimal("4"), Decimal("1"),
                                                        Decimal("0.08")),
    "bedrock/global.anthropic.claude-haiku-4-5": ModelPrice(Decimal("1"), Decimal("5"), Decimal("1.25"),
                                                            Decimal("0.10")),
    "bedrock/us.anthropic.claude-haiku-4-5": ModelPrice(Decimal("1.10"), Decimal("5.50"), Decimal("1.375"),
                                                        Decimal("0.11")),
    "bedrock/amazon.nova-micro-v1": ModelPrice(Decimal("0.035"), Decimal("0.14"), Decimal("0.035"),
                                               Decimal("0.00875")),
    "bedrock/amazon.nova-lite-v1": ModelPrice(Decimal("0.06"), Decimal("0.24"), Decimal("0.06"), Decimal("0.015")),
    "bedrock/amazon.nova-pro-v1": ModelPrice(Decimal("0.80"), Decimal("3.20"), Decimal("0.80"), Decimal("0.20")),
    "bedrock/us.amazon.nova-micro-v1": ModelPrice(Decimal("0.035"), Decimal("0.14"), Decimal("0.035"),
                                                  Decimal("0.00875")),
    "bedrock/us.amazon.nova-lite-v1": ModelPrice(Decimal("0.06"), Decimal("0.24"), Decimal("0.06"),
                                                 Decimal("0.015")),
    "bedrock/us.amazon.nova-pro-v1": ModelPrice(Decimal("0.80"), Decimal("3.20"), Decimal("0.80"), Decimal("0.20")),
}
