"""An in-memory OpenTelemetry exporter behind agentvm.observability.tracing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentvm.observability import tracing
from tests.aws_fixtures import aws_env, moto_endpoint

__all__ = ["aws_env", "moto_endpoint", "spans"]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, every span exported to memory as it ends."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.setup(provider)
    try:
        yield exporter
    finally:
        tracing.reset()
        provider.shutdown()

