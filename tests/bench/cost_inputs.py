"""What the cost model prices: measured per-turn counts (the AWS-calls bench's JSON), the scenarios and
every assumption, each with a one-line why (tests/bench/cost_model.py does the arithmetic).

Counts file (docs/aws-calls.json, written by `make bench`), the keys read here:
  "tiers": {"lambda"|"host": {"1"|"20"|"100": COUNTS}}, "deltas", "delta_gap_ms", "time_scale", "model",
  "chat_turn": {"memory_mb", "peak_rss_mb"}, "host": {"vcpu", "memory_mb", "cpu_ms_per_turn",
  "concurrent_turns_at_70pct", "peak_rss_mb"};
  COUNTS: "inbound_frames", "post_to_connection", "post_units_32kb", "frames_per_client" {"stock", "batched"},
  "ddb_write_units", "ddb_read_units", "lambda_invocations" {fn: n}, "sqs_requests", "s3_put_requests",
  "s3_get_requests", "bytes_out", "turn_seconds" (missing keys mean 0; "ddb_*_requests", "other_calls"
  are reported, not priced: on-demand DynamoDB bills units, not requests).
The schema before issue 17 ({"flush_ms": {"250": COUNTS}}) is read too, as the Lambda tier at length 1.
"""

# ruff: noqa: RUF009 -- Decimal defaults are immutable values, safe to share between instances
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

D = Decimal
HOURS_PER_MONTH = D(730)  # AWS's month in its pricing examples
DAYS_PER_MONTH = HOURS_PER_MONTH / 24
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600
GIB = D(2**30)  # AWS bills storage, logs and transfer per GB of 2^30 bytes
MB_PER_GB = D(1024)  # Lambda and Fargate: 512 MB = 0.5 GB

# The counted turn's position in its conversation, weighted: where a month's turns sit (a stated
# distribution; reads must be flat in the length, so it matters only if they are not).
LENGTH_WEIGHTS: dict[str, Decimal] = {"1": D("0.25"), "20": D("0.5"), "100": D("0.25")}

# A day's traffic, turns per hour in 120ths of the day (a single-region user base: quiet 01-06 h, a
# plateau 10-15 h). Peak/average = 8/5 = 1.6, minimum/average = 0.2.
DAY_CURVE: tuple[int, ...] = (2, 1, 1, 1, 1, 1, 2, 4, 6, 7, 8, 8, 8, 8, 8, 8, 7, 7, 7, 7, 6, 5, 4, 3)
DAY_CURVE_TOTAL = D(sum(DAY_CURVE))


@dataclass(frozen=True)
class TierCounts:
    """One pure-chat turn on one tier, weighted over the measured conversation lengths."""

    tier: str
    source: str
    inbound_frames: Decimal
    frames_stock: Decimal  # outbound frames to one stock client
    frames_batched: Decimal  # outbound frames to one client that asked for batched frames
    extra_32kb_units: Decimal  # frames over 32 KB bill one message per 32 KB started
    ddb_write_units: Decimal
    ddb_read_units: Decimal
    lambda_invocations: Mapping[str, Decimal]
    sqs_requests: Decimal
    s3_put_requests: Decimal
    s3_get_requests: Decimal
    bytes_out: Decimal
    turn_seconds: Decimal  # wall time of the bench's turn (its scripted reply included)
    by_length: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class HostFigures:
    """One turn host (ECS Fargate task) as the bench measured it."""

    vcpu: Decimal
    memory_mb: Decimal
    cpu_ms_per_turn: Decimal
    concurrent_turns_at_70pct: Decimal
    peak_rss_mb: Decimal
    source: str


@dataclass(frozen=True)
class Counts:
    file: str
    lambda_tier: TierCounts
    host_tier: TierCounts
    host: HostFigures
    chat_turn_memory_mb: int | None  # the memory the bench says chat_turn needs (None: not measured)
    chat_turn_peak_rss_mb: Decimal | None
    scripted_reply_s: Decimal  # how long the bench's scripted reply streams (part of turn_seconds)
    model: str
    measured: Mapping[str, Any]


def _n(m: Mapping[str, Any], key: str) -> Decimal:
    return D(str(m.get(key, 0) or 0))


def _weighted(lengths: Mapping[str, Mapping[str, Any]], tier: str, source: str) -> TierCounts:
    weights = {k: LENGTH_WEIGHTS.get(k, D(0)) for k in lengths}
    if not any(weights.values()):  # lengths other than 1/20/100: weigh them equally
        weights = {k: D(1) for k in lengths}
    total = sum(weights.values(), D(0))

    def avg(get: Any) -> Decimal:
        return sum((weights[k] * get(m) for k, m in lengths.items()), D(0)) / total

    def stock(m: Mapping[str, Any]) -> Decimal:
        fpc = m.get("frames_per_client") or {}
        return D(str(fpc["stock"])) if "stock" in fpc else _n(m, "post_to_connection")

    def batched(m: Mapping[str, Any]) -> Decimal:
        fpc = m.get("frames_per_client") or {}
        return D(str(fpc["batched"])) if "batched" in fpc else stock(m)

    def extra(m: Mapping[str, Any]) -> Decimal:
        posts = _n(m, "post_to_connection")
        return max(D(0), _n(m, "post_units_32kb") - posts) if "post_units_32kb" in m else D(0)

    functions = sorted({f for m in lengths.values() for f in (m.get("lambda_invocations") or {})})
    return TierCounts(
        tier=tier, source=source, inbound_frames=avg(lambda m: _n(m, "inbound_frames")),
        frames_stock=avg(stock), frames_batched=avg(batched), extra_32kb_units=avg(extra),
        ddb_write_units=avg(lambda m: _n(m, "ddb_write_units")), ddb_read_units=avg(lambda m: _n(m, "ddb_read_units")),
        lambda_invocations={f: avg(lambda m, f=f: _n(m.get("lambda_invocations") or {}, f)) for f in functions},
        sqs_requests=avg(lambda m: _n(m, "sqs_requests")), s3_put_requests=avg(lambda m: _n(m, "s3_put_requests")),
        s3_get_requests=avg(lambda m: _n(m, "s3_get_requests")), bytes_out=avg(lambda m: _n(m, "bytes_out")),
        turn_seconds=avg(lambda m: _n(m, "turn_seconds")), by_length=dict(lengths))


# When the counts hold no host tier: the Lambda tier's turn with chat_turn's invocation replaced by the
# queue (ws_default's SendMessage, the host's ReceiveMessage and DeleteMessage).
HOST_SQS_REQUESTS_PER_TURN = D(3)
# When the counts hold no host figures (bench not run): a 0.5 vCPU / 1 GB task, 30 ms of CPU a turn.
ASSUMED_HOST = {"vcpu": 0.5, "memory_mb": 1024, "cpu_ms_per_turn": 30, "peak_rss_mb": 300}


def _host_from_lambda(t: TierCounts) -> TierCounts:
    inv = {f: n for f, n in t.lambda_invocations.items() if f != "chat_turn"}
    return TierCounts(**{**t.__dict__, "tier": "host", "lambda_invocations": inv,
                         "sqs_requests": t.sqs_requests + HOST_SQS_REQUESTS_PER_TURN,
                         "source": t.source + " (host tier not measured: the Lambda tier's counts, chat_turn's "
                                              f"invocation replaced by {HOST_SQS_REQUESTS_PER_TURN} SQS requests)"})


def load_balancer_tier(host: TierCounts) -> TierCounts:
    """A turn on a host that holds its client's WebSocket itself (template WebSocketFront=LoadBalancer):
    the host tier's turn without what API Gateway adds: no billed message (an ALB bills capacity units,
    not frames), no `ws_default` invocation (the host runs the frame in-process, making the same DynamoDB
    calls, counted the same), no SQS hop (the turn runs on the host that holds the connection)."""
    inv = {f: n for f, n in host.lambda_invocations.items() if f not in ("ws_default", "chat_turn")}
    return TierCounts(**{**host.__dict__, "tier": "host", "inbound_frames": D(0), "frames_stock": D(0),
                         "frames_batched": D(0), "extra_32kb_units": D(0), "lambda_invocations": inv,
                         "sqs_requests": D(0),
                         "source": host.source + " (WebSocketFront=LoadBalancer: the host tier's counts without "
                                                 "API Gateway messages, ws_default invocations and SQS requests)"})


def parse_counts(data: Mapping[str, Any], file: str, flush_ms: str = "250") -> Counts:
    """The counts of a bench file, new schema (`tiers`) or old (`flush_ms`, read as the Lambda tier)."""
    if "tiers" in data:
        tiers = data["tiers"]
        lam = _weighted(tiers["lambda"], "lambda", f"measured: {file}")
        host = (_weighted(tiers["host"], "host", f"measured: {file}") if tiers.get("host")
                else _host_from_lambda(lam))
    else:
        by_flush = data["flush_ms"]
        key = flush_ms if flush_ms in by_flush else sorted(by_flush, key=int)[-1]
        lam = _weighted({"1": by_flush[key]}, "lambda", f"measured (old schema, flushMs={key}, length 1): {file}")
        host = _host_from_lambda(lam)
    deltas, gap, scale = _n(data, "deltas"), _n(data, "delta_gap_ms"), D(str(data.get("time_scale", 1)))
    measured_host = data.get("host") or {}
    h = {**ASSUMED_HOST, **measured_host}
    vcpu, cpu_ms = D(str(h["vcpu"])), D(str(h["cpu_ms_per_turn"]))
    turn_s = host.turn_seconds or D(10)
    concurrent = (D(str(h["concurrent_turns_at_70pct"])) if "concurrent_turns_at_70pct" in h
                  else (D("0.7") * vcpu * turn_s * 1000 / cpu_ms).to_integral_value(rounding="ROUND_FLOOR"))
    ct = data.get("chat_turn") or {}
    return Counts(
        file=file, lambda_tier=lam, host_tier=host,
        host=HostFigures(vcpu=vcpu, memory_mb=D(str(h["memory_mb"])), cpu_ms_per_turn=cpu_ms,
                         concurrent_turns_at_70pct=concurrent, peak_rss_mb=D(str(h["peak_rss_mb"])),
                         source="measured" if "cpu_ms_per_turn" in measured_host else "assumed (no host figures)"),
        chat_turn_memory_mb=int(ct["memory_mb"]) if ct.get("memory_mb") else None,
        chat_turn_peak_rss_mb=D(str(ct["peak_rss_mb"])) if ct.get("peak_rss_mb") else None,
        scripted_reply_s=deltas * gap * scale / 1000, model=str(data.get("model") or "scripted (unpriced)"),
        measured=data)


def load_counts(path: Path, flush_ms: str = "250") -> Counts:
    return parse_counts(json.loads(path.read_text()), path.name, flush_ms)


# ---- scenarios -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    turns: Decimal
    sessions: Decimal  # = WebSocket connections, one conversation each
    minutes_per_connection: Decimal
    why: str


SCENARIOS = (
    Scenario("1M", D(1_000_000), D(200_000), D("7.5"),
             "1,000,000 registered users, 5 % active in the month (50,000), 20 turns each; "
             "4 connections of 7.5 min per active user (5 turns each)"),
    Scenario("30M", D(30_000_000), D(1_500_000), D(30),
             "1,000,000 registered users, 5 % active each day (50,000 a day), 20 turns each, 30 days; "
             "one 30-minute connection per active user-day (20 turns)"),
    Scenario("idle", D(0), D(0), D(0),
             "no turns: the deployment alone; a fresh idle deployment holds no history, so storage left "
             "from before is 0"),
)

GOALS = {"30M": D(750), "1M": D(40), "idle": D(3)}
PER_TURN_GOAL = ("30M", D("0.000025"))


# ---- assumptions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Assumptions:
    """Every duration, size and ratio that is not counted by the bench (defaults; flags override some)."""

    llm_seconds: Decimal = D(10)  # a 100-delta reply streams ~10 s: chat_turn waits on it, billed wall time
    batched_share: Decimal = D(0)  # clients that ask for batched frames (the stock AgentX client does not)
    chat_turn_memory_mb: int = 512  # template ChatTurnMemorySize, when the counts do not size it
    function_memory_mb: int = 256  # template FunctionMemorySize (ws_*, turn_sweep, history_archive)
    ws_default_ms: Decimal = D(150)  # store message + queued turn, lease, posts, dispatch
    ws_connect_ms: Decimal = D(60)  # key lookup + connection put
    ws_disconnect_ms: Decimal = D(60)  # connection read, subscriptions query, deletes
    init_ms: Decimal = D(1000)  # INIT of a cold start without SnapStart (billed since 2025-08-01)
    cold_start_share: Decimal = D("0.01")  # AWS: under 1 % of invocations in production workloads
    snapstart: bool = True  # template ChatTurnSnapStart default
    snapstart_versions: int = 1  # published chat_turn versions kept (each one's cache bills)
    per_connection_frames: Decimal = D(4)  # subscribe + history request in, their two answers out
    per_connection_ws_default: Decimal = D(2)  # the subscribe and the history request
    per_connection_wru: Decimal = D(5)  # connection put; subscription put; three deletes at $disconnect
    per_connection_rru: Decimal = D(6)  # key lookup, session read, history 2, connection read + query
    log_line_bytes: Decimal = D(816)  # measured: the engine's "turn finished" line (system logs at WARN)
    emf_bytes_per_turn: Decimal = D(422)  # measured: chat_turn's one EMF blob (observability.py)
    log_event_overhead: Decimal = D(26)  # CloudWatch Logs meters 26 bytes per event on top
    emf_bytes_per_sweep: Decimal = D(243)  # measured: turn_sweep's one blob per run
    log_retention_days: Decimal = D(14)  # template LogRetentionDays
    default_bytes_out: Decimal = D(20_480)  # frames to clients + the LLM request, when not measured
    # storage
    history_hot_days: Decimal = D(30)  # template HistoryHotDays: then TTL-deleted and archived to S3
    ttl_lag_days: Decimal = D(2)  # DynamoDB deletes expired items typically within a few days
    stored_bytes_per_turn: Decimal = D(1836)  # messages ~1 KB a pair + turn item 0.5 KB + overheads
    event_bytes_per_turn: Decimal = D(4096)  # event-log items, kept event_ttl_hours
    event_ttl_hours: Decimal = D(48)
    usage_record_bytes: Decimal = D(512)  # one usage record per turn, kept for billing (no TTL)
    usage_months_kept: Decimal = D(12)  # month 12 of steady traffic: a year of usage records
    pitr: bool = True  # template PointInTimeRecovery default
    archive_bytes_per_turn: Decimal = D(700)  # gzip JSON Lines of the turn's history items
    archive_puts_per_session: Decimal = D(2)  # a session's items expire in ~2 stream batches (300 s windows)
    archive_months: Decimal = D(12)  # month 12 of steady traffic
    glacier_after_days: Decimal = D(90)  # bucket lifecycle archive/ -> GLACIER_IR
    glacier_min_object_bytes: Decimal = D(128 * 1024)  # S3 does not transition smaller objects by default
    # schedules and functions off the turn path
    sweep_runs: Decimal = HOURS_PER_MONTH * 30  # TurnSweepSchedule rate(2 minutes)
    sweep_ms: Decimal = D(150)
    sweep_rru: Decimal = D(8)  # 16 index Queries at 0.5 RRU while nothing is unfinished
    export_runs: Decimal = DAYS_PER_MONTH.to_integral_value()  # daily cron
    export_ms_base: Decimal = D(1000)
    # measured: ~90 µs of CPU a record to write (2 FOCUS rows; tests/cloud/test_usage_export_stream.py), plus
    # an estimated ~60 µs to read and parse its item; CPU-bound, at the one vCPU of 1769 MB
    export_ms_per_record: Decimal = D("0.15")  # ~6,700 usage records read and written a second
    export_memory_mb: int = 1769
    archive_runs: Decimal = HOURS_PER_MONTH * 12  # one per 300 s batching window while deletes arrive
    archive_ms_base: Decimal = D(500)
    archive_ms_per_put: Decimal = D(30)
    secrets: int = 1  # the LLM key
    # turn-host tier
    host_tier: bool = True  # template TurnHostTier default (with WorkerImageUri set)
    host_capacity: Decimal = D(200)  # AVM_TURN_HOST_CAPACITY
    # template TurnHostCapacityProvider: "spot" (FargateSpot, the default) or "on_demand" (Fargate); with
    # the load balancer front its always-running task is on-demand either way (base 1)
    capacity_provider: str = "spot"
    scale_out_concurrency: Decimal = D(3)  # template TurnHostScaleOutConcurrency
    scale_out_lag_min: Decimal = D(3)  # 2 of 3 one-minute periods + task start: turns stay on Lambda meanwhile
    scale_in_turns: Decimal = D(1)  # template TurnHostScaleInTurns: hosts' running turns average under it
    scale_in_delay_min: Decimal = D(15)  # template: low for 15 minutes before a task goes
    day_curve: tuple[int, ...] = DAY_CURVE  # turns per hour of a day, relative
    within_hour_peak: Decimal = D("1.25")  # minute-level peaks over the hour's mean: tasks are sized for them
    heartbeat_s: Decimal = D(10)  # AVM_TURN_HOST_HEARTBEAT_S: one registry write (1 WRU) each
    idle_receives_per_hour: Decimal = D(180)  # a 20 s long poll that finds nothing (upper bound: counted always)
    alarms: int = 2  # the host tier's scale-out and scale-in alarms
    guard_alarms: int = 8  # the template's guard-rail alarms in every stack, one metric each
    detailed_alarms: bool = False  # template DetailedAlarms default
    detailed_alarm_count: int = 13  # what DetailedAlarms=Enabled adds
    ecr_image_gb: Decimal = D("0.3")  # the worker/turn-host image, compressed
    # the WebSocket front: "api_gateway" (template default), "load_balancer" (an ALB in front of the turn
    # hosts) or "cheapest" (each month priced on the cheaper of the two: the operator's choice by volume)
    front: str = "cheapest"
    lb_min_tasks: int = 1  # an ALB with no target refuses connections: one host always runs
    alb_public_ipv4: int = 2  # an internet-facing ALB in two AZs holds a public IPv4 address in each
    per_connection_bytes: Decimal = D(4096)  # the subscribe, the history answer (ALB processed bytes)

    def why(self) -> dict[str, str]:
        return {k: f"{getattr(self, k)}: {v}" for k, v in ASSUMPTION_WHY.items()}


ASSUMPTION_WHY = {
    "llm_seconds": "a 100-delta reply streams ~10 s; chat_turn is billed for the wait (wall time, idle CPU)",
    "batched_share": "clients that ask for batched frames; the stock AgentX client never does (default 0)",
    "chat_turn_memory_mb": "chat_turn memory when the counts do not size it (template ChatTurnMemorySize)",
    "ws_default_ms": "ws_default: store the message and the queued turn, lease, posts, dispatch",
    "cold_start_share": "AWS: cold starts are under 1 % of invocations; INIT billed since 2025-08-01",
    "snapstart_versions": "published chat_turn versions kept: the cache of each one bills every hour",
    "per_connection_frames": "per connection: subscribe + one history request in, their answers out",
    "log_line_bytes": "measured: the turn's one application line (\"turn finished\", with the breakdowns the "
                      "metrics leave out); LogFormat JSON + SystemLogLevel WARN: no START/END/REPORT",
    "emf_bytes_per_turn": "measured: InvocationMetrics.flush of one turn prints one EMF blob, 422 bytes",
    "history_hot_days": "HistoryHotDays: history items expire (TTL) after 30 days and go to the S3 archive",
    "ttl_lag_days": "DynamoDB TTL deletes expired items within days, not at once",
    "stored_bytes_per_turn": "a user + assistant message pair ~1 KB, the turn item 0.5 KB, item overheads",
    "usage_record_bytes": "one usage record per turn, never expired (billing needs it): a year of them",
    "archive_bytes_per_turn": "gzip JSON Lines of a turn's ~1.8 KB of history items",
    "archive_puts_per_session": "a session's items expire together, in about two 300 s stream batches",
    "glacier_min_object_bytes": "S3 lifecycle does not transition objects under 128 KB (the 2024 default)",
    "export_ms_per_record": "usage_export reads and writes ~6,700 usage records a second (one vCPU; measured "
                            "~90 µs CPU a record to write its rows)",
    "scale_out_lag_min": "the scale-out alarm (2 of 3 minutes) + a Fargate task start: turns run on Lambda",
    "scale_in_delay_min": "the scale-in alarm waits 15 minutes: a task outlives its traffic by that much",
    "within_hour_peak": "tasks are sized for the minute-level peak of each hour, 1.25 x its mean",
    "idle_receives_per_hour": "a host's 20 s long polls (3 a minute), counted as if always empty (upper bound)",
    "ecr_image_gb": "the worker/turn-host image in ECR, compressed",
    "alarms": "the turn-host tier's two scaling alarms (template); they exist whatever the traffic",
    "guard_alarms": "the template's guard-rail alarms (docs/cloud-design.md, Guard rails), whatever the traffic",
    "detailed_alarms": "template DetailedAlarms (off): per-function errors and throttles, 13 alarms more",
    "detailed_alarm_count": "the alarms DetailedAlarms=Enabled adds (template)",
    "function_memory_mb": "template FunctionMemorySize: ws_*, turn_sweep, history_archive",
    "ws_connect_ms": "$connect: key lookup + connection put",
    "ws_disconnect_ms": "$disconnect: connection read, subscriptions query, deletes",
    "init_ms": "INIT of a cold start without SnapStart (billed since 2025-08-01)",
    "snapstart": "template ChatTurnSnapStart default: chat_turn restores from a snapshot, no INIT billed",
    "per_connection_ws_default": "ws_default runs per connection besides turns: the subscribe, one history request",
    "per_connection_wru": "connection put, subscription put, three deletes at $disconnect",
    "per_connection_rru": "key lookup, session read, history 2 RRU, connection read + subscriptions query",
    "log_event_overhead": "CloudWatch Logs meters 26 bytes per log event on top of its text",
    "emf_bytes_per_sweep": "measured: turn_sweep prints one EMF blob per run",
    "log_retention_days": "template LogRetentionDays",
    "default_bytes_out": "bytes to the internet per turn (frames + the LLM request) when the counts lack bytes_out",
    "event_bytes_per_turn": "the turn's event-log items (replay), kept event_ttl_hours",
    "event_ttl_hours": "event blocks expire after 48 h (DynamoDB TTL, free deletes)",
    "usage_months_kept": "usage records never expire: month 12 of steady traffic holds a year of them",
    "pitr": "template PointInTimeRecovery default: billed on the whole table's size",
    "archive_months": "the bill of month 12 of steady traffic (the archive grows every month)",
    "glacier_after_days": "bucket lifecycle: archive/ to GLACIER_IR after 90 days",
    "sweep_runs": "template TurnSweepSchedule rate(2 minutes): 730 h × 30",
    "sweep_ms": "turn_sweep: 16 index Queries that find nothing",
    "sweep_rru": "16 index Queries at 0.5 RRU while no turn is unfinished",
    "export_runs": "usage_export's daily cron",
    "export_ms_base": "usage_export start-up, its S3 PUTs and the monthly file joined from the daily files "
                      "(server-side copies)",
    "export_memory_mb": "template: usage_export runs at 1769 MB (one vCPU: it is CPU-bound; streamed, it needs "
                        "~80 MB); a run reads its day's records (~1M at 30M turns a month: ~150 s)",
    "archive_runs": "history_archive: one invocation per 300 s batching window while TTL deletes arrive",
    "archive_ms_base": "history_archive: decode a batch of stream records",
    "archive_ms_per_put": "history_archive: one gzip PUT per session in the batch",
    "secrets": "the LLM key in Secrets Manager",
    "host_tier": "template TurnHostTier default Enabled (with WorkerImageUri set)",
    "host_capacity": "AVM_TURN_HOST_CAPACITY: turns one host runs at once, whatever its CPU",
    "capacity_provider": "template TurnHostCapacityProvider (default FargateSpot): the hosts' vCPU and memory at the "
                         "Fargate Spot price (tests/bench/cost_prices.py, a stated discount), their IPv4 address "
                         "and heartbeats as on-demand; the load balancer front's always-running task on-demand "
                         "(base 1). Turns of an interrupted host finish in its 2-minute warning or are "
                         "interrupted and run again by the user: not priced (a replacement task starts on the "
                         "next scale-out alarm; meanwhile turns run on chat_turn, like the scale-out lag)",
    "scale_out_concurrency": "template TurnHostScaleOutConcurrency: chat_turn concurrency that starts a host",
    "scale_in_turns": "template TurnHostScaleInTurns: a host goes when the hosts' running turns average under 1 "
                      "for 15 minutes",
    "heartbeat_s": "AVM_TURN_HOST_HEARTBEAT_S: one registry write (1 WRU) per host each",
    "front": "WebSocketFront: each month is priced on the cheaper front (api_gateway or load_balancer); the "
             "JSON gives both totals and the volume where the load balancer pays for itself",
    "lb_min_tasks": "WebSocketFront=LoadBalancer: an ALB without a target refuses connections, so one host "
                    "always runs",
    "alb_public_ipv4": "an internet-facing ALB in two Availability Zones: one public IPv4 address each",
    "per_connection_bytes": "bytes an ALB processes per connection besides turns (subscribe, history answer)",
    "day_curve": "turns per hour of the day (relative): a single-region user base, peak/average 1.6",
}

# The EMF metrics the code emits (functions/*/handler.py, agentvm/cloud/observability.py record_turns,
# agentvm/turnhost/__main__.py), each with the dimensions `service` and `function` only: one billed
# custom metric per line, prorated by the hours it receives data. tests/bench/test_metric_inventory.py
# checks that this is exactly what the code emits. (function, metric, when it gets data):
# "lambda" / "host": hours with turns on that tier (a host's heartbeat metric: hours a host runs);
# "connections", "api", "archive": hours with traffic ("connections": on the API Gateway front; "front":
# the same metrics from the hosts' own front with WebSocketFront=LoadBalancer); "sweep": every hour;
# "export": one hour a day;
# "failure": only hours with a deployment fault (a 5xx, a malformed invoke, a failed dispatch), none
# in a healthy month. Breakdowns (status, tier, model family, reason, tenant) are log fields.
TURN_METRICS = ("TurnsRun", "TurnDuration", "TurnErrors", "InputTokens", "OutputTokens")
METRICS: tuple[tuple[str, str, str], ...] = (
    *(("chat_turn", name, "lambda") for name in TURN_METRICS),
    ("chat_turn", "InvalidPayloads", "failure"),
    *(("turn_host", name, "host") for name in TURN_METRICS),
    ("turn_host", "HostRunningTurns", "host"),  # the scale-in alarm's metric
    ("turn_host", "ConnectionsAccepted", "front"),  # WebSocketFront=LoadBalancer: the host's own front
    ("turn_host", "ConnectionsRefused", "front"),
    ("ws_connect", "ConnectionsAccepted", "connections"),
    ("ws_connect", "ConnectionsRefused", "connections"),
    ("ws_default", "ConnectionsRefused", "connections"),  # auth frames refused or timed out
    ("http_api", "Requests", "api"),
    ("http_api", "ServerErrors", "failure"),
    ("turn_sweep", "SweepDispatched", "sweep"),  # every run, 0 or not
    ("turn_sweep", "SweepDispatchFailed", "failure"),
    ("usage_export", "UsageExportRows", "export"),
    ("history_archive", "HistoryArchivedItems", "archive"),
)
