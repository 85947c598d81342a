"""Optional OpenTelemetry traces (docs/observability.md, "Traces").

Off by default. On when the standard variables ask for it: `OTEL_TRACES_EXPORTER` (otlp or console;
`none` is off), `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set, unless
`OTEL_SDK_DISABLED=true`. The decision is taken once per process, at the first `span()`,
`fastapi_telemetry()` or `setup()`.

Off, `span()` returns one shared object whose methods do nothing, and no opentelemetry module is
imported by this one: the Lambda cold path and the engine's hot loop pay a global read per span.
On, the SDK and the OTLP exporter (http/protobuf, the `otel` extra) are imported then, with a
`BatchSpanProcessor`; the exporter reads its own `OTEL_EXPORTER_OTLP_*` variables (headers,
timeout, compression) and the SDK its sampler (`OTEL_TRACES_SAMPLER`) and resource
(`OTEL_RESOURCE_ATTRIBUTES`); `service.name` is `OTEL_SERVICE_NAME`, else "agentvm".

The provider is this module's own, never the global one: the libraries that hold the opentelemetry
API (the anthropic SDK, mcp) then emit nothing of theirs, so no span carries message text. FastAPI's
native HTTP and WebSocket spans are given this provider (`fastapi_telemetry`). Exceptions set the
span's status and an `error.type` (the class name), never the exception's message.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, MutableMapping
from decimal import Decimal
from typing import Any, Final, Protocol

log = logging.getLogger(__name__)

SERVICE: Final = "agentvm"
Value = str | bool | int | float | Decimal | tuple[str, ...] | None


class TracingSetupError(ValueError):
    """An OTEL_* variable asks for what AgentVM cannot export (the message names it and what it accepts)."""


class SpanLike(Protocol):
    def set_attribute(self, key: str, value: Any) -> None: ...


class _NoSpan:
    """What `span()` gives when tracing is off: a context manager and a span that do nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        return None


NO_SPAN: Final = _NoSpan()

_lock = threading.Lock()
_decided = False
_tracer: Any = None
_provider: Any = None
_owned = False  # the provider was built here (not given by a test): `reset` shuts it down
# work queued in this process -> the context it was queued in (its parent when it runs): a turn runs in
# its session's task, which was started by whichever message found the session idle
_origins: OrderedDict[str, Any] = OrderedDict()
MAX_ORIGINS: Final = 1024


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Do the standard variables ask for traces?"""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(exporter or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip())


def setup(provider: Any = None) -> bool:
    """Decide once whether to trace (or, with `provider`, trace to that SDK TracerProvider: the tests'
    in-memory exporter). True when tracing is on."""
    global _decided, _tracer, _provider, _owned
    with _lock:
        if provider is not None:
            provider.add_span_processor(_redactor())
            _provider, _tracer, _decided, _owned = provider, provider.get_tracer("agentvm"), True, False
        elif not _decided:
            _decided = True
            if wanted():
                _provider = _build_provider()
                _tracer = None if _provider is None else _provider.get_tracer("agentvm")
                _owned = _provider is not None
        return _tracer is not None


def reset() -> None:
    """Forget the decision (tests): the next `span()` decides again from the environment."""
    global _decided, _tracer, _provider, _owned
    with _lock:
        if _owned:
            _provider.shutdown()
        _decided, _tracer, _provider, _owned = False, None, None, False
        _origins.clear()


def enabled() -> bool:
    return _tracer is not None if _decided else setup()


def span(name: str, attributes: Mapping[str, Value] | None = None, *, origin: str | None = None,
         carrier: Mapping[str, Any] | None = None,
         new_trace: bool = False) -> contextlib.AbstractContextManager[SpanLike]:
    """A span, current while the `with` block runs: a child of the context `remember(origin)` kept,
    else of the current one (unless that span has ended: then the root of a new trace). Attributes
    with None values are left out; a Decimal is written as its text. `carrier`: a request's headers,
    whose W3C `traceparent` (when there is one) makes the span a child of the caller's. `new_trace`:
    the root of a trace of its own, linked to the current span (a message on a long-lived connection)."""
    if not _decided:
        setup()
    tracer = _tracer
    if tracer is None:
        return NO_SPAN
    parent = None
    if origin is not None:
        with _lock:
            parent = _origins.pop(origin, None)
        if parent is None:
            parent = _unless_ended()
    if carrier is not None and any(isinstance(k, str) and k.lower() == "traceparent" for k in carrier):
        from opentelemetry import propagate

        parent = propagate.extract({k.lower(): v for k, v in carrier.items() if isinstance(v, str)})
    links = None
    if new_trace:
        from opentelemetry import context, trace

        current = trace.get_current_span().get_span_context()
        parent, links = context.Context(), [trace.Link(current)] if current.is_valid else None
    return _live(tracer, name, attributes, parent, links)


def inject(headers: MutableMapping[str, Any]) -> None:
    """Put the current span's context in `headers` (W3C traceparent, replacing any): the span a server
    opens for that request (FastAPI's) is then a child of the current one (a Lambda invocation's)."""
    if _tracer is None:
        return
    from opentelemetry import propagate

    for key in [k for k in headers if isinstance(k, str) and k.lower() in ("traceparent", "tracestate")]:
        del headers[key]
    propagate.inject(headers)


def _unless_ended() -> Any:
    """None (the current context) when its span is still open; else an empty context (a new trace): a
    long-lived task inherits the context of whatever started it, whose span ended long ago."""
    from opentelemetry import context, trace

    current = trace.get_current_span()
    return None if current.is_recording() or not current.get_span_context().is_valid else context.Context()


def remember(origin: str) -> None:
    """Keep the current context as the parent of the span that will run `origin` (a turn id) later,
    in another task of this process."""
    if not (_tracer is not None if _decided else setup()):
        return
    from opentelemetry import context

    with _lock:
        _origins[origin] = context.get_current()
        while len(_origins) > MAX_ORIGINS:
            _origins.popitem(last=False)


def set_attributes(target: SpanLike, attributes: Mapping[str, Value]) -> None:
    """Set attributes on a span from `span()` (None values left out; Decimal as text)."""
    if target is NO_SPAN:
        return
    for key, value in attributes.items():
        if value is not None:
            target.set_attribute(key, str(value) if isinstance(value, Decimal) else value)


def flush(timeout_ms: int = 5000) -> None:
    """Export what is buffered (a Lambda handler calls this before it returns). Never raises."""
    provider = _provider
    if provider is None:
        return
    try:
        provider.force_flush(timeout_ms)
    except Exception:
        log.warning("trace export failed", exc_info=True)


def fastapi_telemetry() -> Any:
    """`FastAPI(telemetry=...)`: its HTTP request and WebSocket connection spans on this module's
    provider when tracing is on (one span per request: no per-dependency spans), none otherwise."""
    if not enabled():
        return {"tracing": False}
    return {"tracer_provider": _provider, "operation_spans": False}


@contextlib.contextmanager
def _live(tracer: Any, name: str, attributes: Mapping[str, Value] | None, parent: Any,
          links: Any = None) -> Iterator[SpanLike]:
    from opentelemetry.trace import StatusCode

    with tracer.start_as_current_span(name, context=parent, links=links, record_exception=False,
                                      set_status_on_exception=False) as current:
        if attributes:
            set_attributes(current, attributes)
        try:
            yield current
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):
                current.set_attribute("error.type", type(exc).__qualname__)
                current.set_status(StatusCode.ERROR)
            raise


#: query parameters whose values a span never holds (FastAPI's HTTP span records `url.query`)
SECRET_PARAMS: Final = frozenset({"token", "key", "api_key", "apikey", "access_token", "auth", "authorization",
                                  "secret", "password", "signature", "sig"})


def redact_query(query: str) -> str:
    from urllib.parse import parse_qsl, urlencode

    pairs = parse_qsl(query, keep_blank_values=True)
    return urlencode([(k, "REDACTED" if k.lower() in SECRET_PARAMS else v) for k, v in pairs])


def _redactor() -> Any:
    """A span processor that redacts secret query parameters in `url.query` as the span starts."""
    from opentelemetry.sdk.trace import SpanProcessor

    class Redact(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            query = (span.attributes or {}).get("url.query")
            if isinstance(query, str) and query:
                span.set_attribute("url.query", redact_query(query))

    return Redact()


def _build_provider() -> Any:
    """The SDK's TracerProvider with the exporter `OTEL_TRACES_EXPORTER` names; None (a warning, tracing
    off) when the `otel` extra is not installed."""
    exporter_name = (os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp").split(",")[0].strip()
    if exporter_name not in ("otlp", "console"):
        raise TracingSetupError(f"OTEL_TRACES_EXPORTER={exporter_name}: not supported: set otlp, console or none")
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    if exporter_name == "otlp" and protocol != "http/protobuf":
        raise TracingSetupError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: not supported: AgentVM exports OTLP "
                                "over http/protobuf (a collector's port 4318): unset it or set http/protobuf")
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning("OTEL_* variables ask for traces but opentelemetry-sdk is not installed "
                    "(pip install 'agentvm[otel]'): tracing is off")
        return None
    if exporter_name == "console":
        exporter: Any = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("OTEL_* variables ask for OTLP traces but opentelemetry-exporter-otlp-proto-http is "
                        "not installed (pip install 'agentvm[otel]'): tracing is off")
            return None
        exporter = OTLPSpanExporter()
    from agentvm import __version__

    resource = Resource.create({"service.version": __version__})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(_redactor())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing on", extra={"exporter": exporter_name, "service": resource.attributes.get("service.name")})
    return provider
