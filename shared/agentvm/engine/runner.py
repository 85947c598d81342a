"""Runs one turn: LLM calls and the tool loop, emitting events in the order of spec §3.9 and
persisting each message exactly once, at checkpoints (never per delta).

Event order (AgentVM fixes to the reference in brackets):
  message_start, conversation_start, text_delta [merged per flush window],
  conversation_responding [once per LLM message], tool_use_start, tool_planned, input_json_delta,
  tool_use_stop [real ids and input], tool_call_message, message_stop, assistant_message,
  [tool_executing with the input, when the tool runs], tool_result, tool_result_message, …,
  conversation_end [reason "interrupted" after an interrupt], [turn_response with usage and cost].
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson

from agentvm.domain.models import (
    Checkpoint,
    Image,
    StoredMessage,
    Turn,
    TurnStatus,
    Usage,
)
from agentvm.domain.usage import Hold, UnitPrices, model_family
from agentvm.drivers.base import (
    HiddenOutput,
    InputJsonDelta,
    LLMRequest,
    MessageStart,
    MessageStop,
    TextDelta,
    ToolOutcome,
    ToolUseStart,
    ToolUseStop,
    UsageUpdate,
)
from agentvm.drivers.token_bounds import billed_usage
from agentvm.engine.channel import SessionChannel
from agentvm.engine.coalescer import DeltaCoalescer
from agentvm.engine.history import SessionHistory
from agentvm.errors import AgentVMError, UpstreamError
from agentvm.ids import message_id, now_ms
from agentvm.money import DEFAULT_MARKUP, Cost, ModelPrice, cost_of, money_text, price_for
from agentvm.observability import tracing
from agentvm.ports import CallMeter, Driver, Store, ToolRunner
from agentvm.protocol import events as wire
from agentvm.protocol import messages as msgs

log = logging.getLogger(__name__)
JSON = dict[str, Any]


@dataclass(slots=True)
class EngineOptions:
    default_model: str
    max_tokens: int
    flush_ms: int = 0
    max_flush_ms: int = 0
    max_iterations: int = 25
    markup: Decimal = DEFAULT_MARKUP
    # list prices per model prefix (None: agentvm.money.DEFAULT_PRICES)
    prices: Mapping[str, ModelPrice] | None = None
    tier: str = "function"  # "function": sandbox tools escalate the turn; "container": they run here
    # A tool result's JSON text is kept under this size, so its `tool_result` and `tool_result_message`
    # frames each stay within one 32 KB API Gateway unit (the envelope takes the rest).
    max_result_bytes: int = 24 * 1024


@dataclass(slots=True)
class _Call:
    id: str
    name: str
    input: JSON
    result: ToolOutcome | None


@dataclass(slots=True)
class _Msg:
    """What one LLM call has produced so far."""

    message_id: str | None = None
    model: str | None = None
    started_at: int = 0
    text: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    stop_reason: str | None = None
    usage: Usage = field(default_factory=Usage)  # as the provider last reported it
    # UTF-8 bytes of output streamed since the provider last reported the output count: billed as
    # tokens (an upper bound) if the stream ends without a final count, and the usage marked estimated
    unreported_bytes: int = 0
    final: bool = False  # the message ended with the provider's final usage
    estimated: bool = False
    cost: Cost = field(default_factory=lambda: Cost(Decimal(0), Decimal(0)))  # set when counted
    responding_sent: bool = False
    counted: bool = False
    coalescer: DeltaCoalescer | None = None


class TurnRunner:
    def __init__(self, *, store: Store, driver: Driver, channel: SessionChannel, tools: ToolRunner,
                 options: EngineOptions, history: SessionHistory, meter: CallMeter | None = None,
                 observer: Callable[[Turn, int | None], None] | None = None) -> None:
        self.store = store
        self.meter = meter
        self.observer = observer
        self.history = history
        self.driver = driver
        self.channel = channel
        self.tools = tools
        self.options = options
        self._unsaved: list[StoredMessage] = []
        self._child: asyncio.Task[Any] | None = None
        self._interrupted = False
        self._turn_id: str | None = None
        self._usage = Usage()
        # the turn's cost: the sum of its calls' costs, each at the model that answered it (= the ledger)
        self._list, self._billed = Decimal(0), Decimal(0)
        self._llm_calls = 0
        self._started_here = now_ms()  # this tier's start: its sandbox time in the container tier
        self._first_delta_at: int | None = None
        self._stop_reason: str | None = None
        self.escalated = False

    def interrupt(self) -> None:
        self._interrupted = True
        if self._child is not None and not self._child.done():
            self._child.cancel()

    async def run(self, turn: Turn, image: Image) -> Turn:
        """Run a queued turn. In the function tier the turn may stop early, escalated (`escalated`):
        its model asked for a tool that needs a sandbox, and everything up to that call is stored for
        the container tier to `resume`."""
        turn.status = TurnStatus.RUNNING
        turn.started_at = now_ms()
        turn.tier = self.options.tier
        return await self._drive(turn, image, pending=None, fresh=True)

    async def resume(self, turn: Turn, image: Image) -> Turn:
        """Continue an escalated turn from the store: run its pending tool calls, then go on. Its events
        continue the session's seq order (the channel starts where the escalating tier stopped)."""
        turn.status = TurnStatus.RUNNING
        turn.tier = self.options.tier
        self._usage = turn.usage
        self._list, self._billed = Decimal(turn.list_cost), Decimal(turn.billed_cost)
        messages = [m for m in await self.history.load() if m.turn_id == turn.turn_id]
        answered = {m.body.get("toolCallId") for m in messages if m.subtype == "tool-result"}
        calls = [m.body.get("toolCall") or {} for m in messages if m.subtype == "tool-call"]
        pending = [_Call(str(c.get("id")), str(c.get("name")), dict(c.get("input") or {}), None)
                   for c in calls if c.get("id") not in answered]
        self._llm_calls = len({m.body.get("parentId") or m.message_id for m in messages
                               if m.subtype in ("tool-call", "assistant")})
        return await self._drive(turn, image, pending=pending)

    async def _drive(self, turn: Turn, image: Image, *, pending: list[_Call] | None, fresh: bool = False) -> Turn:
        with tracing.span("turn", {
                "agentvm.tenant_id": turn.tenant_id, "agentvm.session_id": turn.session_id,
                "agentvm.turn_id": turn.turn_id, "agentvm.image_id": turn.image_id,
                "agentvm.container_id": turn.container_id, "agentvm.tier": self.options.tier,
                "agentvm.resumed": not fresh}, origin=turn.turn_id) as span:
            try:
                return await self._drive_turn(turn, image, pending=pending, fresh=fresh)
            finally:
                tracing.set_attributes(span, {
                    "agentvm.status": str(turn.status), "agentvm.stop_reason": self._stop_reason,
                    "agentvm.escalated": self.escalated, "agentvm.error_code": turn.error_code,
                    "gen_ai.response.model": turn.model, "gen_ai.usage.input_tokens": self._usage.input_tokens,
                    "gen_ai.usage.output_tokens": self._usage.output_tokens, "agentvm.llm_calls": self._llm_calls,
                    "agentvm.cost_usd": self._billed, "agentvm.list_cost_usd": self._list})

    async def _drive_turn(self, turn: Turn, image: Image, *, pending: list[_Call] | None, fresh: bool) -> Turn:
        model = str(image.config.get("model") or self.options.default_model)
        max_tokens = int(turn.options.get("maxTokens") or image.config.get("maxTokens") or self.options.max_tokens)
        temperature = turn.options.get("temperature")
        turn.model = turn.model or model
        self._turn_id = turn.turn_id
        msg = _Msg()
        end_reason = "completed"
        try:
            if fresh and self.meter is not None:
                await self.meter.admit(turn)
            await self.history.load()
            if pending:
                if await self._run_tools(pending) is None:
                    self._interrupted = True
                else:
                    await self._checkpoint(turn)
            context = self.history.context(turn.turn_id)
            while not self._interrupted:
                if self._llm_calls >= self.options.max_iterations:
                    raise UpstreamError(
                        f"The turn stopped after {self.options.max_iterations} model calls "
                        "(max_tool_iterations).", code="tool_iteration_limit")
                self._llm_calls += 1
                msg = _Msg(model=model)
                request = LLMRequest(model=model, messages=context, max_tokens=max_tokens,
                                     system=image.system_prompt, tools=self.tools.schemas(),
                                     temperature=float(temperature) if temperature is not None else None)
                await self._call(turn, request, msg)
                if self._interrupted:
                    break
                if msg.stop_reason != "tool_use" or not msg.calls:
                    break
                if self._must_escalate(msg.calls):
                    turn.usage, turn.tier = self._usage, "container"
                    await self._checkpoint(turn)
                    self.escalated = True
                    log.info("turn escalates to the container tier", extra={
                        "turn_id": turn.turn_id, "session_id": turn.session_id,
                        "tools": sorted({c.name for c in msg.calls})})
                    return turn
                context.append({"role": "assistant", "content": self._assistant_blocks(msg)})
                results = await self._run_tools(msg.calls)
                if results is None:  # interrupted while a tool ran
                    break
                context.append({"role": "user", "content": results})
                await self._checkpoint(turn)
                msg = _Msg()
            if self._interrupted:
                self._close_message(msg, interrupted=True)
                end_reason = "interrupted"
                turn.status = TurnStatus.INTERRUPTED
            else:
                turn.status = TurnStatus.COMPLETED
            self.channel.publish("conversation_end", wire.conversation_end(end_reason))
        except asyncio.CancelledError:
            # The server is shutting down: record what stands, then let the cancellation go on.
            self._close_message(msg, interrupted=True)
            turn.status = TurnStatus.INTERRUPTED
            turn.error_code, turn.error_message = "shutdown", "The server stopped during this turn."
            self.channel.publish("conversation_end", wire.conversation_end("interrupted"))
            self._count(msg)
            await self._finish(turn, msg)
            raise
        except Exception as exc:
            self._count(msg)
            self._fail(turn, msg, exc)
        await self._finish(turn, msg)
        return turn

    async def abandon(self, turn: Turn, exc: AgentVMError) -> Turn:
        """End an escalated turn that cannot go on (its container tier did not start): the error
        triple, `turn_response`, and the turn stored failed with the usage it had."""
        self._turn_id = turn.turn_id
        self._usage = turn.usage
        self._list, self._billed = Decimal(turn.list_cost), Decimal(turn.billed_cost)
        msg = _Msg()
        self._fail(turn, msg, exc)
        await self._finish(turn, msg)
        return turn

    def _must_escalate(self, calls: list[_Call]) -> bool:
        """In the function tier: does a call of this message need the container's sandbox?"""
        return self.options.tier == "function" and any(
            c.result is None and self.tools.needs_sandbox(c.name) for c in calls)

    async def _call(self, turn: Turn, request: LLMRequest, msg: _Msg) -> None:
        """One LLM call in its `llm.call` span (gen_ai.* attributes: model, tokens; never text)."""
        with tracing.span("llm.call", {
                "gen_ai.operation.name": "chat", "gen_ai.provider.name": self.driver.name,
                "gen_ai.request.model": request.model, "gen_ai.request.max_tokens": request.max_tokens,
                "agentvm.call": self._llm_calls}) as span:
            try:
                await self._metered_call(turn, request, msg)
            finally:
                u = msg.usage
                tracing.set_attributes(span, {
                    "gen_ai.response.model": msg.model, "gen_ai.response.id": msg.message_id,
                    "gen_ai.response.finish_reasons": (msg.stop_reason,) if msg.stop_reason else None,
                    "gen_ai.usage.input_tokens": u.input_tokens, "gen_ai.usage.output_tokens": u.output_tokens,
                    "gen_ai.usage.cache_read.input_tokens": u.cache_read_tokens,
                    "gen_ai.usage.cache_creation.input_tokens": u.cache_write_tokens,
                    "agentvm.usage_estimated": msg.estimated, "agentvm.cost_usd": msg.cost.billed,
                    "agentvm.list_cost_usd": msg.cost.list})

    async def _metered_call(self, turn: Turn, request: LLMRequest, msg: _Msg) -> None:
        """One LLM call: its worst case held on the budgets first, its usage settled once at the end
        (completed, failed or interrupted)."""
        hold = None
        if self.meter is not None:
            hold = await self.meter.hold(turn, request, markup=self.options.markup, prices=self.options.prices)
        status = "failed"
        try:
            await self._child_task(self._stream(request, msg))
            status = "interrupted" if self._interrupted else "completed"
        except asyncio.CancelledError:
            status = "interrupted"
            raise
        finally:
            if not msg.counted:
                msg.usage, estimated = billed_usage(msg.usage, request, unreported_bytes=msg.unreported_bytes,
                                                    started=msg.started_at > 0, final=msg.final)
                msg.unreported_bytes, msg.estimated = 0, msg.estimated or estimated
            self._count(msg)
            turn.model = msg.model or turn.model
            turn.list_cost, turn.billed_cost = money_text(self._list), money_text(self._billed)
            try:
                if hold is not None:
                    await self._settle(turn, request, msg, hold, status)
            finally:
                if msg.stop_reason is not None:
                    # The message ended (MessageStop): its last text and closing events go out after
                    # the settle, in the same tick as what follows (conversation_end, turn_response
                    # or the tool events), so a batched client gets them in one frame.
                    self._close_message(msg, interrupted=False)

    async def _settle(self, turn: Turn, request: LLMRequest, msg: _Msg, hold: Hold, status: str) -> None:
        assert self.meter is not None
        if msg.usage == Usage():
            await self.meter.release(turn, hold)  # nothing reached the provider's meter
            return
        price = price_for(msg.model or self.options.default_model, self.options.prices)  # as `_count` priced it
        await self.meter.settle(turn, hold, call=self._llm_calls, provider=self.driver.name,
                                model=msg.model or request.model, usage=msg.usage, cost=msg.cost, status=status,
                                estimated=msg.estimated,
                                prices=UnitPrices.of(price, self.options.markup))

    def _count(self, msg: _Msg) -> None:
        """Add an LLM call's usage once, whether it completed, failed or was interrupted."""
        if not msg.counted:
            msg.counted = True
            self._usage = self._usage + msg.usage
            if msg.usage != Usage():
                msg.cost = cost = cost_of(msg.usage, msg.model or self.options.default_model,
                                          markup=self.options.markup, prices=self.options.prices)
                self._list, self._billed = self._list + cost.list, self._billed + cost.billed

    # ---- one LLM call ------------------------------------------------------------------------

    async def _child_task(self, coro: Any) -> Any:
        self._child = asyncio.get_running_loop().create_task(coro)
        try:
            return await self._child
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._interrupted and (task is None or task.cancelling() == 0):
                return None
            self._child.cancel()
            raise
        finally:
            self._child = None

    async def _stream(self, request: LLMRequest, msg: _Msg) -> None:
        ch = self.channel
        async with contextlib.aclosing(self.driver.stream(request)) as stream:
            async for ev in stream:
                if isinstance(ev, TextDelta):
                    if msg.coalescer is None:
                        continue
                    msg.text.append(ev.text)
                    msg.unreported_bytes += len(ev.text.encode())
                    msg.coalescer.text(ev.text)
                    if self._first_delta_at is None:
                        self._first_delta_at = now_ms()
                    if not msg.responding_sent:
                        msg.responding_sent = True
                        ch.publish("conversation_responding", {})
                elif isinstance(ev, MessageStart):
                    msg.message_id, msg.model, msg.usage = ev.message_id, ev.model, ev.usage
                    msg.unreported_bytes = 0
                    msg.started_at = now_ms()
                    msg.coalescer = DeltaCoalescer(self.options.flush_ms, self._emit_text,
                                                   max_flush_ms=self.options.max_flush_ms)
                    ch.publish("message_start", {"messageId": ev.message_id, "model": ev.model})
                    ch.publish("conversation_start", {"messageId": ev.message_id})
                elif isinstance(ev, ToolUseStart):
                    self._flush(msg)
                    msg.unreported_bytes += len(ev.name.encode())
                    ch.publish("tool_use_start", {"toolCallId": ev.tool_call_id, "toolName": ev.name})
                    ch.publish("tool_planned", {"toolId": ev.tool_call_id, "toolName": ev.name})
                elif isinstance(ev, InputJsonDelta):
                    msg.unreported_bytes += len(ev.partial_json.encode())
                    ch.publish("input_json_delta", {"partialJson": ev.partial_json})
                elif isinstance(ev, ToolUseStop):
                    self._flush(msg)
                    msg.calls.append(_Call(ev.tool_call_id, ev.name, dict(ev.input), ev.result))
                    ch.publish("tool_use_stop", {"toolCallId": ev.tool_call_id, "toolName": ev.name,
                                                 "input": ev.input})
                    body = msgs.tool_call_message(message_id(), ev.tool_call_id, ev.name, dict(ev.input),
                                                  msg.message_id, now_ms())
                    self._keep(body)
                    ch.publish("tool_call_message", body)
                elif isinstance(ev, HiddenOutput):
                    msg.unreported_bytes += ev.nbytes
                elif isinstance(ev, UsageUpdate):
                    msg.usage = ev.usage
                    if ev.output_reported:
                        msg.unreported_bytes = 0
                elif isinstance(ev, MessageStop):
                    msg.stop_reason = ev.stop_reason or "end_turn"
                    msg.usage = ev.usage  # the final usage is authoritative: a final 0 is 0
                    if ev.usage_final:
                        msg.unreported_bytes, msg.final = 0, True
                    if msg.coalescer is not None:
                        msg.coalescer.hold()  # closed by `_call` once the call is settled

    def _emit_text(self, text: str) -> None:
        self.channel.publish("text_delta", {"text": text})

    def _flush(self, msg: _Msg) -> None:
        if msg.coalescer is not None:
            msg.coalescer.flush()

    def _close_message(self, msg: _Msg, *, interrupted: bool) -> None:
        """message_stop, then assistant_message if the message had text (spec §3.9)."""
        if msg.coalescer is None:
            return
        self._flush(msg)
        msg.coalescer = None
        stop = "end_turn" if interrupted else (msg.stop_reason or "end_turn")
        msg.stop_reason = stop
        self.channel.publish("message_stop", {"stopReason": stop})
        text = "".join(msg.text)
        if text.strip() and msg.message_id:
            body = msgs.assistant_message(msg.message_id, text, msg.started_at)
            self._keep(body)
            self.channel.publish("assistant_message", body, timestamp=msg.started_at)

    def _keep(self, body: JSON) -> None:
        self._unsaved.append(StoredMessage(self.channel.session_id, str(body["id"]), body, self._turn_id))

    @staticmethod
    def _assistant_blocks(msg: _Msg) -> list[JSON]:
        blocks: list[JSON] = []
        text = "".join(msg.text)
        if text.strip():
            blocks.append({"type": "text", "text": text})
        for c in msg.calls:
            blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": c.input})
        return blocks

    # ---- tools -------------------------------------------------------------------------------

    async def _run_tools(self, calls: list[_Call]) -> list[JSON] | None:
        results: list[JSON] = []
        for call in calls:
            with tracing.span("tool.call", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.name,
                                            "gen_ai.tool.call.id": call.id}) as span:
                outcome = call.result
                self.channel.publish("tool_executing", wire.tool_executing(call.id, call.name, call.input))
                if outcome is None:
                    ran = await self._child_task(self._run_tool(call))
                    if ran is None:
                        tracing.set_attributes(span, {"agentvm.interrupted": True})
                        return None
                    outcome = ran
                tracing.set_attributes(span, {"agentvm.tool.is_error": outcome.is_error})
            outcome = fit_result(outcome, self.options.max_result_bytes)
            self.channel.publish("tool_result", wire.tool_result(call.id, outcome.output, outcome.is_error))
            body = msgs.tool_result_message(message_id(), call.id, call.name, outcome.output, outcome.is_error,
                                            now_ms())
            self._keep(body)
            self.channel.publish("tool_result_message", body)
            value = body["toolResult"]["output"]["value"]
            results.append({"type": "tool_result", "tool_use_id": call.id, "content": value,
                            "is_error": outcome.is_error})
        return results

    async def _run_tool(self, call: _Call) -> ToolOutcome:
        try:
            return await self.tools.run(call.name, call.input)
        except AgentVMError as exc:
            return ToolOutcome(exc.message, is_error=True)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("tool failed", extra={"tool": call.name})
            return ToolOutcome(f"Tool '{call.name}' failed.", is_error=True)

    # ---- endings -----------------------------------------------------------------------------

    def _fail(self, turn: Turn, msg: _Msg, exc: Exception) -> None:
        if isinstance(exc, AgentVMError):
            code, text = exc.code, exc.message
            log.warning("turn failed", extra={"turn_id": turn.turn_id, "error_code": code})
        else:
            code, text = "internal_error", "Internal error while running the turn."
            log.exception("turn crashed", extra={"turn_id": turn.turn_id})
        self._flush(msg)
        partial = "".join(msg.text)
        if partial.strip() and msg.message_id:
            # What the user already saw stays in the history; no event, as in the reference.
            self._keep(msgs.assistant_message(msg.message_id, partial, msg.started_at))
        ch = self.channel
        ch.publish("error_received", wire.error_received(text, code))
        body = msgs.error_message(message_id(), text, code, now_ms())
        self._keep(body)
        ch.publish("error_message", body)
        ch.publish("error_occurred", wire.error_occurred(code, text))
        turn.status = TurnStatus.FAILED
        turn.error_code, turn.error_message = code, text

    async def _finish(self, turn: Turn, msg: _Msg) -> None:
        self._stop_reason = msg.stop_reason
        usage = turn.usage = self._usage
        cost = Cost(list=self._list, billed=self._billed)
        turn.list_cost, turn.billed_cost = money_text(cost.list), money_text(cost.billed)
        turn.ended_at = now_ms()
        duration = turn.ended_at - (turn.started_at or turn.ended_at)  # across tiers for an escalated turn
        if self.meter is not None and self.options.tier == "container":  # recorded before the client hears
            await self.meter.sandbox(turn, started_at=self._started_here)
        self.channel.publish("turn_response", wire.turn_response(
            turn_id=turn.turn_id, message_id=msg.message_id, duration_ms=duration, usage=usage.to_wire(),
            cost=cost.to_wire(), model=turn.model, tier=turn.tier, stop_reason=msg.stop_reason,
            status=str(turn.status), timestamp=turn.ended_at))
        await self._checkpoint(turn)
        if self.observer is not None:
            self.observer(turn, turn.first_token_ms)
        # the breakdowns the cloud's metrics leave out (dimensions are billed): Logs Insights queries these
        log.info("turn finished", extra={
            "turn_id": turn.turn_id, "session_id": turn.session_id, "container_id": turn.container_id,
            "tenant_id": turn.tenant_id, "status": str(turn.status), "model": turn.model,
            "model_family": model_family(turn.model), "tier": turn.tier, "duration_ms": duration,
            "first_token_ms": turn.first_token_ms, "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens, "cache_read_tokens": usage.cache_read_tokens,
            "cache_write_tokens": usage.cache_write_tokens})

    async def _checkpoint(self, turn: Turn) -> None:
        if turn.first_token_ms is None and self._first_delta_at and turn.started_at:
            # (an escalated turn keeps the first tier's: its first delta came there)
            turn.first_token_ms = max(0, self._first_delta_at - turn.started_at)
        events = self.channel.take_pending()
        cp = Checkpoint(turn.tenant_id, turn.session_id, messages=self._unsaved, events=events, turns=[turn])
        self._unsaved = []
        try:
            await self.store.commit(cp)
        except BaseException:
            self._unsaved = cp.messages + self._unsaved
            self.channel.restore_pending(events)
            raise
        self.history.extend(cp.messages)


def fit_result(outcome: ToolOutcome, max_bytes: int) -> ToolOutcome:
    """The outcome, its output cut so that its JSON text (escapes included) is at most `max_bytes`,
    with a note saying how much there was. A short last line in brackets (a tool's own note, such as
    where the whole output was kept) is kept after the cut. Built-in tools send a preview well below
    the limit; the cut is the guard for every other tool and for previews full of escaped bytes."""
    text = outcome.output
    if len(text) * 6 + 2 <= max_bytes or len(orjson.dumps(text)) <= max_bytes:
        return outcome
    head, _, last = text.rpartition("\n")
    tail = f"\n{last}" if head and last.startswith("[") and last.endswith("]") and len(last) <= 512 else ""
    body = head if tail else text
    note = f"\n[output truncated: {len(text.encode()):,} bytes in total]{tail}"
    budget = max_bytes - len(orjson.dumps(note))
    lo, hi = 0, min(len(body), budget)
    while lo < hi:  # the longest prefix whose JSON text fits
        mid = (lo + hi + 1) // 2
        if len(orjson.dumps(body[:mid])) - 2 <= budget:
            lo = mid
        else:
            hi = mid - 1
    return ToolOutcome(body[:lo] + note, is_error=outcome.is_error)


