"""The model catalog of the token API: every model a caller may name, as `provider/model`, with its
list prices, and the providers behind them (docs/token-api.md, "The catalog").

Built once per request from the config center (services/config.py: `billing.prices` and
`llm.providers`) by the runtime's composition root:
- `anthropic/<id>`: the shipped Anthropic models (money.LISTED_MODELS) at the price table's prices,
  when an Anthropic key is configured; any other Anthropic model name a price row covers is accepted
  too (not listed). A bare name (`claude-haiku-4-5`, what images name) is an alias of `anthropic/…`.
- `scripted/echo`: the offline scripted driver, free, when no Anthropic key is configured (so that
  everything works without any key); `scripted` is its alias.
- every model of every provider in `llm.providers`: one entry per provider (its kind, base URL,
  the *name* of the Env value holding its key, its models with their prices) adds it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agentvm.money import (
    LISTED_MODELS,
    OFFLINE_MODELS,
    PROVIDER_PRICES,
    ModelPrice,
    is_known_model,
    known_models,
    price_for,
)

ANTHROPIC = "anthropic"
SCRIPTED = "scripted"
SCRIPTED_MODEL = "scripted/echo"
# provider kinds a `llm.providers` entry may name: the driver families (services/model_drivers.py)
PROVIDER_KINDS = ("anthropic", "openai", "bedrock")
# provider names that are built in (or reserved: `agent/<imageId>` runs an image's turn, issue 20 item 5)
RESERVED_PROVIDERS = frozenset({ANTHROPIC, SCRIPTED, "agent"})
_PROVIDER_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,199}$")
_PRICE_FIELDS = {"input": "input", "output": "output", "cacheWrite": "cache_write", "cacheRead": "cache_read"}
MAX_PRICE_PER_MTOK = Decimal(1000)


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """Where a provider's models are served: its driver family (`kind`), base URL, and the name of the
    Env value (an environment variable; an SSM parameter in the cloud) that holds its API key. The key
    itself is never in the configuration."""

    name: str
    kind: str
    base_url: str | None = None
    api_key_env: str | None = None
    region: str | None = None  # Bedrock


@dataclass(frozen=True, slots=True)
class CatalogModel:
    id: str  # "provider/model"
    provider: str
    upstream_model: str  # the name the provider's API takes
    price: ModelPrice  # list price, USD per million tokens
    context_window: int | None = None
    max_output: int | None = None
    listed: bool = True  # False: accepted by name, not shown by GET /v1/models

    @property
    def ledger_model(self) -> str:
        """The model name of its usage records: the bare name for the built-in providers (as agent turns
        record it, so that the price table prices it in the FOCUS export), else the catalog id."""
        return self.upstream_model if self.provider in (ANTHROPIC, SCRIPTED) else self.id


@dataclass(slots=True)
class ModelCatalog:
    providers: dict[str, ProviderSpec]
    models: dict[str, CatalogModel]
    anthropic_prices: Mapping[str, ModelPrice] = field(default_factory=dict)  # None of Anthropic: not served

    def listed(self) -> list[CatalogModel]:
        return [m for m in self.models.values() if m.listed]

    def resolve(self, name: str) -> CatalogModel | None:
        """The model a caller names: a catalog id, a bare Anthropic name (an alias of `anthropic/…`), or
        an Anthropic model a price row covers; None when unknown."""
        found = self.models.get(name)
        if found is not None:
            return found
        provider, sep, rest = name.partition("/")
        if not sep:
            provider, rest = (SCRIPTED, "echo") if name in OFFLINE_MODELS else (ANTHROPIC, name)
            found = self.models.get(f"{provider}/{rest}")
            if found is not None:
                return found
        if provider == ANTHROPIC and ANTHROPIC in self.providers and rest:
            names = known_models(self.anthropic_prices)
            if is_known_model(rest, names):
                window, output = LISTED_MODELS.get(rest, (None, None))
                return CatalogModel(f"{ANTHROPIC}/{rest}", ANTHROPIC, rest, price_for(rest, self.anthropic_prices),
                                    window, output, listed=False)
        return None

    def price_rows(self) -> dict[str, ModelPrice]:
        """The configured providers' prices by catalog id (for a price table keyed by usage records' model)."""
        return {m.id: m.price for m in self.models.values() if m.provider not in (ANTHROPIC, SCRIPTED)}


def build_catalog(prices: Mapping[str, ModelPrice], providers: Mapping[str, Any], *, anthropic: bool,
                  anthropic_base_url: str | None = None) -> ModelCatalog:
    """`prices`: the price table (money.DEFAULT_PRICES with `billing.prices` over it); `providers`: the
    checked value of `llm.providers`; `anthropic`: an Anthropic key is configured (else the offline
    scripted model is served instead)."""
    specs: dict[str, ProviderSpec] = {}
    models: dict[str, CatalogModel] = {}
    if anthropic:
        specs[ANTHROPIC] = ProviderSpec(ANTHROPIC, "anthropic", anthropic_base_url)
        for name, (window, output) in LISTED_MODELS.items():
            models[f"{ANTHROPIC}/{name}"] = CatalogModel(f"{ANTHROPIC}/{name}", ANTHROPIC, name,
                                                         price_for(name, prices), window, output)
    else:
        specs[SCRIPTED] = ProviderSpec(SCRIPTED, SCRIPTED)
        models[SCRIPTED_MODEL] = CatalogModel(SCRIPTED_MODEL, SCRIPTED, SCRIPTED, price_for(SCRIPTED, prices),
                                              200_000, 64_000)
    for name, entry in providers.items():
        specs[name] = ProviderSpec(name, entry["type"], entry.get("baseUrl"), entry.get("apiKeyEnv"),
                                   entry.get("region"))
        for model, row in entry["models"].items():
            price = ModelPrice(**{ours: Decimal(row[theirs]) for theirs, ours in _PRICE_FIELDS.items()})
            ident = f"{name}/{model}"
            models[ident] = CatalogModel(ident, name, model, price, row.get("contextWindow"), row.get("maxOutput"))
    return ModelCatalog(specs, models, dict(prices) if anthropic else {})


# ---- the `llm.providers` config value --------------------------------------------------------------

def check_providers(value: Any) -> dict[str, Any]:
    """`llm.providers`, checked (ValueError naming the entry and field): `{name: {type, baseUrl?,
    apiKeyEnv?, region?, models: {model: {input, output, cacheRead, cacheWrite, contextWindow?,
    maxOutput?}}}}`, prices in USD per million tokens. A JSON string is accepted (an environment
    variable)."""
    if isinstance(value, str):
        import orjson

        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise ValueError("must be a JSON object of providers") from None
    if not isinstance(value, dict):
        raise ValueError("must be an object: {provider: {type, baseUrl, apiKeyEnv, models}}")
    out: dict[str, Any] = {}
    for name, entry in value.items():
        if not isinstance(name, str) or not _PROVIDER_NAME.match(name):
            raise ValueError(f"{name!s:.40}: a provider name is lowercase letters, digits, - and _")
        if name in RESERVED_PROVIDERS:
            raise ValueError(f"{name}: this provider name is built in")
        out[name] = _provider(name, entry)
    return out


def _provider(name: str, entry: Any) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise ValueError(f"{name}: must be an object with type and models")
    unknown = set(entry) - {"type", "baseUrl", "apiKeyEnv", "region", "models"}
    if unknown:
        raise ValueError(f"{name}.{sorted(unknown)[0]}: unknown field (known: type, baseUrl, apiKeyEnv, region, "
                         "models; a key itself never goes here: apiKeyEnv names the variable that holds it)")
    kind = entry.get("type")
    if kind not in PROVIDER_KINDS:
        raise ValueError(f"{name}.type: must be one of {', '.join(PROVIDER_KINDS)}")
    out: dict[str, Any] = {"type": kind}
    base_url = entry.get("baseUrl")
    if base_url is not None:
        if not isinstance(base_url, str) or not re.match(r"^https?://[^\s/]+", base_url):
            raise ValueError(f"{name}.baseUrl: must be an http(s) URL")
        out["baseUrl"] = base_url.rstrip("/")
    elif kind == "openai":
        raise ValueError(f"{name}.baseUrl: an OpenAI-compatible provider needs its base URL")
    key_env = entry.get("apiKeyEnv")
    if key_env is not None:
        if not isinstance(key_env, str) or not _ENV_NAME.match(key_env):
            raise ValueError(f"{name}.apiKeyEnv: must be the name of a variable (such as OPENAI_API_KEY), not a key")
        out["apiKeyEnv"] = key_env
    region = entry.get("region")
    if region is not None:
        if not isinstance(region, str) or not re.match(r"^[a-z]{2}(-[a-z]+)+-\d$", region):
            raise ValueError(f"{name}.region: must be an AWS region such as us-east-1")
        out["region"] = region
    models = entry.get("models")
    if not isinstance(models, dict) or not models:
        raise ValueError(f"{name}.models: must be an object of at least one model with its prices")
    shipped = _shipped_prices(kind, out.get("baseUrl"))
    out["models"] = {model: _model(f"{name}.models.{model}", model, row, shipped)
                     for model, row in models.items()}
    return out


def _shipped_prices(kind: str, base_url: str | None) -> str | None:
    """The `money.PROVIDER_PRICES` key prefix whose list prices a provider's unpriced models take: Bedrock's
    (AWS's list prices), and OpenAI's for OpenAI's own API only (a vLLM or DeepSeek model of the same
    name is not sold at OpenAI's price); None: every model must give its prices."""
    if kind == "bedrock":
        return "bedrock/"
    if kind == "openai" and base_url is not None and re.match(r"^https://api\.openai\.com(/|$)", base_url):
        return "openai/"
    return None


def _model(where: str, model: Any, row: Any, shipped: str | None) -> dict[str, Any]:
    if not isinstance(model, str) or not _MODEL_NAME.match(model):
        raise ValueError(f"{where}: not a model name")
    if not isinstance(row, dict):
        raise ValueError(f"{where}: must be an object with input, output, cacheRead and cacheWrite prices")
    missing = [f for f in _PRICE_FIELDS if f not in row]
    if len(missing) == len(_PRICE_FIELDS) and shipped is not None and is_known_model(shipped + model,
                                                                                      tuple(PROVIDER_PRICES)):
        listed = price_for(shipped + model, PROVIDER_PRICES)  # the shipped list price, as of PROVIDER_PRICES_TAKEN_ON
        row = {**row, **{theirs: str(getattr(listed, ours)) for theirs, ours in _PRICE_FIELDS.items()}}
        missing = []
    if missing:
        known = "; no shipped list price for this model" if shipped is not None and len(missing) == 4 else ""
        raise ValueError(f"{where}.{missing[0]}: missing (USD per million tokens; every model is priced{known})")
    unknown = set(row) - {*_PRICE_FIELDS, "contextWindow", "maxOutput"}
    if unknown:
        raise ValueError(f"{where}.{sorted(unknown)[0]}: unknown field")
    out: dict[str, Any] = {}
    for name in _PRICE_FIELDS:
        amount = row[name]
        if isinstance(amount, bool) or not isinstance(amount, str | int | float):
            raise ValueError(f"{where}.{name}: must be a decimal number (USD per million tokens)")
        try:
            d = Decimal(str(amount).strip())
        except ArithmeticError:
            raise ValueError(f"{where}.{name}: must be a decimal number (USD per million tokens)") from None
        if not d.is_finite() or d < 0 or d > MAX_PRICE_PER_MTOK:
            raise ValueError(f"{where}.{name}: must be from 0 to {MAX_PRICE_PER_MTOK} (USD per million tokens)")
        out[name] = str(d)
    for name in ("contextWindow", "maxOutput"):
        count = row.get(name)
        if count is not None:
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10_000_000:
                raise ValueError(f"{where}.{name}: must be a whole number of tokens")
            out[name] = count
    return out
