"""Reading the spans of an in-memory OpenTelemetry exporter (tests/observability)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def named(finished: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name == name]


def one(finished: Sequence[ReadableSpan], name: str, **attributes: Any) -> ReadableSpan:
    """The one span of that name whose attributes include `attributes` (dots as `__`)."""
    want = {k.replace("__", "."): v for k, v in attributes.items()}
    found = [s for s in named(finished, name) if all((s.attributes or {}).get(k) == v for k, v in want.items())]
    assert len(found) == 1, (name, want, [(s.name, dict(s.attributes or {})) for s in finished])
    return found[0]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


async def wait_spans(exporter: InMemorySpanExporter, done: Callable[[Sequence[ReadableSpan]], bool],
               timeout: float = 10.0) -> tuple[ReadableSpan, ...]:
    """The exported spans once `done` holds of them (a span is exported when it ends)."""
    deadline = time.monotonic() + timeout
    while True:
        finished = exporter.get_finished_spans()
        if done(finished):
            return finished
        if time.monotonic() > deadline:
            raise AssertionError(f"spans: {[s.name for s in finished]}")
        await asyncio.sleep(0.02)
