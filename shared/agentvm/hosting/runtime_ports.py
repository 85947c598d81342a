"""What a composition root gives the session hosts and the use cases: the adapters it chose for the
ports, and the engine options."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from agentvm.engine.history import SessionHistory
from agentvm.engine.history_cache import HistoryCache
from agentvm.engine.runner import EngineOptions
from agentvm.engine.tools import NoToolProvider
from agentvm.ports import CallMeter, ContainerTier, Driver, Fanout, RecentMessages, Store, ToolProvider

if TYPE_CHECKING:
    from agentvm.domain.models import Image, Turn

# Told of every turn that ends (`turn`, and ms from its start to its first text delta, if any): metrics.
TurnObserver = Callable[["Turn", "int | None"], None]


class TurnOptions(Protocol):
    """Where each turn's engine options come from (the config center: changes apply to new turns)."""

    async def engine_options(self, base: EngineOptions) -> EngineOptions: ...


@dataclass(slots=True)
class RuntimePorts:
    store: Store
    fanout: Fanout
    # None where no turn runs (the cloud's `ws_default`: the driver and its key stay unloaded)
    driver: Driver | None
    options: EngineOptions
    # the function tier's tools: every tool's schema; those that need a sandbox escalate the turn
    tools: ToolProvider = field(default_factory=NoToolProvider)
    # where escalated turns go on (None: tools that need a sandbox end the turn with an error)
    container_tier: ContainerTier | None = None
    # the container tier's tools when this process hosts it (avm serve, the container task's worker)
    sandbox_tools: ToolProvider | None = None
    # None: every turn runs with `options` as built
    turn_options: TurnOptions | None = None
    # budgets, rate limits and the usage ledger (None: turns are neither limited nor recorded)
    meter: CallMeter | None = None
    turn_observer: TurnObserver | None = None
    # why this host may not run sandbox tools (no isolating sandbox, no unsafe opt-in), or None; unset
    # where no tool runs in this process (the cloud's functions: the container task's runner refuses)
    sandbox_refusal: Callable[[], str | None] | None = None
    # the process's cache of session histories and the store's reader of recent messages (the cloud's
    # runners: a turn reads only what was stored since the process last read the session)
    history_cache: HistoryCache | None = None
    recent_messages: RecentMessages | None = None
    # where `driver` is None (the cloud's ws_default): turns run on the offline scripted driver (no
    # LLM key is configured), so its model names are known ones (images.py)
    offline_llm: bool = False
    # after an image is deleted: stop what this process runs for it (its MCP servers; `avm serve`)
    image_deleted: Callable[[Image], Awaitable[object]] | None = None

    def history(self, tenant_id: str, session_id: str, expect: Collection[str] = ()) -> SessionHistory:
        """A session's history, through the process's cache when there is one; `expect`: ids of
        messages that must be in it (the user messages of the turns about to run)."""
        return SessionHistory(self.store, tenant_id, session_id, cache=self.history_cache,
                              recent=self.recent_messages, expect=expect)

    def llm(self) -> Driver:
        if self.driver is None:
            raise RuntimeError("this runtime runs no turns: it was built without an LLM driver")
        return self.driver
