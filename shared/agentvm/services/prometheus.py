"""The operator's `/metrics` on prometheus-client: a registry per `TurnMetrics` (never the library's
global one) whose one collector turns `TurnMetrics.aggregates()` into metric families at each scrape.
The library writes the exposition (text 0.0.4, or OpenMetrics when the scraper asks for it) and its
escaping. Imported at the first scrape only (agentvm.api.ops_http): the cloud functions never load
prometheus-client.

The aggregation itself stays in agentvm.services.metrics: its series are bounded by label value
(tier, status, model family: a few known values each), and the library's own Counter and Histogram
would add a `_created` series to each (switched off only process-wide)."""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from agentvm import __version__
from agentvm.services.metrics import LatencyHistogram, TurnMetrics

TOKEN_KINDS = ("input", "output", "cache_read", "cache_write")


class TurnCollector(Collector):
    def __init__(self, metrics: TurnMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        a = self.metrics.aggregates()
        build = GaugeMetricFamily("avm_build_info", "The AgentVM version of this process.", labels=["version"])
        build.add_metric([__version__], 1)
        yield build
        yield GaugeMetricFamily("avm_process_start_time_seconds", "When this process started (Unix time).",
                                value=a.started_ms / 1000)

        turns = CounterMetricFamily("avm_turns", "Turns that ended, by tier, status and model family.",
                                    labels=["tier", "status", "model_family"])
        for (tier, status, family), counts, _ in a.series:
            turns.add_metric([tier, status, family], counts.turns)
        yield turns

        tokens = CounterMetricFamily(
            "avm_tokens", "LLM tokens of the turns that ended, by kind (input, output, cache_read, cache_write), "
            "tier and model family.", labels=["kind", "tier", "model_family"])
        by_tier: dict[tuple[str, str], list[int]] = {}
        for (tier, _, family), c, _ in a.series:
            total = by_tier.setdefault((tier, family), [0, 0, 0, 0])
            for i, n in enumerate((c.input_tokens, c.output_tokens, c.cache_read_tokens, c.cache_write_tokens)):
                total[i] += n
        for (tier, family), values in sorted(by_tier.items()):
            for kind, n in zip(TOKEN_KINDS, values, strict=True):
                tokens.add_metric([kind, tier, family], n)
        yield tokens

        duration = HistogramMetricFamily("avm_turn_duration_seconds",
                                         "Turn duration, start to end, by tier, status and model family.",
                                         labels=["tier", "status", "model_family"])
        for (tier, status, family), _, h in a.series:
            _add_histogram(duration, [tier, status, family], h)
        yield duration

        first = HistogramMetricFamily("avm_turn_first_token_seconds",
                                      "Time from a turn's start to its first text delta, by tier and model family.",
                                      labels=["tier", "model_family"])
        for (tier, family), h in a.first_token:
            _add_histogram(first, [tier, family], h)
        yield first

        overruns = CounterMetricFamily(
            "avm_budget_overruns", "LLM calls billed above their budget hold (the provider reported more than the "
            "hold's upper bound), by model family.", labels=["model_family"])
        for family, n in a.overruns:
            overruns.add_metric([family], n)
        yield overruns

        yield GaugeMetricFamily("avm_active_connections",
                                "Open WebSocket connections and SSE chat streams of this process.", value=a.connections)
        yield GaugeMetricFamily("avm_active_containers", "Containers with a live session in this process.",
                                value=a.containers)
        yield GaugeMetricFamily("avm_metrics_tenants", "Tenants whose turns /v1/metrics keeps in memory.",
                                value=a.tenants)


def _add_histogram(family: HistogramMetricFamily, labels: list[str], h: LatencyHistogram) -> None:
    family.add_metric(labels, [(_le(le), n) for le, n in h.cumulative()], h.sum_ms / 1000)


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)  # 1.0, 0.05: as Prometheus' own clients write them


_registries: weakref.WeakKeyDictionary[TurnMetrics, CollectorRegistry] = weakref.WeakKeyDictionary()


def registry_of(metrics: TurnMetrics) -> CollectorRegistry:
    """The registry of `metrics` (one per `TurnMetrics`, made at its first scrape, gone with it)."""
    registry = _registries.get(metrics)
    if registry is None:
        registry = _registries[metrics] = CollectorRegistry(auto_describe=False)
        registry.register(TurnCollector(metrics))
    return registry


def exposition(metrics: TurnMetrics, accept: str | None = None) -> tuple[bytes, str]:
    """The `/metrics` body and content type for a scraper's `Accept` header (prometheus-client
    chooses: the text format 0.0.4 by default, OpenMetrics when asked). An `Accept` the library cannot
    read (`version=abc`) gets the default text format rather than an error."""
    try:
        encoder, content_type = choose_encoder(accept or "")
    except (TypeError, ValueError):
        encoder, content_type = generate_latest, CONTENT_TYPE_PLAIN_0_0_4
    return encoder(registry_of(metrics)), content_type


def prometheus_text(metrics: TurnMetrics) -> str:
    """The `/metrics` body in the text format 0.0.4."""
    return exposition(metrics)[0].decode()
