"""Powertools Logger, Metrics (CloudWatch EMF) and Tracer for the Lambda handlers.

Each handler module makes one `Observability` at import (`observe("chat_turn")`) and decorates its
entry point with `@obs.handler`. Per invocation that:

* adds the Lambda context to every log line (`function_name`, `function_request_id`, `cold_start`,
  and the WebSocket `connection_id` when there is one), and removes it afterwards;
* collects the business metrics the handler records with `obs.metric(...)` and writes them to
  stdout as EMF blobs at the end of the invocation, whatever happened (one blob per dimension set);
* runs under the powertools `Tracer` when tracing is on (see `tracing_enabled`).

Logging. Our modules log with stdlib `logging` and `extra={...}`. In a Lambda execution environment
the powertools Logger's handler becomes the root handler (Lambda's own plain-text handler goes), so
every record, ours and the libraries', is one powertools JSON line on stdout with its extras as keys
(plus `logger`, the record's logger name, as `agentvm.logs.JsonFormatter` has it). Outside Lambda
(tests, `avm serve`, the bench) the logging configuration is left alone: `install_root_handler()`
does the take-over explicitly.

Metrics. Namespace `AgentVM` (POWERTOOLS_METRICS_NAMESPACE), dimension `service` = `agentvm` and
`function` = the handler's name, and no other: each distinct dimension value is a separate custom
metric billed $0.30 a month, so a metric is a total an operator alarms on or graphs, and every
breakdown (model family, status, tier, reason, tenant) is a field of the log line beside it, for
CloudWatch Logs Insights (docs/observability.md, "Cloud metrics"). `DIMENSIONS` is enforced. A
per-invocation collector (powertools' `EphemeralMetrics` at flush) is used rather than the `Metrics`
singleton, whose class-level state is shared by every thread (the test harness runs warm
environments as threads).

Tracing. The powertools Tracer needs `aws-xray-sdk` (about 300-400 ms to import), which the layer does
not ship. Tracing is on only in a Lambda environment, with the SDK installed and without
`POWERTOOLS_TRACE_DISABLED`; otherwise it is a no-op that imports nothing. Even then the Tracer is built
at the first invocation, not at import, so the import of a handler never pays for the SDK.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import orjson
from aws_lambda_powertools.logging import Logger
from aws_lambda_powertools.logging.filters import SuppressFilter
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

from agentvm import logs
from agentvm.domain.models import Turn, TurnStatus
from agentvm.logs import REDACTED, redact
from agentvm.observability import tracing

SERVICE: Final = "agentvm"
NAMESPACE: Final = "AgentVM"

#: The only dimension a metric carries (set by the collector): the handler, ws_connect, chat_turn, …
DIMENSIONS: Final = frozenset({"function"})

Count: Final = MetricUnit.Count
Milliseconds: Final = MetricUnit.Milliseconds

log = logging.getLogger(__name__)

H = TypeVar("H", bound=Callable[..., Any])
_TRUTHY = frozenset({"1", "true", "yes", "on", "y", "t"})


class _Stdout:
    """A stream that writes to whatever `sys.stdout` is at the time (pytest swaps it per test)."""

    def write(self, text: str) -> int:
        return sys.stdout.write(text)

    def flush(self) -> None:
        sys.stdout.flush()


class _LoggerName(logging.Filter):
    """Adds `logger` (the record's logger name) to every line, as agentvm.logs.JsonFormatter does."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.logger = record.name
        return True


def _dumps(line: Mapping[str, Any]) -> str:
    """One log line as JSON, with secrets redacted exactly as `agentvm.logs.JsonFormatter` does: extras
    named like a secret, and credentials anywhere in a string value (message, extras, exception)."""
    out = {k: REDACTED if logs._secret_name(k) else redact(v) if isinstance(v, str) else v for k, v in line.items()}
    return orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def _level() -> str:
    return (os.environ.get("AVM_LOG_LEVEL") or os.environ.get("POWERTOOLS_LOG_LEVEL") or "INFO").upper()


def in_lambda() -> bool:
    """True in a Lambda execution environment (the runtime API is only there, not in the bench or tests)."""
    return bool(os.environ.get("AWS_LAMBDA_RUNTIME_API")) and bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME"))


def _build_logger() -> tuple[Logger, logging.Handler]:
    """The powertools Logger (JSON lines on stdout) with its handler detached: `install_root_handler`
    puts the handler on the root logger. Logger() also sets the `agentvm` logger's level and filters
    the root handlers; both are undone so that merely importing a handler changes no logging."""
    named = logging.getLogger(SERVICE)
    level_before = named.level
    handler: logging.Handler = logging.StreamHandler(_Stdout())
    handler.addFilter(_LoggerName())
    logger = Logger(service=SERVICE, level=_level(), logger_handler=handler, json_serializer=_dumps,
                    log_record_order=["timestamp", "level", "logger", "message"], utc=True)
    named.removeHandler(handler)
    named.setLevel(level_before)
    for h in logging.getLogger().handlers:
        for f in list(h.filters):
            if isinstance(f, SuppressFilter) and f.logger == SERVICE:
                h.removeFilter(f)
    return logger, handler


LOGGER, _HANDLER = _build_logger()


def install_root_handler(level: str | None = None) -> None:
    """Make the powertools handler the root logger's only handler (done at import in Lambda), and turn
    the HTTP client libraries' request logging (full URLs, query tokens included) down to WARNING."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(_HANDLER)
    root.setLevel((level or _level()).upper())
    logs.quiet_libraries()


if in_lambda():
    install_root_handler()


# ---- tracing ---------------------------------------------------------------------------------------------

def tracing_enabled() -> bool:
    """Tracing runs in Lambda, with aws-xray-sdk installed, unless POWERTOOLS_TRACE_DISABLED is set.
    (`find_spec` looks the package up without importing it.)"""
    if os.environ.get("POWERTOOLS_TRACE_DISABLED", "").strip().lower() in _TRUTHY:
        return False
    if not os.environ.get("LAMBDA_TASK_ROOT") or os.environ.get("AWS_SAM_LOCAL"):
        return False  # powertools' own rule: no X-Ray daemon outside Lambda
    return importlib.util.find_spec("aws_xray_sdk") is not None


_tracer_lock = threading.Lock()
_tracer: Any = None
_tracer_decided = False


def tracer() -> Any:
    """The powertools Tracer, built on first use when `tracing_enabled()`; None otherwise."""
    global _tracer, _tracer_decided
    with _tracer_lock:
        if not _tracer_decided:
            if tracing_enabled():
                from aws_lambda_powertools.tracing import Tracer

                _tracer = Tracer(service=SERVICE)
            _tracer_decided = True
        return _tracer


# ---- metrics ---------------------------------------------------------------------------------------------

class InvocationMetrics:
    """The metrics of one invocation, grouped by dimension set; `flush` writes one EMF blob per set."""

    def __init__(self, function: str) -> None:
        self.function = function
        # dimensions (sorted items) → metric name → (unit, values)
        self._sets: dict[tuple[tuple[str, str], ...], dict[str, tuple[MetricUnit, list[float]]]] = {}

    def add(self, name: str, unit: MetricUnit, value: float, **dimensions: str) -> None:
        unknown = set(dimensions) - DIMENSIONS
        if unknown:
            raise ValueError(f"metric {name}: dimension(s) {sorted(unknown)} are not allowed: every "
                             f"dimension value is a billed metric; put breakdowns in log fields "
                             f"(allowed: {sorted(DIMENSIONS)})")
        dims = {"function": self.function, **{k: v or "none" for k, v in dimensions.items()}}
        metrics = self._sets.setdefault(tuple(sorted(dims.items())), {})
        metrics.setdefault(name, (unit, []))[1].append(float(value))

    def __bool__(self) -> bool:
        return bool(self._sets)

    def flush(self) -> None:
        """Print the EMF blobs (powertools serialises and validates them) and forget them."""
        sets, self._sets = self._sets, {}
        for dims, metrics in sets.items():
            emf = EphemeralMetrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or NAMESPACE,
                                   service=os.environ.get("POWERTOOLS_SERVICE_NAME") or SERVICE)
            for key, value in dims:
                emf.add_dimension(name=key, value=value)
            for name, (unit, values) in metrics.items():
                for v in values:
                    emf.add_metric(name=name, unit=unit, value=v)
            emf.flush_metrics()


#: What `record_turns` emits per turn (totals; the engine's "turn finished" log line has the
#: breakdowns: status, tier, model, model_family, cache tokens, tenant).
TURN_METRICS: Final = ("TurnsRun", "TurnDuration", "TurnErrors", "InputTokens", "OutputTokens")


def record_turns(metric: Callable[..., None], turns: Sequence[Turn]) -> None:
    """Business metrics of the turns one session run ran (`chat_turn`, a turn host): `metric` is
    `Observability.metric` or `InvocationMetrics.add`. Totals only (see `TURN_METRICS`)."""
    for turn in turns:
        metric("TurnsRun", Count, 1)
        if turn.duration_ms is not None:
            metric("TurnDuration", Milliseconds, turn.duration_ms)
        if turn.status == TurnStatus.FAILED:
            metric("TurnErrors", Count, 1)
        metric("InputTokens", Count, turn.usage.input_tokens)
        metric("OutputTokens", Count, turn.usage.output_tokens)


def status_class(status: int | None) -> str:
    return f"{status // 100}xx" if isinstance(status, int) and 100 <= status <= 599 else "none"


# ---- the handler wrapper ---------------------------------------------------------------------------------

class _Current(threading.local):
    metrics: InvocationMetrics | None = None


class Observability:
    """Logger, metrics and tracer of one Lambda function (`observe(name)`)."""

    def __init__(self, function: str) -> None:
        self.function = function
        self.logger = LOGGER
        self._current = _Current()
        self._cold = True

    def metric(self, name: str, unit: MetricUnit, value: float, **dimensions: str) -> None:
        """Record a metric for this invocation (outside one, e.g. at import, it is dropped)."""
        current = self._current.metrics
        if current is None:
            log.debug("metric outside an invocation dropped", extra={"metric": name})
            return
        current.add(name, unit, value, **dimensions)

    def handler(self, fn: H) -> H:
        """Decorate a Lambda entry point `fn(event, context)`."""
        traced: Callable[..., Any] | None = None

        @functools.wraps(fn)
        def invoke(event: Any, context: Any) -> Any:
            nonlocal traced
            if traced is None:
                t = tracer()
                traced = t.capture_lambda_handler(fn, capture_response=False) if t is not None else fn
            keys = self._context_keys(event, context)
            self.logger.thread_safe_append_keys(**keys)
            self._current.metrics = metrics = InvocationMetrics(self.function)
            try:
                with tracing.span(self.function, _invocation_attributes(self.function, keys, event),
                                  carrier=_trace_carrier(event)):
                    return traced(event, context)
            finally:
                tracing.flush()  # OpenTelemetry spans leave before the environment is frozen
                self._current.metrics = None
                try:
                    if metrics:
                        metrics.flush()
                except Exception:  # metrics never fail an invocation
                    log.exception("metrics flush failed", extra={"function": self.function})
                self.logger.thread_safe_remove_keys(keys)

        return invoke  # type: ignore[return-value]

    def _context_keys(self, event: Any, context: Any) -> dict[str, Any]:
        cold, self._cold = self._cold, False
        keys: dict[str, Any] = {
            "cold_start": cold,
            "function": self.function,
            "function_name": getattr(context, "function_name", None) or os.environ.get("AWS_LAMBDA_FUNCTION_NAME"),
            "function_memory_size": getattr(context, "memory_limit_in_mb", None),
            "function_arn": getattr(context, "invoked_function_arn", None),
            "function_request_id": getattr(context, "aws_request_id", None),
        }
        request = event.get("requestContext") if isinstance(event, dict) else None
        if isinstance(request, dict):
            keys["connection_id"] = request.get("connectionId")
            keys["api_request_id"] = request.get("requestId")
        return {k: v for k, v in keys.items() if v is not None}


def _trace_carrier(event: Any) -> Mapping[str, Any] | None:
    """Where a caller's W3C traceparent is: an API Gateway event's headers, or (chat_turn's invoke from
    LambdaDispatcher) the payload itself."""
    if not isinstance(event, dict):
        return None
    headers = event.get("headers")
    return headers if isinstance(headers, dict) else event


def _invocation_attributes(function: str, keys: Mapping[str, Any], event: Any) -> dict[str, tracing.Value]:
    """The FaaS semantic-convention attributes of an invocation's OpenTelemetry span."""
    request = event.get("requestContext") if isinstance(event, dict) else None
    trigger = "http" if isinstance(request, dict) else "other"
    return {"faas.name": function, "faas.trigger": trigger, "faas.invocation_id": keys.get("function_request_id"),
            "faas.coldstart": bool(keys.get("cold_start")), "cloud.provider": "aws",
            "agentvm.connection_id": keys.get("connection_id")}


def observe(function: str) -> Observability:
    """The observability of one handler module, made at its import."""
    return Observability(function)
