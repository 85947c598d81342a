"""Monthly AWS bill of the cloud tier for a usage scenario, built from per-turn counts.

    .venv/bin/python -m tests.bench.cost_model --counts FILE.json [--flush-ms 250]
    .venv/bin/python -m tests.bench.cost_model --assume
        [--chat-turn-memory MB] [--json OUT]

`--counts` reads what the AWS-calls benchmark measured per pure-chat turn for each flush window
(`{"flush_ms": {"250": {"post_to_connection": 25, "ddb_write_units": 14, ...}}}`); whatever a file
does not hold (durations, sizes, per-connection counts) comes from the labelled assumptions below.
`--assume` uses the assumptions alone. Money is `Decimal` throughout, never float. Prints every
line item, the total, what the free tier would take off (not subtracted), the sensitivity to the
design levers and an always-on comparison; exits 1 if the total reaches BUDGET_USD.
See docs/cost-model.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

BUDGET_USD = Decimal(150)
GIB = Decimal(2**30)  # AWS bills storage, logs and transfer per GB of 2^30 bytes
MB_PER_GB = Decimal(1024)  # Lambda: 512 MB = 0.5 GB
HOURS_PER_MONTH = Decimal(730)  # AWS's month in its pricing examples
DAYS_PER_MONTH = Decimal(30)
MILLION = Decimal(1_000_000)

D = Decimal


# ---- prices --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Price:
    """`amount` USD per `per` units of `unit`, with where it comes from."""

    name: str
    amount: Decimal
    per: Decimal
    unit: str
    source: str
    as_of: str
    free_tier: Decimal = field(default=D(0))  # units a month the free tier covers (never subtracted)
    free_tier_kind: str = ""  # "always free" or "12 months, accounts opened before 2025-07-15"

    def cost(self, quantity: Decimal) -> Decimal:
        return quantity * self.amount / self.per

    def label(self) -> str:
        per = "" if self.per == 1 else f"{self.per:,.0f} "
        return f"${self.amount} / {per}{self.unit}"


_APIGW = "https://aws.amazon.com/api-gateway/pricing/"
_LAMBDA = "https://aws.amazon.com/lambda/pricing/"
_DDB = "https://aws.amazon.com/dynamodb/pricing/on-demand/"
_CW = "https://aws.amazon.com/cloudwatch/pricing/"
_S3 = "https://aws.amazon.com/s3/pricing/"
_EC2 = "https://aws.amazon.com/ec2/pricing/on-demand/"
_SM = "https://aws.amazon.com/secrets-manager/pricing/"
_UNVERIFIED = "as listed by AWS in 2025; not re-verified offline"
_LEGACY_FREE = "12 months, accounts opened before 2025-07-15"


@dataclass(frozen=True)
class Prices:
    """us-east-1 list prices (first tier of each; every quantity here is far below the next tier)."""

    ws_message: Price
    ws_connection_minute: Price
    lambda_request: Price
    lambda_gb_s: Price
    snapstart_cache_gb_s: Price
    snapstart_restore_gb: Price
    ddb_write_unit: Price
    ddb_read_unit: Price
    ddb_storage_gb_month: Price
    ddb_pitr_gb_month: Price
    logs_ingest_gb: Price
    logs_storage_gb_month: Price
    s3_storage_gb_month: Price
    s3_put: Price
    s3_get: Price
    transfer_out_gb: Price
    secret_month: Price
    secret_api_call: Price
    # always-on alternatives (comparison only)
    ec2_t4g_small_hour: Price
    fargate_arm_vcpu_hour: Price
    fargate_arm_gb_hour: Price
    alb_hour: Price
    alb_lcu_hour: Price
    public_ipv4_hour: Price

    def all(self) -> list[Price]:
        return [getattr(self, f) for f in self.__dataclass_fields__]


US_EAST_1 = Prices(
    ws_message=Price("API Gateway WebSocket message", D("1.00"), MILLION, "messages", _APIGW,
                     "2026 (first 1 billion a month; confirmed by awsforengineers.com 2025-05-19; the AWS page meters "
                     "messages in 32 KB increments)", D(1_000_000), _LEGACY_FREE),
    ws_connection_minute=Price("API Gateway WebSocket connection minute", D("0.25"), MILLION, "connection minutes",
                               _APIGW, "2026 (confirmed by repost.aws quoting the AWS page)", D(750_000), _LEGACY_FREE),
    lambda_request=Price("Lambda request", D("0.20"), MILLION, "requests", _LAMBDA,
                         "2026 (confirmed by cloudchipr.com 2024 and the AWS free-tier text)", D(1_000_000),
                         "always free"),
    lambda_gb_s=Price("Lambda duration, arm64", D("0.0000133334"), D(1), "GB-s", _LAMBDA,
                      "2026 (first 7.5 billion GB-s a month; confirmed by cloudchipr.com 2024)", D(400_000),
                      "always free"),
    snapstart_cache_gb_s=Price("Lambda SnapStart cache (Python)", D("0.0000015046"), D(1), "GB-s", _LAMBDA,
                               "2026 (confirmed by awsnegotiations.com 2026-05)"),
    snapstart_restore_gb=Price("Lambda SnapStart restore (Python)", D("0.0001397998"), D(1), "GB restored", _LAMBDA,
                               "2026 (confirmed by awsnegotiations.com 2026-05)"),
    ddb_write_unit=Price("DynamoDB on-demand write request unit", D("0.625"), MILLION, "WRU", _DDB,
                         "2026 (price since the 2024-11-01 cut; confirmed by airbyte.com 2025-07-21)"),
    ddb_read_unit=Price("DynamoDB on-demand read request unit", D("0.125"), MILLION, "RRU", _DDB,
                        "2026 (price since the 2024-11-01 cut; confirmed by airbyte.com 2025-07-21)"),
    ddb_storage_gb_month=Price("DynamoDB Standard storage", D("0.25"), D(1), "GB-month",
                               "https://aws.amazon.com/dynamodb/pricing/", "2026 (AWS page: first 25 GB free)",
                               D(25), "always free"),
    ddb_pitr_gb_month=Price("DynamoDB point-in-time recovery", D("0.20"), D(1), "GB-month", _DDB,
                            "2026 (confirmed by finops.com.py)"),
    logs_ingest_gb=Price("CloudWatch Logs ingestion (Lambda, first 10 TB)", D("0.50"), D(1), "GB", _CW,
                         "2026 (Lambda logs tiered since 2025-05-01, first tier unchanged; duckbillgroup.com, "
                         "c3x.dev 2026-06)", D(5), "always free"),
    logs_storage_gb_month=Price("CloudWatch Logs storage", D("0.03"), D(1), "GB-month", _CW,
                                "2026 (hykell.com; c3x.dev 2026-06)", D(5), "always free"),
    s3_storage_gb_month=Price("S3 Standard storage", D("0.023"), D(1), "GB-month", _S3,
                              "2026 (first 50 TB; cloudburn.io 2026-03)", D(5), _LEGACY_FREE),
    s3_put=Price("S3 PUT request", D("0.005"), D(1000), "requests", _S3, "2026 (devnotes.tech)"),
    s3_get=Price("S3 GET request", D("0.0004"), D(1000), "requests", _S3, "2026 (devnotes.tech)"),
    transfer_out_gb=Price("Data transfer out to the internet", D("0.09"), D(1), "GB", _EC2,
                          "2026 (first 10 TB; awsforengineers.com 2025-05-19)", D(100), "always free"),
    secret_month=Price("Secrets Manager secret", D("0.40"), D(1), "secret-months", _SM, _UNVERIFIED),
    secret_api_call=Price("Secrets Manager API call", D("0.05"), D(10_000), "calls", _SM, _UNVERIFIED),
    ec2_t4g_small_hour=Price("EC2 t4g.small (Linux, on demand)", D("0.0168"), D(1), "instance-hours", _EC2,
                             _UNVERIFIED),
    fargate_arm_vcpu_hour=Price("Fargate Linux/ARM vCPU", D("0.03238"), D(1), "vCPU-hours",
                                "https://aws.amazon.com/fargate/pricing/", "2026 (vantage.sh; cloudburn.io 2026-04)"),
    fargate_arm_gb_hour=Price("Fargate Linux/ARM memory", D("0.00356"), D(1), "GB-hours",
                              "https://aws.amazon.com/fargate/pricing/", "2026 (vantage.sh; cloudburn.io 2026-04)"),
    alb_hour=Price("Application Load Balancer", D("0.0225"), D(1), "ALB-hours",
                   "https://aws.amazon.com/elasticloadbalancing/pricing/", "2026 (cloud-horizons.com 2026-05-08)"),
    alb_lcu_hour=Price("Application Load Balancer LCU", D("0.008"), D(1), "LCU-hours",
                       "https://aws.amazon.com/elasticloadbalancing/pricing/", "2026 (cloud-horizons.com 2026-05-08)"),
    public_ipv4_hour=Price("Public IPv4 address", D("0.005"), D(1), "address-hours", "https://aws.amazon.com/vpc/pricing/",
                           _UNVERIFIED),
)


# ---- what is counted -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Invocation:
    """`count` invocations of one function (per turn, or per connection) and what each is billed."""

    function: str
    count: Decimal
    duration_ms: Decimal  # billed duration of a warm invocation
    memory_mb: int
    init_ms: Decimal = field(default=D(0))  # INIT billed on a cold start (billed since 2025-08-01); 0 with SnapStart
    snapstart: bool = False

    def gb_s(self, invocations: Decimal) -> Decimal:
        return invocations * self.memory_mb / MB_PER_GB * self.duration_ms / 1000


@dataclass(frozen=True)
class ConnectionCounts:
    """AWS usage of one WebSocket connection outside its turns: $connect, a subscribe, $disconnect."""

    inbound_frames: Decimal
    outbound_frames: Decimal
    invocations: tuple[Invocation, ...]
    ddb_write_units: Decimal
    ddb_read_units: Decimal


@dataclass(frozen=True)
class TurnCounts:
    """AWS usage of one pure-chat turn (no tools, no attachments)."""

    source: str  # where the counts come from: a measurement file and flush window, or "assumed"
    inbound_frames: Decimal  # client → server messages (ACKs are off in the cloud)
    outbound_frames: Decimal  # post_to_connection calls
    outbound_32kb_units: Decimal  # API Gateway meters each message per 32 KB started
    ddb_write_units: Decimal  # WRU, index writes included
    ddb_read_units: Decimal  # RRU
    invocations: tuple[Invocation, ...]
    per_connection: ConnectionCounts
    s3_put_requests: Decimal = field(default=D(0))
    s3_get_requests: Decimal = field(default=D(0))
    s3_stored_bytes: Decimal = field(default=D(0))  # kept in S3 per turn (tmp/ objects expire after a day)
    stored_bytes: Decimal = field(default=D(1836))  # kept in DynamoDB per turn: messages, turn item, item overheads
    event_bytes: Decimal = field(default=D(4096))  # event-log items per turn, kept for event_ttl_hours
    log_bytes: Decimal = field(default=D(600))  # structured application log line(s) per turn
    platform_log_bytes: Decimal = field(default=D(900))  # per invocation: START, END, REPORT, ~300 B each
    egress_bytes: Decimal = field(default=D(20_480))  # to the internet: frames to clients + LLM request


@dataclass(frozen=True)
class Scheduled:
    """A function that runs on a schedule whatever the traffic: `invocation.count` runs a month, each
    reading `read_units`, plus `read_units_per_turn` for each turn of the month (a job that reads the
    month's records)."""

    invocation: Invocation
    read_units: Decimal = field(default=D(0))
    read_units_per_turn: Decimal = field(default=D(0))


# template.yaml's schedules. turn_sweep (TurnSweepSchedule, every 2 minutes): its 16 index Queries
# read nothing while no turn is unfinished, billed 0.5 RRU each. usage_export (daily): reads the
# month to date, half a month of usage records on average, ~512 B each, 0.5 RRU per 4 KB.
SCHEDULES = (
    Scheduled(Invocation("turn_sweep", HOURS_PER_MONTH * 30, D(150), 256, init_ms=D(1000)), read_units=D(8)),
    Scheduled(Invocation("usage_export", DAYS_PER_MONTH, D(60_000), 512, init_ms=D(1000)),
              read_units_per_turn=DAYS_PER_MONTH / 2 * 512 / 4096 / 2),
)


@dataclass(frozen=True)
class Scenario:
    registered_users: int = 1_000_000
    active_share: Decimal = field(default=D("0.05"))
    turns_per_active_user: int = 20
    connections_per_active_user: Decimal = field(default=D(4))  # WebSocket sessions a month
    minutes_per_connection: Decimal = field(default=D("7.5"))  # 30 connection-minutes per active user a month
    cold_start_share: Decimal = field(default=D("0.01"))  # invocations that start a new execution environment
    retained_months: int = 12  # conversations kept in DynamoDB: the table after a year of this traffic
    event_ttl_hours: Decimal = field(default=D(48))  # event-log items expire (DynamoDB TTL, free deletes)
    log_retention_days: Decimal = field(default=D(14))  # template.yaml LogRetentionDays
    secrets: int = 1  # the LLM key in Secrets Manager
    schedules: tuple[Scheduled, ...] = SCHEDULES

    @property
    def active_users(self) -> Decimal:
        return self.registered_users * self.active_share

    @property
    def turns(self) -> Decimal:
        return self.active_users * self.turns_per_active_user

    @property
    def connections(self) -> Decimal:
        return self.active_users * self.connections_per_active_user


# ---- the bill ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LineItem:
    service: str
    item: str
    quantity: Decimal
    price: Price

    @property
    def cost(self) -> Decimal:
        return self.price.cost(self.quantity)


@dataclass(frozen=True)
class CostBreakdown:
    scenario: Scenario
    counts: TurnCounts
    items: tuple[LineItem, ...]

    @property
    def total(self) -> Decimal:
        return sum((i.cost for i in self.items), D(0))

    @property
    def per_turn(self) -> Decimal:
        return self.total / self.scenario.turns if self.scenario.turns else D(0)

    def top(self, n: int) -> list[LineItem]:
        return sorted(self.items, key=lambda i: i.cost, reverse=True)[:n]

    def free_tier(self) -> dict[str, Decimal]:
        """What the free tier would take off, by kind (lines sharing a price share its allowance)."""
        used: dict[str, tuple[Price, Decimal]] = {}
        for i in self.items:
            p, q = used.get(i.price.name, (i.price, D(0)))
            used[i.price.name] = (p, q + i.quantity)
        out: dict[str, Decimal] = {}
        for p, q in used.values():
            if p.free_tier:
                out[p.free_tier_kind] = out.get(p.free_tier_kind, D(0)) + p.cost(min(q, p.free_tier))
        return out


def monthly_cost(counts: TurnCounts, scenario: Scenario, prices: Prices = US_EAST_1) -> CostBreakdown:
    """The monthly bill: one line per billed quantity, exact (no rounding)."""
    turns, conns = scenario.turns, scenario.connections
    conn = counts.per_connection
    runs = [(inv, turns * inv.count) for inv in counts.invocations]
    runs += [(inv, conns * inv.count) for inv in conn.invocations]
    runs += [(job.invocation, job.invocation.count) for job in scenario.schedules]
    scheduled_reads = sum((job.invocation.count * job.read_units + turns * job.read_units_per_turn
                           for job in scenario.schedules), D(0))
    invocations = sum((n for _inv, n in runs), D(0))
    cold = [(inv, n * scenario.cold_start_share) for inv, n in runs]

    by_function: dict[str, tuple[Invocation, Decimal]] = {}
    for inv, n in runs:
        first, total = by_function.get(inv.function, (inv, D(0)))
        by_function[inv.function] = (first, total + inv.gb_s(n))
    init_gb_s = sum((n * inv.memory_mb / MB_PER_GB * inv.init_ms / 1000 for inv, n in cold), D(0))
    snap = {inv.function: inv for inv, _n in runs if inv.snapstart}
    restored_gb = sum((n * inv.memory_mb / MB_PER_GB for inv, n in cold if inv.snapstart), D(0))
    cached_gb_s = sum((D(inv.memory_mb) / MB_PER_GB * HOURS_PER_MONTH * 3600 for inv in snap.values()), D(0))
    secret_calls = sum((n for inv, n in cold if inv.function == "chat_turn"), D(0))

    stored_gb = (turns * scenario.retained_months * counts.stored_bytes
                 + turns * scenario.event_ttl_hours / HOURS_PER_MONTH * counts.event_bytes) / GIB
    log_gb = (turns * counts.log_bytes + invocations * counts.platform_log_bytes) / GIB

    p = prices
    items = [
        LineItem("API Gateway", "WebSocket messages (per 32 KB)",
                 turns * (counts.inbound_frames + counts.outbound_32kb_units)
                 + conns * (conn.inbound_frames + conn.outbound_frames), p.ws_message),
        LineItem("API Gateway", "WebSocket connection minutes", conns * scenario.minutes_per_connection,
                 p.ws_connection_minute),
        LineItem("Lambda", "requests", invocations, p.lambda_request),
        *(LineItem("Lambda", f"{name} duration ({inv.memory_mb} MB × {inv.duration_ms} ms)", gb_s, p.lambda_gb_s)
          for name, (inv, gb_s) in by_function.items()),
        LineItem("Lambda", f"INIT of cold starts ({scenario.cold_start_share:.0%} of invocations)", init_gb_s,
                 p.lambda_gb_s),
        LineItem("Lambda", f"SnapStart cache ({', '.join(snap) or 'none'})", cached_gb_s, p.snapstart_cache_gb_s),
        LineItem("Lambda", "SnapStart restores (cold starts)", restored_gb, p.snapstart_restore_gb),
        LineItem("DynamoDB", "write request units", turns * counts.ddb_write_units + conns * conn.ddb_write_units,
                 p.ddb_write_unit),
        LineItem("DynamoDB", "read request units",
                 turns * counts.ddb_read_units + conns * conn.ddb_read_units + scheduled_reads, p.ddb_read_unit),
        LineItem("DynamoDB", f"storage ({scenario.retained_months} months of turns)", stored_gb,
                 p.ddb_storage_gb_month),
        LineItem("DynamoDB", "point-in-time recovery", stored_gb, p.ddb_pitr_gb_month),
        LineItem("CloudWatch Logs", "ingestion", log_gb, p.logs_ingest_gb),
        LineItem("CloudWatch Logs", f"storage ({scenario.log_retention_days} days)",
                 log_gb * scenario.log_retention_days / DAYS_PER_MONTH, p.logs_storage_gb_month),
        LineItem("S3", "PUT requests", turns * counts.s3_put_requests, p.s3_put),
        LineItem("S3", "GET requests", turns * counts.s3_get_requests, p.s3_get),
        LineItem("S3", "storage", turns * counts.s3_stored_bytes / GIB, p.s3_storage_gb_month),
        LineItem("Data transfer", "out to the internet", turns * counts.egress_bytes / GIB, p.transfer_out_gb),
        LineItem("Secrets Manager", "LLM key", D(scenario.secrets), p.secret_month),
        LineItem("Secrets Manager", "GetSecretValue (chat_turn cold starts)", secret_calls, p.secret_api_call),
    ]
    return CostBreakdown(scenario, counts, tuple(items))


# ---- always-on comparison ------------------------------------------------------------------------


@dataclass(frozen=True)
class AlwaysOn:
    name: str
    items: tuple[LineItem, ...]

    @property
    def total(self) -> Decimal:
        return sum((i.cost for i in self.items), D(0))


def always_on(prices: Prices = US_EAST_1) -> list[AlwaysOn]:
    """The compute and front door of `avm serve` run 24/7 instead of API Gateway + Lambda: two of
    everything for two availability zones, in public subnets (no NAT gateway), one ALB at one LCU.
    DynamoDB, logs, egress and the secret are the same in both designs and left out."""
    h = HOURS_PER_MONTH
    alb = (LineItem("ELB", "ALB", h, prices.alb_hour), LineItem("ELB", "ALB LCU (1 average)", h, prices.alb_lcu_hour),
           LineItem("VPC", "public IPv4: ALB (2 AZ)", 2 * h, prices.public_ipv4_hour))
    return [
        AlwaysOn("2 × EC2 t4g.small + ALB",
                 (LineItem("EC2", "2 × t4g.small", 2 * h, prices.ec2_t4g_small_hour),
                  LineItem("VPC", "public IPv4: 2 instances", 2 * h, prices.public_ipv4_hour), *alb)),
        AlwaysOn("2 × Fargate ARM task (0.5 vCPU, 1 GB) + ALB",
                 (LineItem("Fargate", "2 × 0.5 vCPU", h, prices.fargate_arm_vcpu_hour),
                  LineItem("Fargate", "2 × 1 GB", 2 * h, prices.fargate_arm_gb_hour),
                  LineItem("VPC", "public IPv4: 2 tasks", 2 * h, prices.public_ipv4_hour), *alb)),
    ]


SERVERLESS_FRONT_AND_COMPUTE = ("API Gateway", "Lambda")


def front_and_compute(b: CostBreakdown) -> Decimal:
    return sum((i.cost for i in b.items if i.service in SERVERLESS_FRONT_AND_COMPUTE), D(0))


# ---- counts: assumed, or read from the AWS-calls benchmark ---------------------------------------


def _ws_default(count: Decimal) -> Invocation:
    # store the message and the queued turn, take and release the lease, two posts, async-invoke chat_turn
    return Invocation("ws_default", count, D(150), 256, init_ms=D(1000))


def _chat_turn(count: Decimal, memory_mb: int = 512) -> Invocation:
    # waits on the LLM stream (~10 s for a 100-delta reply) + lease, history, checkpoint, recheck (~0.5 s)
    return Invocation("chat_turn", count, D(10_500), memory_mb, snapstart=True)


ASSUMED_CONNECTION = ConnectionCounts(
    inbound_frames=D(2), outbound_frames=D(2),  # subscribe + one list/history request, and their answers
    invocations=(Invocation("ws_connect", D(1), D(60), 256, init_ms=D(1000)), _ws_default(D(2)),
                 Invocation("ws_disconnect", D(1), D(60), 256, init_ms=D(1000))),
    # $connect: key lookup + connection put; subscribe: session read + subscription put; history: 2 RRU;
    # $disconnect: connection read, subscriptions query, 3 deletes
    ddb_write_units=D(5), ddb_read_units=D(6))

# Per pure-chat turn (a 10 s, 100-delta reply), until the AWS-calls benchmark measures them.
ASSUMED: dict[int, TurnCounts] = {
    flush: TurnCounts(source=f"assumed (flushMs={flush})", inbound_frames=D(1), outbound_frames=D(posts),
                      outbound_32kb_units=D(posts), ddb_write_units=D(wru), ddb_read_units=D(rru),
                      invocations=(_ws_default(D(1)), _chat_turn(D(1))), per_connection=ASSUMED_CONNECTION)
    for flush, posts, wru, rru in ((0, 101, 12, 9), (250, 25, 14, 10))
}
DEFAULT_FLUSH_MS = 250  # template.yaml StreamFlushMs


def counts_from_measurement(m: Mapping[str, Any], source: str, base: TurnCounts) -> TurnCounts:
    """Measured per-turn counts over `base`'s assumptions (durations, sizes, per connection)."""

    def num(key: str) -> Decimal:
        return D(str(m[key]))

    known = {inv.function: inv for inv in base.invocations}
    invocations = tuple(replace(known[f], count=D(str(n))) if f in known
                        else Invocation(f, D(str(n)), D(100), 256, init_ms=D(1000))
                        for f, n in sorted(m["lambda_invocations"].items()))
    posts = num("post_to_connection")
    return replace(base, source=source, inbound_frames=num("inbound_frames"), outbound_frames=posts,
                   outbound_32kb_units=D(str(m.get("post_units_32kb", posts))),
                   ddb_write_units=num("ddb_write_units"), ddb_read_units=num("ddb_read_units"),
                   s3_put_requests=D(str(m.get("s3_put_requests", 0))),
                   s3_get_requests=D(str(m.get("s3_get_requests", 0))), invocations=invocations)


def load_counts(path: Path) -> dict[int, TurnCounts]:
    """Every flush window of an AWS-calls benchmark file, by flushMs."""
    data = json.loads(path.read_text())
    out = {}
    for key, m in data["flush_ms"].items():
        flush = int(key)
        base = ASSUMED.get(flush, ASSUMED[DEFAULT_FLUSH_MS])
        out[flush] = counts_from_measurement(m, f"measured: {path.name}, flushMs={flush}", base)
    return out


def with_chat_turn_memory(counts: TurnCounts, memory_mb: int) -> TurnCounts:
    return replace(counts, invocations=tuple(replace(i, memory_mb=memory_mb) if i.function == "chat_turn" else i
                                             for i in counts.invocations))


# ---- report --------------------------------------------------------------------------------------


def usd(v: Decimal, places: str = "0.01") -> str:
    return f"${v.quantize(D(places), rounding=ROUND_HALF_UP):,}"


def qty(v: Decimal) -> str:
    if v == v.to_integral_value():
        return f"{v:,.0f}"
    return f"{v:,.2f}" if abs(v) >= 1 else f"{v:.4f}"


def table(rows: Iterable[tuple[str, ...]], right: Iterable[int]) -> str:
    rows = list(rows)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    r_cols = set(right)
    lines = ["  ".join(c.rjust(w) if i in r_cols else c.ljust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render(b: CostBreakdown) -> str:
    s = b.scenario
    rows = [("service", "line item", "quantity", "unit", "unit price", "monthly")]
    rows += [(i.service, i.item, qty(i.quantity), i.price.unit, i.price.label(), usd(i.cost)) for i in b.items]
    rows.append(("", "TOTAL", "", "", "", usd(b.total)))
    free = b.free_tier()
    top = ", ".join(f"{i.service} {i.item} {usd(i.cost)} ({i.cost / b.total:.0%})" for i in b.top(3))
    return "\n".join([
        f"Monthly AWS cost, us-east-1 — {s.registered_users:,} registered users, {s.active_share:.0%} active, "
        f"{s.turns_per_active_user} turns each = {s.turns:,.0f} turns a month",
        f"counts: {b.counts.source}",
        table(rows, right=(2, 5)),
        f"per turn: {usd(b.per_turn, '0.000001')} · top 3: {top}",
        "free tier, NOT subtracted above: " + "; ".join(f"{k} {usd(v)}" for k, v in free.items()),
    ])


def sensitivity(counts_by_flush: Mapping[int, TurnCounts], scenario: Scenario, prices: Prices,
                chosen_flush: int) -> str:
    rows = [("flushMs", "chat_turn MB", "posts/turn", "monthly", "per turn")]
    for flush, counts in sorted(counts_by_flush.items()):
        for mb in (256, 512):
            b = monthly_cost(with_chat_turn_memory(counts, mb), scenario, prices)
            mark = " *" if flush == chosen_flush and mb == _memory(counts) else ""
            rows.append((f"{flush}{mark}", str(mb), qty(counts.outbound_frames), usd(b.total),
                         usd(b.per_turn, "0.000001")))
    return table(rows, right=(1, 2, 3, 4))


def _memory(counts: TurnCounts) -> int:
    return next((i.memory_mb for i in counts.invocations if i.function == "chat_turn"), 0)


def comparison(b: CostBreakdown, prices: Prices) -> str:
    """API Gateway + Lambda against always-on alternatives, and the load at which they cost the same."""
    ours = front_and_compute(b)
    idle = front_and_compute(monthly_cost(b.counts, replace(b.scenario, active_share=D(0)), prices))
    per_turn = (ours - idle) / b.scenario.turns
    lines = [f"front door + compute: API Gateway + Lambda {usd(ours)} a month at this load, "
             f"{usd(idle)} when idle (SnapStart cache)"]
    for alt in always_on(prices):
        crossover = (alt.total - idle) / per_turn if per_turn else D(0)
        lines.append(f"  vs {alt.name}: {usd(alt.total)} a month, idle or not "
                     f"(API Gateway + Lambda cost the same at {crossover:,.0f} turns a month)")
    return "\n".join(lines)


def as_json(b: CostBreakdown) -> dict[str, Any]:
    return {"source": b.counts.source, "turns": str(b.scenario.turns), "total_usd": str(b.total),
            "per_turn_usd": str(b.per_turn), "budget_usd": str(BUDGET_USD),
            "free_tier_usd": {k: str(v) for k, v in b.free_tier().items()},
            "items": [{"service": i.service, "item": i.item, "quantity": str(i.quantity), "unit": i.price.unit,
                       "price": i.price.label(), "price_source": i.price.source, "price_as_of": i.price.as_of,
                       "monthly_usd": str(i.cost)} for i in b.items]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.cost_model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--counts", type=Path, metavar="FILE", help="per-turn counts from the AWS-calls benchmark")
    source.add_argument("--assume", action="store_true", help="use the labelled assumptions instead of a measurement")
    parser.add_argument("--flush-ms", type=int, default=DEFAULT_FLUSH_MS, help="flush window to price (default 250)")
    parser.add_argument("--chat-turn-memory", type=int, choices=(256, 512, 1024), default=512,
                        help="chat_turn memory in MB (template default 512)")
    parser.add_argument("--json", type=Path, help="also write the breakdown to this file")
    args = parser.parse_args(argv)
    by_flush = load_counts(args.counts) if args.counts else dict(ASSUMED)
    if args.flush_ms not in by_flush:
        parser.error(f"no counts for flushMs={args.flush_ms} (have: {', '.join(map(str, sorted(by_flush)))})")
    by_flush = {f: with_chat_turn_memory(c, args.chat_turn_memory) for f, c in by_flush.items()}
    scenario, prices = Scenario(), US_EAST_1
    b = monthly_cost(by_flush[args.flush_ms], scenario, prices)
    print(render(b))
    print()
    print("sensitivity (* = the table above):")
    print(sensitivity(by_flush, scenario, prices, args.flush_ms))
    print()
    print(comparison(b, prices))
    if args.json is not None:
        args.json.write_text(json.dumps(as_json(b), indent=2) + "\n")
    if b.total >= BUDGET_USD:
        print(f"FAILED: the monthly total {usd(b.total)} is not under {usd(BUDGET_USD)}")
        return 1
    print(f"OK: the monthly total {usd(b.total)} is under {usd(BUDGET_USD)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
