"""The token API's use case: one model call for a caller, metered exactly as an agent turn's LLM call.

The caller's API key picks the tenant (and key); the call is admitted against the rate limits, its
worst case held on the budgets before the upstream call (services/metering.py), and when it ends
(completed, failed, or the client went away) its one usage record is written at list × markup and
the hold replaced by the billed cost. The HTTP layers (api/openai_http.py, api/anthropic_http.py)
translate the vendors' shapes to and from the neutral `LLMRequest` and driver events.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal

from agentvm.domain.models import Principal, Turn, TurnStatus, Usage
from agentvm.domain.usage import Hold, UnitPrices
from agentvm.drivers.base import (
    DriverEvent,
    HiddenOutput,
    InputJsonDelta,
    LLMRequest,
    MessageStart,
    MessageStop,
    TextDelta,
    ToolUseStart,
    UsageUpdate,
)
from agentvm.drivers.token_bounds import billed_usage
from agentvm.errors import InvalidRequest, NotFound
from agentvm.ids import call_id, now_ms
from agentvm.money import Cost, cost_of
from agentvm.ports import CallMeter
from agentvm.services.model_catalog import CatalogModel, ModelCatalog
from agentvm.services.model_drivers import ModelDrivers

log = logging.getLogger(__name__)

TIER = "api"  # the usage records' tier: a token API call, not an agent turn


@dataclass(slots=True)
class Billed:
    """What a finished call cost; the last item a call yields (after MessageStop)."""

    usage: Usage
    cost: Cost
    record_id: str
    estimated: bool = False
    markup: Decimal = Decimal(1)  # the markup `cost` was billed at


@dataclass(slots=True)
class _Tally:
    usage: Usage = field(default_factory=Usage)
    unreported_bytes: int = 0  # output streamed since the provider last reported its output count
    started: bool = False
    stopped: bool = False
    final: bool = False  # ended with the provider's final usage

    def see(self, event: DriverEvent) -> None:
        if isinstance(event, MessageStart):
            self.usage, self.unreported_bytes, self.started = event.usage, 0, True
        elif isinstance(event, TextDelta):
            self.unreported_bytes += len(event.text.encode())
        elif isinstance(event, ToolUseStart):
            self.unreported_bytes += len(event.name.encode())
        elif isinstance(event, InputJsonDelta):
            self.unreported_bytes += len(event.partial_json.encode())
        elif isinstance(event, HiddenOutput):
            self.unreported_bytes += event.nbytes
        elif isinstance(event, UsageUpdate):
            self.usage = event.usage
            if event.output_reported:
                self.unreported_bytes = 0
        elif isinstance(event, MessageStop):
            self.usage, self.stopped = event.usage, True
            if event.usage_final:
                self.unreported_bytes, self.final = 0, True

    def billed(self, request: LLMRequest) -> tuple[Usage, bool]:
        """The usage to bill, estimated where the provider did not report it (as the engine does:
        `billed_usage`, docs/billing.md)."""
        return billed_usage(self.usage, request, unreported_bytes=self.unreported_bytes, started=self.started,
                            final=self.final)


@dataclass(slots=True)
class GatewayCall:
    """A call admitted and held: `events` streams the driver's events and ends with `Billed`. Close
    it (`aclose`) when done: a call closed early is billed for what was streamed."""

    model: CatalogModel
    call_id: str
    events: AsyncGenerator[DriverEvent | Billed, None]


class TokenGateway:
    """`catalog`: the catalog and markup as configured now; `drivers`: the provider registry; `meter`:
    budgets, rate limits and the ledger (None: unmetered, as a runtime without a ledger).

    Every call is settled (its usage record written) before its answer ends, so a process killed right
    after an answer never leaves that call unbilled; a failed, interrupted or cancelled call too."""

    def __init__(self, *, catalog: Callable[[], Awaitable[tuple[ModelCatalog, Decimal]]], drivers: ModelDrivers,
                 meter: CallMeter | None) -> None:
        self._catalog = catalog
        self._drivers = drivers
        self._meter = meter
        self._settling: set[asyncio.Future[None]] = set()  # settles under way (kept: a task is weakly held)

    async def drain(self) -> None:
        """Wait for the settles under way (a runtime stopping, before its ledger closes)."""
        while self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)

    async def models(self) -> list[CatalogModel]:
        catalog, _ = await self._catalog()
        return catalog.listed()

    async def model(self, name: str) -> CatalogModel:
        catalog, _ = await self._catalog()
        return _resolve(catalog, name)

    async def start(self, principal: Principal, name: str, request: LLMRequest, *,
                    max_tokens_param: str | None = "max_tokens") -> GatewayCall:
        """Resolve the model, admit and hold; `NotFound` (field model), `InvalidRequest`, `RateLimited`,
        `QuotaExceeded` or `NotConfigured` before anything reaches the provider. `max_tokens_param`: the
        caller's name of the field that set `max_tokens` (a 400 names it when the model cannot write
        that much); None: a default, lowered to the model's largest output."""
        catalog, markup = await self._catalog()
        model = _resolve(catalog, name)
        if max_tokens_param is None and model.max_output is not None:
            request = dataclasses.replace(request, max_tokens=min(request.max_tokens, model.max_output))
        elif model.max_output is not None and request.max_tokens > model.max_output:
            field = max_tokens_param or "max_tokens"
            raise InvalidRequest(f"{field}: {request.max_tokens} is more than {model.id} can write "
                                 f"({model.max_output})", field=field)
        driver = await self._drivers.driver_for(model, catalog)
        request = dataclasses.replace(request, model=model.upstream_model)
        prices = {model.upstream_model: model.price}
        ident = call_id()
        turn = Turn(tenant_id=principal.tenant_id, turn_id=ident, session_id="", image_id="", container_id="",
                    user_message_id="", status=TurnStatus.RUNNING, created_at=now_ms(), tier=TIER,
                    model=model.ledger_model, key_id=principal.key_id, started_at=now_ms())
        hold: Hold | None = None
        if self._meter is not None:
            await self._meter.admit(turn)
            hold = await self._meter.hold(turn, request, markup=markup, prices=prices)
        events = self._run(turn, hold, model, request, driver.stream(request), markup)
        return GatewayCall(model, ident, events)

    async def _run(self, turn: Turn, hold: Hold | None, model: CatalogModel, request: LLMRequest,
                   stream: AsyncGenerator[DriverEvent, None], markup: Decimal
                   ) -> AsyncGenerator[DriverEvent | Billed, None]:
        tally = _Tally()
        status = "failed"
        billed: Billed | None = None
        settling: asyncio.Future[None] | None = None
        try:
            async with contextlib.aclosing(stream) as events:
                async for event in events:
                    tally.see(event)
                    if isinstance(event, MessageStop) and settling is None:
                        # the message is whole and its usage final (nothing follows MessageStop): the bill is
                        # written while the driver drains the provider's answer and the caller takes this event
                        billed, settling = self._bill(turn, hold, model, request, tally, markup, "completed")
                    yield event
            status = "completed" if tally.stopped else "failed"
        except GeneratorExit:
            status = "interrupted"
            raise
        except asyncio.CancelledError:
            status = "interrupted"
            raise
        finally:
            if settling is None:
                billed, settling = self._bill(turn, hold, model, request, tally, markup, status)
            # shielded: a client that went away cancels the response, never the bill
            await asyncio.shield(settling)
        if billed is not None and status == "completed":
            yield billed

    def _bill(self, turn: Turn, hold: Hold | None, model: CatalogModel, request: LLMRequest, tally: _Tally,
              markup: Decimal, status: str) -> tuple[Billed, asyncio.Future[None]]:
        """The call's bill as it stands, and its settle started."""
        usage, estimated = tally.billed(request)
        cost = cost_of(usage, model.upstream_model, markup=markup, prices={model.upstream_model: model.price})
        billed = Billed(usage, cost, f"{turn.turn_id}#llm#1", estimated, markup)
        settling = asyncio.ensure_future(self._settle(turn, hold, model, billed, status))
        self._settling.add(settling)
        settling.add_done_callback(self._settled)
        return billed, settling

    def _settled(self, settling: asyncio.Future[None]) -> None:
        self._settling.discard(settling)
        if not settling.cancelled() and (exc := settling.exception()) is not None:
            log.error("token API: a call's settle failed", exc_info=exc)

    async def _settle(self, turn: Turn, hold: Hold | None, model: CatalogModel, billed: Billed, status: str) -> None:
        if self._meter is None or hold is None:
            return
        if billed.usage == Usage():
            await self._meter.release(turn, hold)  # nothing reached the provider's meter
            return
        await self._meter.settle(turn, hold, call=1, provider=model.provider, model=model.ledger_model,
                                 usage=billed.usage, cost=billed.cost, status=status, estimated=billed.estimated,
                                 prices=UnitPrices.of(model.price, billed.markup))


def _resolve(catalog: ModelCatalog, name: str) -> CatalogModel:
    found = catalog.resolve(name)
    if found is None:
        listed = ", ".join(m.id for m in catalog.listed()[:20])
        raise NotFound(f"model: {name[:200]} is not in this server's catalog (GET /v1/models lists: {listed})",
                       field="model")
    return found
