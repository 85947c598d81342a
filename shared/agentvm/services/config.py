"""The config center: layered configuration, validated per key, with secrets masked.

Layers, lowest first: built-in defaults < the config file (`<data-dir>/config.yaml`, with `${VAR}`
interpolation from the environment) < the environment (and `avm serve` flags) < runtime updates
(`PUT /v1/config/{key}`: persisted through the `ConfigStore` port, audited). `GET` shows each key's
effective value, where it came from and every layer's value; secrets are always masked.

Keys marked `next_turn` apply to the next turn without a restart (the engine options of each turn
are taken from here); the others (`restart`) are read when the server starts.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from agentvm.config import Settings
from agentvm.domain.models import ConfigChange
from agentvm.errors import InvalidRequest, NotFound
from agentvm.ids import now_ms
from agentvm.money import DEFAULT_MARKUP, DEFAULT_PRICES, PRICES_TAKEN_ON, ModelPrice, prices_wire
from agentvm.ports import ConfigStore, Env

if TYPE_CHECKING:  # the engine is not loaded by the functions that only read or change the configuration
    from agentvm.engine.runner import EngineOptions
    from agentvm.services.model_catalog import ModelCatalog

log = logging.getLogger(__name__)

MASK = "********"
LAYERS = ("default", "file", "env", "runtime")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _text(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("must be a non-empty string")
    return v.strip()


def _int_in(lo: int, hi: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, str) and re.fullmatch(r"-?[0-9]{1,18}", v.strip()):  # (an environment variable)
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise ValueError(f"must be an integer from {lo} to {hi}")
        return v
    return check


def _url(v: Any) -> str:
    text = _text(v)
    if not re.match(r"^https?://[^\s/]+", text):
        raise ValueError("must be an http(s) URL")
    return text


# Upper bounds of the money settings: far above any real value, low enough that a typo (or a
# hostile value) cannot make one call cost more than anyone holds.
MAX_MARKUP = Decimal(10)
MAX_PRICE_PER_MTOK = Decimal(1000)  # USD per million tokens; the dearest Anthropic list price is 75


def _decimal(v: Any, invalid: str) -> Decimal:
    """A finite decimal given as decimal text or a JSON number; a boolean, NaN or ±Infinity is
    `invalid` (ValueError with that reason)."""
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        raise ValueError(invalid)
    try:
        d = Decimal(str(v).strip())
    except InvalidOperation:
        raise ValueError(invalid) from None
    if not d.is_finite():  # (before any comparison: comparing a NaN raises InvalidOperation)
        raise ValueError(invalid)
    return d


def _markup(v: Any) -> str:
    d = _decimal(v, "must be a decimal number such as 1.05")
    if not Decimal(1) <= d <= MAX_MARKUP:
        raise ValueError(f"must be from 1 to {MAX_MARKUP} (a price multiplier)")
    return str(d)  # money stays Decimal: carried as text, never float


_PRICE_FIELDS = {"input": "input", "output": "output", "cacheWrite": "cache_write", "cacheRead": "cache_read"}


def _prices(v: Any) -> dict[str, dict[str, str]]:
    """`{model prefix: {input, output, cacheWrite, cacheRead}}` in USD per million tokens (decimal
    text or numbers); a JSON string is accepted (an environment variable)."""
    if isinstance(v, str):
        try:
            v = orjson.loads(v)
        except orjson.JSONDecodeError:
            raise ValueError("must be a JSON object of model prices") from None
    if not isinstance(v, dict) or not v:
        raise ValueError("must be an object: {model prefix: {input, output, cacheWrite, cacheRead}}")
    out: dict[str, dict[str, str]] = {}
    for model, price in v.items():
        if not isinstance(model, str) or not model.strip():
            raise ValueError("model prefixes must be non-empty strings")
        if not isinstance(price, dict) or set(price) != set(_PRICE_FIELDS):
            raise ValueError(f"{model}: needs exactly input, output, cacheWrite and cacheRead")
        row: dict[str, str] = {}
        for name, amount in price.items():
            try:
                d = _decimal(amount, "must be a decimal number (USD per million tokens)")
            except ValueError as exc:
                raise ValueError(f"{model}.{name}: {exc}") from None
            if d < 0:
                raise ValueError(f"{model}.{name}: must be zero or more")
            if d > MAX_PRICE_PER_MTOK:
                raise ValueError(f"{model}.{name}: must be at most {MAX_PRICE_PER_MTOK} (USD per million tokens)")
            row[name] = str(d)
        out[model.strip()] = row
    return out


def _providers(v: Any) -> dict[str, Any]:
    from agentvm.services.model_catalog import check_providers  # the token API's: off the http_api cold path

    return check_providers(v)


def price_table(value: Mapping[str, Mapping[str, str]]) -> dict[str, ModelPrice]:
    """The shipped list prices with the configured rows over them (by model prefix)."""
    table = dict(DEFAULT_PRICES)
    for model, row in value.items():
        table[model] = ModelPrice(**{_PRICE_FIELDS[k]: Decimal(a) for k, a in row.items()})
    return table


@dataclass(frozen=True, slots=True)
class ConfigKey:
    name: str
    check: Callable[[Any], Any]  # the normalized value, or ValueError(reason)
    default: Any
    env: tuple[str, ...]
    description: str
    secret: bool = False
    applies: str = "next_turn"  # or "restart"


def registry(defaults: Mapping[str, Any]) -> dict[str, ConfigKey]:
    """The known keys; `defaults` gives the built-in value of each (from the server's settings)."""
    keys = [
        ConfigKey("llm.model", _text, defaults["llm.model"], ("AVM_LLM_MODEL",),
                  "Model for images that do not name one."),
        ConfigKey("llm.maxTokens", _int_in(1, 200_000), defaults["llm.maxTokens"], ("AVM_LLM_MAX_TOKENS",),
                  "max_tokens of each LLM call for images that do not set it."),
        ConfigKey("llm.apiKey", _text, None, ("LLM_API_KEY", "AVM_LLM_API_KEY", "ANTHROPIC_API_KEY"),
                  "Anthropic API key.", secret=True, applies="restart"),
        ConfigKey("llm.baseUrl", _url, None, ("AVM_LLM_BASE_URL",), "Override of the Anthropic API base URL.",
                  applies="restart"),
        ConfigKey("llm.providers", _providers, {}, ("AVM_LLM_PROVIDERS",),
                  "The token API's further providers (docs/token-api.md): {name: {type: openai | anthropic | "
                  "bedrock, baseUrl, apiKeyEnv (the variable holding its key), models: {model: {input, output, "
                  "cacheRead, cacheWrite (USD per million tokens), contextWindow, maxOutput}}}}; their models are "
                  "named name/model."),
        ConfigKey("system.maxToolIterations", _int_in(1, 1000), defaults["system.maxToolIterations"],
                  ("AVM_MAX_TOOL_ITERATIONS",), "LLM calls allowed in one turn."),
        ConfigKey("system.streamFlushMs", _int_in(0, 5000), defaults["system.streamFlushMs"],
                  ("AVM_STREAM_FLUSH_MS",), "Text-delta coalescing window in ms."),
        ConfigKey("system.streamMaxFlushMs", _int_in(0, 10_000), defaults["system.streamMaxFlushMs"],
                  ("AVM_STREAM_MAX_FLUSH_MS",), "Upper bound of the growing coalescing window in ms."),
        ConfigKey("defaults.markup", _markup, defaults["defaults.markup"], ("AVM_MARKUP",),
                  "Billed price = list price × markup (decimal)."),
        ConfigKey("billing.prices", _prices, prices_wire(DEFAULT_PRICES), ("AVM_PRICES",),
                  f"List prices, USD per million tokens, by model prefix (the longest prefix of the model "
                  f"name wins); rows set here replace or add to the shipped Anthropic list prices (taken on "
                  f"{PRICES_TAKEN_ON})."),
    ]
    return {k.name: k for k in keys}


def _merged(layers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each key's value from the highest layer that has it."""
    out: dict[str, Any] = {}
    for layer in LAYERS:
        out.update(layers[layer])
    return out


# keys whose value is itself a mapping (the file gives it nested, not flattened)
MAPPING_KEYS = frozenset({"billing.prices", "llm.providers"})


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in doc.items():
        path = f"{prefix}{name}"
        if isinstance(value, Mapping) and path not in MAPPING_KEYS:
            out.update(flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


# How long the token API's catalog is reused before the layers are read again: a change made here
# (`set`, `unset`) applies at once, one made elsewhere (another process or instance writing the same
# store, an SSM parameter put by hand) within this. Reading the layers per call cost ~0.2 ms on
# `avm serve` (docs/benchmarks.md, token API overhead).
CATALOG_CACHE_S = 1.0


class ConfigService:
    def __init__(self, keys: dict[str, ConfigKey], store: ConfigStore, env: Env, *,
                 file: Path | None = None, overrides: Mapping[str, Any] | None = None,
                 catalog_cache_s: float = CATALOG_CACHE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.keys = keys
        self.store = store
        self.env = env
        self.file = file
        self.overrides = dict(overrides or {})  # `avm serve` flags: part of the env layer
        self._file_values: dict[str, Any] | None = None
        self._ignored: set[tuple[str, str]] = set()  # invalid runtime values already logged
        self._catalog_cache_s = catalog_cache_s
        self._clock = clock
        self._generation = 0  # changes made through this service; a cached catalog of another is stale
        # (anthropic, its base URL): (generation, read at, (catalog, markup))
        self._catalogs: dict[tuple[bool, str | None], tuple[int, float, tuple[ModelCatalog, Decimal]]] = {}

    # ---- layers ----------------------------------------------------------------------------------

    async def load_file(self) -> dict[str, Any]:
        """The file layer, validated (read once; a bad file stops the server with the key and reason)."""
        if self._file_values is None:
            self._file_values = await self._read_file()
        return self._file_values

    async def _read_file(self) -> dict[str, Any]:
        if self.file is None or not self.file.exists():
            return {}
        import yaml

        where = str(self.file)
        try:
            doc = yaml.safe_load(self.file.read_text()) or {}
        except yaml.YAMLError as exc:
            # the problem and where, never PyYAML's snippet of the line: it may hold a secret
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or "cannot be parsed"
            raise InvalidRequest(f"{where}: not valid YAML{at}: {problem}") from None
        if not isinstance(doc, Mapping):
            raise InvalidRequest(f"{where}: must be a mapping with llm, system, defaults and billing sections")
        values: dict[str, Any] = {}
        for name, raw in flatten(doc).items():
            key = self._key(name, where=f"{where}: ")
            if isinstance(raw, str):
                raw = await self._interpolate(raw, f"{where}: {name}")
            values[name] = self._check(key, raw, where=f"{where}: ")
        return values

    async def _interpolate(self, text: str, where: str) -> str:
        out, last = [], 0
        for m in _VAR.finditer(text):
            value = await self.env.get(m.group(1))
            if value is None:
                raise InvalidRequest(f"{where}: ${{{m.group(1)}}} is not set in the environment")
            out += [text[last:m.start()], value]
            last = m.end()
        return "".join([*out, text[last:]])

    async def _env_values(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for key in self.keys.values():
            raw: Any = self.overrides.get(key.name)
            source = "an `avm serve` flag"
            if raw is None:
                for name in key.env:
                    found = await self.env.get(name)
                    if found:
                        raw, source = found, name
                        break
            if raw is not None:
                try:
                    values[key.name] = key.check(raw)
                except ValueError as exc:
                    raise InvalidRequest(f"invalid setting {key.name} ({source}): {exc}", field=key.name) from None
        return values

    async def check_startup(self) -> None:
        """Validate the file and environment layers (InvalidRequest naming the key and the variable):
        `avm serve` calls it before anything listens, so that a bad value never reaches a turn."""
        await self.load_file()
        await self._env_values()

    async def _runtime_values(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, text in (await self.store.runtime_values()).items():
            key = self.keys.get(name)
            if key is None:
                continue  # a key this version no longer knows
            try:
                values[name] = key.check(orjson.loads(text))
            except (ValueError, orjson.JSONDecodeError):
                # written by another version with other rules, or outside the API (an SSM parameter
                # put by hand): the lower layers apply. The value is never logged (it may be secret).
                if (name, text) not in self._ignored:  # once per value, not at every turn
                    self._ignored.add((name, text))
                    log.warning("config: a stored runtime value is invalid and ignored", extra={"config_key": name})
                continue
        return values

    async def layers(self) -> dict[str, dict[str, Any]]:
        return {"default": {k.name: k.default for k in self.keys.values() if k.default is not None},
                "file": await self.load_file(), "env": await self._env_values(),
                "runtime": await self._runtime_values()}

    # ---- reading ---------------------------------------------------------------------------------

    async def describe(self, name: str | None = None) -> dict[str, Any]:
        """Every key (or one): its value (masked if secret), source, layers, and when it applies."""
        layers = await self.layers()
        names = [self._key(name).name] if name is not None else list(self.keys)
        out: dict[str, Any] = {}
        for n in names:
            key = self.keys[n]
            source = next((layer for layer in reversed(LAYERS) if n in layers[layer]), None)
            shown = {layer: self._shown(key, layers[layer][n]) for layer in LAYERS if n in layers[layer]}
            out[n] = {"value": shown.get(source) if source else None, "source": source, "layers": shown,
                      "secret": key.secret, "appliesAt": key.applies.replace("_", " "),
                      "description": key.description}
        return out

    async def engine_options(self, base: EngineOptions) -> EngineOptions:
        """The options of the next turn: `base` with the keys that apply at the next turn."""
        layers = await self.layers()
        v = _merged(layers)
        # the offline driver's "scripted" stands unless a model was configured explicitly
        chosen = any("llm.model" in layers[layer] for layer in LAYERS[1:])
        return dataclasses.replace(
            base, default_model=v["llm.model"] if chosen or base.default_model != "scripted" else base.default_model,
            max_tokens=v["llm.maxTokens"], max_iterations=v["system.maxToolIterations"],
            flush_ms=v["system.streamFlushMs"], max_flush_ms=v["system.streamMaxFlushMs"],
            markup=Decimal(v["defaults.markup"]), prices=price_table(v["billing.prices"]))

    async def catalog(self, *, anthropic: bool, anthropic_base_url: str | None = None) -> tuple[ModelCatalog, Decimal]:
        """The token API's model catalog as configured now, and the markup (services/model_catalog.py):
        built again after a change made here, else reused for up to `CATALOG_CACHE_S`."""
        from agentvm.services.model_catalog import build_catalog

        now, key, generation = self._clock(), (anthropic, anthropic_base_url), self._generation
        cached = self._catalogs.get(key)
        if cached is not None and cached[0] == generation and 0 <= now - cached[1] < self._catalog_cache_s:
            return cached[2]
        v = _merged(await self.layers())
        catalog = build_catalog(price_table(v["billing.prices"]), v.get("llm.providers") or {}, anthropic=anthropic,
                                anthropic_base_url=anthropic_base_url)
        built = catalog, Decimal(v["defaults.markup"])
        self._catalogs[key] = (generation, now, built)
        return built

    async def changes(self, limit: int = 100) -> list[ConfigChange]:
        return await self.store.changes(limit)

    # ---- writing ---------------------------------------------------------------------------------

    async def set(self, name: str, value: Any, *, actor: str) -> dict[str, Any]:
        key = self._key(name)
        checked = self._check(key, value)
        before = (await self._runtime_values()).get(key.name)
        text = orjson.dumps(checked).decode()
        change = ConfigChange(key.name, self._audit(key, before), self._audit(key, checked), actor, now_ms())
        await self.store.set_value(key.name, text, secret=key.secret, change=change)
        self._generation += 1  # (after the write: a catalog read meanwhile was kept with the one before)
        return await self.describe(key.name)

    async def unset(self, name: str, *, actor: str) -> dict[str, Any]:
        key = self._key(name)
        before = (await self._runtime_values()).get(key.name)
        if before is not None:
            change = ConfigChange(key.name, self._audit(key, before), None, actor, now_ms())
            await self.store.set_value(key.name, None, secret=key.secret, change=change)
            self._generation += 1
        return await self.describe(key.name)

    # ---- helpers ---------------------------------------------------------------------------------

    def _key(self, name: str, *, where: str = "") -> ConfigKey:
        key = self.keys.get(name)
        if key is None:
            if where:
                raise InvalidRequest(f"{where}{name}: unknown key (known: {', '.join(self.keys)})", field=name)
            raise NotFound(f"Unknown config key: {name} (known: {', '.join(self.keys)})", field="key")
        return key

    @staticmethod
    def _check(key: ConfigKey, value: Any, *, where: str = "") -> Any:
        try:
            return key.check(value)
        except ValueError as exc:
            raise InvalidRequest(f"{where}{key.name}: {exc}", field=key.name) from None

    @staticmethod
    def _shown(key: ConfigKey, value: Any) -> Any:
        return MASK if key.secret and value is not None else value

    @staticmethod
    def _audit(key: ConfigKey, value: Any) -> str | None:
        if value is None:
            return None
        return orjson.dumps(MASK if key.secret else value).decode()


# config keys backed by a setting: its field default is the built-in layer; a value that differs
# (from the environment or an `avm serve` flag) belongs to the env layer
SETTING_KEYS = {"llm.model": "llm_model", "llm.maxTokens": "llm_max_tokens",
                "system.maxToolIterations": "max_tool_iterations", "system.streamFlushMs": "stream_flush_ms",
                "system.streamMaxFlushMs": "stream_max_flush_ms"}


def from_settings(settings: Settings, store: ConfigStore, env: Env, *, file: Path | None) -> ConfigService:
    """The config center of a runtime: built-in defaults from the settings model, the runtime's own
    settings (environment, flags) as the env layer."""
    fields = type(settings).model_fields
    defaults: dict[str, Any] = {key: fields[name].default for key, name in SETTING_KEYS.items()}
    defaults["defaults.markup"] = str(DEFAULT_MARKUP)
    overrides = {key: getattr(settings, name) for key, name in SETTING_KEYS.items()
                 if getattr(settings, name) != fields[name].default}
    return ConfigService(registry(defaults), store, env, file=file, overrides=overrides)


class _NoRuntimeLayer:
    """A `ConfigStore` for checking the lower layers before the database is open."""

    async def runtime_values(self) -> dict[str, str]:
        return {}

    async def set_value(self, key: str, value_json: str | None, *, secret: bool, change: ConfigChange) -> None:
        raise RuntimeError("no runtime layer here")

    async def changes(self, limit: int = 100) -> list[ConfigChange]:
        return []


async def check_startup(settings: Settings, env: Env, *, file: Path | None) -> None:
    """Validate the config file and the environment (InvalidRequest naming the key and the variable)
    before anything is built or opened: `avm serve` stops with that one line."""
    await from_settings(settings, _NoRuntimeLayer(), env, file=file).check_startup()
