"""Turn metrics of this process, kept in memory: per tenant for `/v1/metrics`, and for the operator's
`/metrics` (`aggregates()`, exposed by prometheus-client in agentvm.services.prometheus).

`TurnMetrics.observe_turn` is the runtime's `RuntimePorts.turn_observer`: the engine calls it once at the end
of every turn. Everything is bounded whatever the number of turns and tenants:

* per tenant: counters since the process started, one slot of counters per minute for the last
  `WINDOW_MAX_MINUTES` minutes, and a ring of the latest `SAMPLES_PER_TENANT` latencies (p50/p95 are
  exact over those, nearest rank); at most `max_tenants` tenants are kept, the least recently active
  one is dropped first (it starts from zero when it comes back);
* for `/metrics`: one series per (tier, status, model family), with fixed histogram buckets. Labels
  have a few known values each (anything else is `other`): never a tenant, container, session, turn
  or key id.
"""

from __future__ import annotations

import math
import re
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from agentvm.domain.models import Turn, TurnStatus
from agentvm.domain.usage import model_family
from agentvm.errors import InvalidRequest
from agentvm.ids import now_ms

if TYPE_CHECKING:
    from agentvm.ports import Store

WINDOW_MAX_MINUTES = 60
SAMPLES_PER_TENANT = 256
MAX_TENANTS = 10_000
# seconds, for `avm_turn_duration_seconds` and `avm_turn_first_token_seconds` (+Inf is implicit)
LATENCY_BUCKETS_S: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

TIERS = frozenset({"function", "container"})
STATUSES = (TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.INTERRUPTED)
_WINDOW = re.compile(r"^(\d{1,3})([mh])$")

# tenant id → how many (connections, or distinct containers with a live session) it has now
Gauge = Callable[[], Mapping[str, int]]


def tier_label(tier: str) -> str:
    return tier if tier in TIERS else "other"


def status_label(status: str) -> str:
    return str(status) if status in STATUSES else "other"


def parse_window(window: str | None) -> int | None:
    """Minutes of a `window` (`5m`, `15m`, `1h`: 1 to 60 minutes), None for `all` (since the process
    started); InvalidRequest for anything else."""
    if window is None or window == "all":
        return None
    m = _WINDOW.match(window)
    minutes = (int(m.group(1)) * (60 if m.group(2) == "h" else 1)) if m else 0
    if not 1 <= minutes <= WINDOW_MAX_MINUTES:
        raise InvalidRequest(f"window: `all`, or 1m to {WINDOW_MAX_MINUTES}m (1h)", field="window")
    return minutes


def percentile(values: list[int], p: float) -> int | None:
    """The nearest-rank percentile of `values` (sorted), None when empty."""
    if not values:
        return None
    return values[max(0, math.ceil(p / 100 * len(values)) - 1)]


@dataclass(slots=True)
class Counts:
    turns: int = 0
    completed: int = 0
    failed: int = 0
    interrupted: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def add(self, turn: Turn) -> None:
        self.turns += 1
        if turn.status == TurnStatus.COMPLETED:
            self.completed += 1
        elif turn.status == TurnStatus.FAILED:
            self.failed += 1
        elif turn.status == TurnStatus.INTERRUPTED:
            self.interrupted += 1
        u = turn.usage
        self.input_tokens += u.input_tokens
        self.output_tokens += u.output_tokens
        self.cache_read_tokens += u.cache_read_tokens
        self.cache_write_tokens += u.cache_write_tokens

    def merge(self, other: Counts) -> None:
        for name in _COUNT_FIELDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))


_COUNT_FIELDS = tuple(f.name for f in fields(Counts))


class _Ring:
    """The latest `capacity` latency samples: (observed at ms, turn ms, first-token ms or -1)."""

    __slots__ = ("at", "capacity", "first", "next", "total")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.at, self.total, self.first = array("q"), array("q"), array("q")
        self.next = 0

    def add(self, at: int, total: int, first: int) -> None:
        if len(self.at) < self.capacity:
            self.at.append(at)
            self.total.append(total)
            self.first.append(first)
            return
        i = self.next
        self.at[i], self.total[i], self.first[i] = at, total, first
        self.next = (i + 1) % self.capacity

    def since(self, start_ms: int) -> tuple[list[int], list[int]]:
        """Sorted turn and first-token latencies observed at or after `start_ms`."""
        totals, firsts = [], []
        for at, total, first in zip(self.at, self.total, self.first, strict=True):
            if at >= start_ms:
                if total >= 0:
                    totals.append(total)
                if first >= 0:
                    firsts.append(first)
        return sorted(totals), sorted(firsts)


@dataclass(slots=True)
class _Tenant:
    total: Counts = field(default_factory=Counts)
    # (minute since the epoch, that minute's counts), oldest first
    minutes: deque[tuple[int, Counts]] = field(default_factory=lambda: deque(maxlen=WINDOW_MAX_MINUTES))
    samples: _Ring = field(default_factory=lambda: _Ring(SAMPLES_PER_TENANT))


class LatencyHistogram:
    __slots__ = ("buckets", "count", "sum_ms")

    def __init__(self) -> None:
        self.buckets = [0] * len(LATENCY_BUCKETS_S)  # not cumulative; +Inf is `count`
        self.count = 0
        self.sum_ms = 0

    def observe(self, ms: int) -> None:
        self.count += 1
        self.sum_ms += ms
        for i, le in enumerate(LATENCY_BUCKETS_S):
            if ms <= le * 1000:
                self.buckets[i] += 1
                break

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound in seconds, observations at or below it), `math.inf` last."""
        out, total = [], 0
        for le, n in zip(LATENCY_BUCKETS_S, self.buckets, strict=True):
            total += n
            out.append((le, total))
        out.append((math.inf, self.count))
        return out


@dataclass(slots=True)
class _Series:
    counts: Counts = field(default_factory=Counts)
    duration: LatencyHistogram = field(default_factory=LatencyHistogram)


@dataclass(frozen=True, slots=True)
class Latency:
    p50: int | None
    p95: int | None
    samples: int


@dataclass(frozen=True, slots=True)
class TenantMetrics:
    """A tenant's turns in a window (`window_minutes` None: since the process started)."""

    tenant_id: str
    window_minutes: int | None
    since_ms: int
    until_ms: int
    counts: Counts
    first_token: Latency
    turn: Latency
    active_containers: int | None  # None: not known here (the cloud's turn-log metrics)
    active_connections: int | None

    @property
    def success_rate(self) -> float | None:
        return self.counts.completed / self.counts.turns if self.counts.turns else None

    @property
    def error_rate(self) -> float | None:
        return self.counts.failed / self.counts.turns if self.counts.turns else None


def _latency(sorted_ms: list[int]) -> Latency:
    return Latency(percentile(sorted_ms, 50), percentile(sorted_ms, 95), len(sorted_ms))


# the turn-log metrics read at most this many turns (newest first) per request
TURN_LOG_MAX_TURNS = 2_000


async def turn_log_metrics(store: Store, tenant_id: str, window_minutes: int | None, *,
                           now: int | None = None) -> TenantMetrics:
    """A tenant's metrics read from the store's turn log, where no process sees every turn (the
    cloud: each turn runs in some `chat_turn`): finished turns created in the window (`None`: the last 24 h),
    at most `TURN_LOG_MAX_TURNS` of them. Latencies come from each turn's duration and first-token
    time; the active gauges are not kept there (CloudWatch has them, docs/observability.md)."""
    end = now_ms() if now is None else now
    start = (end // 60_000 - window_minutes + 1) * 60_000 if window_minutes is not None else end - 86_400_000
    counts, totals, firsts = Counts(), [], []
    cursor: str | None = None
    seen = 0
    while seen < TURN_LOG_MAX_TURNS:
        page, cursor = await store.list_tenant_turns(tenant_id, since_ms=start, until_ms=end + 1,
                                                     limit=min(200, TURN_LOG_MAX_TURNS - seen), cursor=cursor)
        for turn in page:
            counts.add(turn)
            if turn.duration_ms is not None:
                totals.append(max(0, turn.duration_ms))
            if turn.first_token_ms is not None:
                firsts.append(max(0, turn.first_token_ms))
        seen += len(page)
        if cursor is None or not page:
            break
    totals.sort()
    firsts.sort()
    return TenantMetrics(tenant_id, window_minutes, start, end, counts, _latency(firsts), _latency(totals), None,
                         None)


class TurnMetrics:
    """The registry of one process. Not thread-safe: observed and read on the event loop."""

    def __init__(self, *, connections: Gauge | None = None, containers: Gauge | None = None,
                 clock: Callable[[], int] = now_ms, max_tenants: int = MAX_TENANTS) -> None:
        self._connections = connections
        self._containers = containers
        self._clock = clock
        self.max_tenants = max_tenants
        self.started_ms = clock()
        self._tenants: OrderedDict[str, _Tenant] = OrderedDict()
        self._series: dict[tuple[str, str, str], _Series] = {}  # (tier, status, model family)
        self._first_token: dict[tuple[str, str], LatencyHistogram] = {}  # (tier, model family)
        self._overruns: dict[str, int] = {}  # model family → LLM calls billed above their budget hold

    # ---- writing -------------------------------------------------------------------------------

    def observe_turn(self, turn: Turn, first_delta_ms: int | None) -> None:
        """Count a turn that ended (the `RuntimePorts.turn_observer`)."""
        now = self._clock()
        t = self._tenants.get(turn.tenant_id)
        if t is None:
            t = self._tenants[turn.tenant_id] = _Tenant()
            while len(self._tenants) > self.max_tenants:
                self._tenants.popitem(last=False)
        else:
            self._tenants.move_to_end(turn.tenant_id)
        t.total.add(turn)
        minute = now // 60_000
        if not t.minutes or t.minutes[-1][0] != minute:
            t.minutes.append((minute, Counts()))
        t.minutes[-1][1].add(turn)
        duration = turn.duration_ms
        total_ms = max(0, duration) if duration is not None else -1
        first_ms = max(0, first_delta_ms) if first_delta_ms is not None else -1
        if total_ms >= 0 or first_ms >= 0:
            t.samples.add(now, total_ms, first_ms)

        tier, family = tier_label(turn.tier), model_family(turn.model)
        key = (tier, status_label(turn.status), family)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series()
        series.counts.add(turn)
        if total_ms >= 0:
            series.duration.observe(total_ms)
        if first_ms >= 0:
            hist = self._first_token.get((tier, family))
            if hist is None:
                hist = self._first_token[(tier, family)] = LatencyHistogram()
            hist.observe(first_ms)

    def observe_budget_overrun(self, model: str | None) -> None:
        """Count an LLM call billed above its budget hold (the `Meter`'s `on_overrun`)."""
        family = model_family(model)
        self._overruns[family] = self._overruns.get(family, 0) + 1

    # ---- reading -------------------------------------------------------------------------------

    def tenant(self, tenant_id: str, window_minutes: int | None = None) -> TenantMetrics:
        """The tenant's turns since the process started, or in the last `window_minutes` whole
        minutes (the current one included), with its active containers and connections now."""
        now = self._clock()
        if window_minutes is None:
            start = self.started_ms
        else:
            start = max(self.started_ms, (now // 60_000 - window_minutes + 1) * 60_000)
        t = self._tenants.get(tenant_id)
        counts = Counts()
        totals: list[int] = []
        firsts: list[int] = []
        if t is not None:
            if window_minutes is None:
                counts.merge(t.total)
            else:
                for minute, c in t.minutes:
                    if minute >= start // 60_000:
                        counts.merge(c)
            totals, firsts = t.samples.since(start)
        return TenantMetrics(tenant_id, window_minutes, start, now, counts, _latency(firsts), _latency(totals),
                             _gauge(self._containers).get(tenant_id, 0),
                             _gauge(self._connections).get(tenant_id, 0))

    def aggregates(self) -> Aggregates:
        """Every tenant's turns aggregated (the `/metrics` series), sorted by label values."""
        return Aggregates(
            started_ms=self.started_ms,
            series=[(key, s.counts, s.duration) for key, s in sorted(self._series.items(), key=lambda kv: kv[0])],
            first_token=sorted(self._first_token.items(), key=lambda kv: kv[0]),
            overruns=sorted(self._overruns.items()),
            connections=sum(_gauge(self._connections).values()),
            containers=sum(_gauge(self._containers).values()),
            tenants=len(self._tenants))


@dataclass(frozen=True, slots=True)
class Aggregates:
    started_ms: int
    series: list[tuple[tuple[str, str, str], Counts, LatencyHistogram]]  # (tier, status, model family)
    first_token: list[tuple[tuple[str, str], LatencyHistogram]]  # (tier, model family)
    overruns: list[tuple[str, int]]  # (model family, LLM calls billed above their hold)
    connections: int
    containers: int
    tenants: int


def _gauge(gauge: Gauge | None) -> Mapping[str, int]:
    return gauge() if gauge is not None else {}
