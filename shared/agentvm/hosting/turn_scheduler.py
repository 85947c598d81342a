"""The scheduler: a turn runs in the cheapest tier that can run it.

A turn starts in the function tier. When the model calls a tool that needs a sandbox, the runner
stores everything up to that call (`TurnRunner.escalated`) and the turn goes on in the container tier:
here, in this process, when the runtime hosts sandboxes (`avm serve`: `RuntimePorts.sandbox_tools`), or by
starting the container's task (the cloud: the `ContainerTier` port; the worker resumes the turn from
the store under the session's lease). An image whose tools are known only inside its container
(`ContainerOnly`) starts in the container tier. Either way the turn keeps one gap-free seq order: the
container tier publishes on the session channel where the function tier stopped.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncGenerator

from agentvm.domain.models import Checkpoint, Image, Turn, TurnStatus
from agentvm.drivers.base import DriverEvent, LLMRequest
from agentvm.engine.channel import SessionChannel
from agentvm.engine.history import SessionHistory
from agentvm.engine.runner import EngineOptions, TurnRunner
from agentvm.engine.tools import ContainerOnly
from agentvm.errors import AgentVMError, ContainerUnavailable
from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.ids import now_ms
from agentvm.ports import Driver, ToolRunner

log = logging.getLogger(__name__)


class _NoCalls:
    """The driver of a runner that only ends a turn (`abandon`): it never calls the model."""

    name = "none"

    def stream(self, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
        raise RuntimeError("this runner ends a turn: it calls no model")


class ScheduledTurn:
    """One turn through the tiers; `interrupt` reaches whichever runner is current."""

    def __init__(self, deps: RuntimePorts, channel: SessionChannel, history: SessionHistory) -> None:
        self.deps = deps
        self.channel = channel
        self.history = history
        self.runner: TurnRunner | None = None
        self._interrupted = False
        self.handed_off = False  # the turn goes on in a container task (cloud): not finished here
        self.options: EngineOptions | None = None

    async def _options(self) -> None:
        """This turn's engine options, read once (the config center's current values)."""
        if self.options is None and self.deps.turn_options is not None:
            self.options = await self.deps.turn_options.engine_options(self.deps.options)

    def interrupt(self) -> None:
        self._interrupted = True
        if self.runner is not None:
            self.runner.interrupt()

    def _new_runner(self, tools: ToolRunner, tier: str, *, driver: Driver | None = None) -> TurnRunner:
        d = self.deps
        base = self.options or d.options
        options = base if base.tier == tier else dataclasses.replace(base, tier=tier)
        runner = TurnRunner(store=d.store, driver=driver or d.llm(), channel=self.channel, tools=tools, options=options,
                            history=self.history, meter=d.meter, observer=d.turn_observer)
        if self._interrupted:
            runner.interrupt()
        self.runner = runner
        return runner

    async def run(self, turn: Turn, image: Image) -> Turn:
        """Run a queued turn, from the function tier (or in the container tier, where this process is
        one: the container task's worker)."""
        try:
            await self._options()
        except AgentVMError as exc:  # the configuration cannot be read (the storage failed): answered, not hung
            log.error("turn options unavailable", extra={"turn_id": turn.turn_id, "error_code": exc.code})
            return await self.abandon(turn, exc)
        tools = await self.deps.tools.for_image(image)
        if not isinstance(tools, ContainerOnly):
            runner = self._new_runner(tools, self.deps.options.tier)
            await runner.run(turn, image)
            if not runner.escalated:
                return turn
        else:
            log.info("turn starts in the container tier", extra={"turn_id": turn.turn_id, "reason": tools.reason})
            turn.status, turn.started_at, turn.tier = TurnStatus.RUNNING, now_ms(), "container"
            await self.deps.store.commit(Checkpoint(turn.tenant_id, turn.session_id, turns=[turn]))
        return await self._escalate(turn, image)

    async def resume(self, turn: Turn, image: Image) -> Turn:
        """Continue an escalated turn in this process's container tier."""
        sandbox = self.deps.sandbox_tools
        await self._options()
        if sandbox is None:
            raise RuntimeError("this runtime hosts no sandboxes: it cannot resume a container-tier turn")
        return await self._new_runner(await sandbox.for_image(image), "container").resume(turn, image)

    async def abandon(self, turn: Turn, exc: AgentVMError) -> Turn:
        """End a turn that cannot go on: the error triple, `turn_response`, and the turn stored
        failed with the usage it had (its container tier did not start; its runner died)."""
        # no LLM call is made: a runtime without a driver (the failed-turn handler) can abandon too
        driver = self.deps.driver or _NoCalls()
        return await self._new_runner(ContainerOnly(exc.message), "function", driver=driver).abandon(turn, exc)

    async def _escalate(self, turn: Turn, image: Image) -> Turn:
        tier = self.deps.container_tier
        try:
            if tier is None:
                raise ContainerUnavailable("This runtime has no container tier: tools that need a sandbox "
                                           "cannot run.")
            await tier.start(turn.tenant_id, turn.container_id, turn.session_id)
        except AgentVMError as exc:
            log.error("container tier did not start", extra={"turn_id": turn.turn_id, "error_code": exc.code})
            return await self.abandon(turn, exc)
        if self.deps.sandbox_tools is None:
            self.handed_off = True
            return turn
        return await self.resume(turn, image)
