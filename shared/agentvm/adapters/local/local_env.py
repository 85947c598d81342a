"""The local `Env` (the process environment) and the local `LLMProvider` (a key from it).

`ProcessEnv` reads a snapshot taken when it is built: later changes to `os.environ` are not seen,
so one composition root sees one consistent configuration. `EnvLLMProvider` takes the key given
explicitly (Settings.llm_api_key) first, then the first of its variable names that is set and not
empty. Neither ever logs a value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from agentvm.ports import Env

#: The variables that may hold the LLM key, in order (Settings.llm_api_key reads the same names).
LLM_KEY_NAMES: Final = ("LLM_API_KEY", "AVM_LLM_API_KEY", "ANTHROPIC_API_KEY")


class ProcessEnv:
    """`Env` over a snapshot of the process environment (or of the mapping given)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._values = dict(os.environ if environ is None else environ)

    async def get(self, name: str) -> str | None:
        return self._values.get(name)

    async def get_all(self, prefix: str = "") -> dict[str, str]:
        return {name: value for name, value in self._values.items() if name.startswith(prefix)}


class EnvLLMProvider:
    """`LLMProvider`: `explicit` when given, else the first non-empty variable of `names` in `env`."""

    def __init__(self, env: Env, names: Sequence[str] = LLM_KEY_NAMES, explicit: str | None = None) -> None:
        self.env = env
        self.names = tuple(names)
        self._explicit = explicit or None

    async def api_key(self) -> str | None:
        if self._explicit:
            return self._explicit
        for name in self.names:
            value = await self.env.get(name)
            if value:
                return value
        return None

    def api_key_now(self) -> str | None:
        """`api_key()` for a synchronous caller (a composition root being built), for an `Env` that
        answers without waiting (`ProcessEnv`). Raises RuntimeError for one that would have to wait."""
        coro = self.api_key()
        try:
            coro.send(None)
        except StopIteration as done:
            value: str | None = done.value
            return value
        coro.close()
        raise RuntimeError("this Env cannot be read synchronously: await api_key() instead")


if TYPE_CHECKING:
    from agentvm.ports import LLMProvider

    def _implements_env(env: ProcessEnv) -> Env:  # mypy checks the port's signatures
        return env

    def _implements_llm_provider(provider: EnvLLMProvider) -> LLMProvider:
        return provider
