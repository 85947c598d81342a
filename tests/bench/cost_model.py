"""The monthly AWS bill of the cloud tier, for the 1M-turn month, the 30M-turn month and the idle month,
with the turn tiers (per-turn Lambda `chat_turn`, the ECS Fargate turn host) and the crossover.

    .venv/bin/python -m tests.bench.cost_model --counts docs/aws-calls.json [--json -|FILE]
        [--chat-turn-memory MB] [--batched-share 0..1] [--snapstart-versions N] [--pitr on|off]
        [--llm-seconds S] [--scale-out-concurrency N] [--host-tier on|off] [--capacity-provider spot|on_demand]

The per-turn counts come from the AWS-calls bench (tests/bench/cost_inputs.py says which keys); every
duration, size and ratio that is not counted is a stated assumption (`Assumptions`, printed in the
JSON with its why); the prices are tests/bench/cost_prices.py. Money is `Decimal` throughout. Exits 1
when a goal is missed (30M ≤ $750 and ≤ $0.000025 a turn, 1M ≤ $40, idle ≤ $3). See docs/cost-model.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from tests.bench.cost_inputs import (
    DAYS_PER_MONTH,
    GIB,
    GOALS,
    HOURS_PER_MONTH,
    MB_PER_GB,
    METRICS,
    PER_TURN_GOAL,
    SCENARIOS,
    Assumptions,
    Counts,
    Scenario,
    TierCounts,
    load_balancer_tier,
    load_counts,
)
from tests.bench.cost_prices import US_EAST_1, Price, Prices

D = Decimal
FRONTS = ("api_gateway", "load_balancer")
ZERO = D(0)


@dataclass(frozen=True)
class Line:
    service: str
    item: str
    quantity: Decimal
    price: Price
    tier: str | None = None

    @property
    def cost(self) -> Decimal:
        return self.price.cost(self.quantity)

    def as_json(self) -> dict[str, str]:
        out = {"service": self.service, "item": self.item, "quantity": str(self.quantity), "unit": self.price.unit,
               "unit_price_usd": str(self.price.unit_price), "monthly_usd": str(self.cost)}
        if self.tier:
            out["tier"] = self.tier
        return out


@dataclass(frozen=True)
class Model:
    counts: Counts
    a: Assumptions
    p: Prices = US_EAST_1

    @property
    def load_balancer(self) -> bool:
        return self.a.front == "load_balancer"

    def with_front(self, front: str) -> Model:
        return Model(self.counts, replace(self.a, front=front), self.p)

    @property
    def host_counts(self) -> TierCounts:
        """The host tier's turn as this front bills it."""
        return load_balancer_tier(self.counts.host_tier) if self.load_balancer else self.counts.host_tier

    @property
    def chat_turn_mb(self) -> int:
        return self.counts.chat_turn_memory_mb or self.a.chat_turn_memory_mb

    def turn_seconds(self, t: TierCounts) -> Decimal:
        """A turn's billed wall time: the assumed LLM wait + what the bench measured around its reply."""
        return self.a.llm_seconds + max(D(0), t.turn_seconds - self.counts.scripted_reply_s)

    # ---- per turn ----------------------------------------------------------------------------------

    def turn_lines(self, t: TierCounts, n: Decimal) -> list[Line]:
        """The bill of `n` pure-chat turns on tier `t` (everything that scales with turns)."""
        a, p, tier = self.a, self.p, t.tier
        out_frames = (1 - a.batched_share) * t.frames_stock + a.batched_share * t.frames_batched
        lines = [Line("API Gateway", "WebSocket messages (turns)",
                      n * (t.inbound_frames + out_frames + t.extra_32kb_units), p.ws_message, tier)]
        init_gb_s = restored_gb = secret_calls = D(0)
        for fn, per_turn in sorted(t.lambda_invocations.items()):
            calls = n * per_turn
            if fn == "chat_turn":
                ms, mb = self.turn_seconds(t) * 1000, self.chat_turn_mb
            else:
                ms, mb = (a.ws_default_ms if fn == "ws_default" else D(100)), a.function_memory_mb
            lines.append(Line("Lambda", f"{fn} requests", calls, p.lambda_request, tier))
            lines.append(Line("Lambda", f"{fn} duration ({mb} MB × {ms:.0f} ms)", calls * mb / MB_PER_GB * ms / 1000,
                              p.lambda_gb_s, tier))
            cold = calls * a.cold_start_share
            if fn == "chat_turn" and a.snapstart:
                restored_gb += cold * mb / MB_PER_GB
            else:
                init_gb_s += cold * mb / MB_PER_GB * a.init_ms / 1000
            if fn == "chat_turn":
                secret_calls += cold
        log_bytes = n * (a.log_line_bytes + a.emf_bytes_per_turn + 2 * a.log_event_overhead)  # line + blob
        lines += [
            Line("Lambda", f"INIT of cold starts ({a.cold_start_share:.0%})", init_gb_s, p.lambda_gb_s, tier),
            Line("Lambda", "SnapStart restores (chat_turn cold starts)", restored_gb, p.snapstart_restore_gb, tier),
            Line("DynamoDB", "write request units (turns)", n * t.ddb_write_units, p.ddb_write_unit, tier),
            Line("DynamoDB", "read request units (turns)", n * t.ddb_read_units, p.ddb_read_unit, tier),
            Line("SQS", "requests (send, receive, delete)", n * t.sqs_requests, p.sqs_request, tier),
            Line("S3", "PUT requests (turns)", n * t.s3_put_requests, p.s3_put, tier),
            Line("S3", "GET requests (turns)", n * t.s3_get_requests, p.s3_get, tier),
            Line("CloudWatch Logs", "ingestion (app line + EMF per turn)", log_bytes / GIB, p.logs_ingest_gb, tier),
            Line("CloudWatch Logs", f"storage ({a.log_retention_days} days)",
                 log_bytes / GIB * a.log_retention_days / DAYS_PER_MONTH, p.logs_storage_gb_month, tier),
            Line("Data transfer", "out to the internet", n * (t.bytes_out or a.default_bytes_out) / GIB,
                 p.transfer_out_gb, tier),
            Line("Secrets Manager", "GetSecretValue (chat_turn cold starts)", secret_calls, p.secret_api_call, tier),
        ]
        return [line for line in lines if line.quantity]

    def per_turn(self, t: TierCounts) -> Decimal:
        return sum((line.cost for line in self.turn_lines(t, D(1))), D(0))

    # ---- the host tier -----------------------------------------------------------------------------

    @property
    def task_capacity(self) -> Decimal:
        return min(self.counts.host.concurrent_turns_at_70pct, self.a.host_capacity)

    @property
    def on_spot(self) -> bool:
        return self.a.capacity_provider == "spot"

    def task_hour_lines(self, hours: Decimal, on_demand_hours: Decimal = ZERO) -> list[Line]:
        """`hours` task-hours, `on_demand_hours` of them on on-demand FARGATE whatever the capacity provider
        (the load balancer front's base task); the others on the template's capacity provider."""
        h, p, a = self.counts.host, self.p, self.a
        on_demand = min(hours, on_demand_hours) if self.on_spot else hours
        spot = hours - on_demand
        gb = h.memory_mb / MB_PER_GB
        return [line for line in (
            Line("Fargate", f"turn host vCPU ({h.vcpu} vCPU, arm64)", on_demand * h.vcpu, p.fargate_arm_vcpu_hour,
                 "host"),
            Line("Fargate", f"turn host memory ({gb} GB)", on_demand * gb, p.fargate_arm_gb_hour, "host"),
            Line("Fargate", f"turn host vCPU ({h.vcpu} vCPU, arm64, Fargate Spot)", spot * h.vcpu,
                 p.fargate_spot_arm_vcpu_hour, "host"),
            Line("Fargate", f"turn host memory ({gb} GB, Fargate Spot)", spot * gb, p.fargate_spot_arm_gb_hour, "host"),
            Line("VPC", "public IPv4 (one per task)", hours, p.public_ipv4_hour, "host"),
            Line("DynamoDB", "write request units (host heartbeats)", hours * 3600 / a.heartbeat_s, p.ddb_write_unit,
                 "host"),
            Line("SQS", "long-poll receives of idle hosts (upper bound)", hours * a.idle_receives_per_hour,
                 p.sqs_request, "host"),
        ) if line.quantity]

    def task_hour_usd(self, *, on_demand: bool = False) -> Decimal:
        """What one running task costs an hour on the template's capacity provider (`on_demand`: on FARGATE
        whatever it is), its idle polls left out (a busy host receives turns)."""
        lines = self.task_hour_lines(D(1), D(1) if on_demand else D(0))
        return sum((line.cost for line in lines if "idle" not in line.item), D(0))

    def plan(self, s: Scenario) -> dict[str, Any]:
        """Which tier runs each hour of the day curve, tasks per hour, turns per tier (the scheduler's rule:
        a host takes turns when one runs; hosts start when chat_turn's concurrency reaches the scale-out
        threshold, after a lag, and go 15 minutes after their traffic)."""
        a = self.a
        lam_s, host_s = self.turn_seconds(self.counts.lambda_tier), self.turn_seconds(self.counts.host_tier)
        curve, curve_total = a.day_curve, D(sum(a.day_curve))
        per_hour = [s.turns * w / curve_total / DAYS_PER_MONTH for w in curve]  # turns in hour h of a day
        tasks = []
        for turns in per_hour:
            needed = math.ceil(turns * host_s / 3600 * a.within_hour_peak / self.task_capacity)
            if self.load_balancer:  # every turn on a host; one host always (the ALB's target)
                tasks.append(max(a.lb_min_tasks, needed))
                continue
            on = a.host_tier and turns and turns * lam_s / 3600 >= a.scale_out_concurrency
            tasks.append(needed if on else 0)
        host_weight = task_hours = D(0)  # host_weight: the day's turns on hosts, in day-curve units
        lambda_hours = 0
        for h, (w, n) in enumerate(zip(curve, tasks, strict=True)):
            prev = tasks[h - 1]
            task_hours += n + max(0, prev - n) * a.scale_in_delay_min / 60
            if self.load_balancer:
                on_host = D(w)
            else:
                on_host = D(w) * (1 - a.scale_out_lag_min / 60) if n and not prev else D(w if n else 0)
            host_weight += on_host
            lambda_hours += bool(s.turns and w - on_host)
        host_turns = s.turns * host_weight / curve_total
        return {"tasks_by_hour": tasks, "task_hours": task_hours * DAYS_PER_MONTH, "host_turns": host_turns,
                "lambda_turns": s.turns - host_turns, "host_hours_share": D(sum(1 for n in tasks if n)) / 24,
                "lambda_hours_share": D(lambda_hours) / 24}

    # ---- the month ---------------------------------------------------------------------------------

    def scenario_lines(self, s: Scenario) -> tuple[list[Line], dict[str, Any]]:
        c = self.counts
        plan = self.plan(s)
        lines: list[Line] = []
        if plan["lambda_turns"]:
            lines += self.turn_lines(c.lambda_tier, plan["lambda_turns"])
        if plan["host_turns"]:
            lines += self.turn_lines(self.host_counts, plan["host_turns"])
        base = HOURS_PER_MONTH * self.a.lb_min_tasks if self.load_balancer else D(0)  # on-demand (base 1)
        lines += self.task_hour_lines(plan["task_hours"], base)
        lines += self._connection_lines(s)
        if self.load_balancer:
            lines += self._load_balancer_lines(s)
        lines += self._schedule_lines(s)
        storage, growth = self._storage_lines(s)
        lines += storage
        lines += self._fixed_lines(plan)
        return [line for line in lines if line.quantity], {**plan, "archive_growth_gb": growth}

    def _connection_lines(self, s: Scenario) -> list[Line]:
        a, p, n = self.a, self.p, s.sessions
        if self.load_balancer:  # the hosts hold the connections: only the registry's writes and reads
            return [Line("DynamoDB", "write request units (connections)", n * a.per_connection_wru, p.ddb_write_unit),
                    Line("DynamoDB", "read request units (connections)", n * a.per_connection_rru, p.ddb_read_unit)]
        mb = D(a.function_memory_mb) / MB_PER_GB
        calls = {"ws_connect": (n, a.ws_connect_ms), "ws_disconnect": (n, a.ws_disconnect_ms),
                 "ws_default": (n * a.per_connection_ws_default, a.ws_default_ms)}
        lines = [Line("API Gateway", "WebSocket messages (connections)", n * a.per_connection_frames, p.ws_message),
                 Line("API Gateway", f"connection minutes ({s.minutes_per_connection} a connection)",
                      n * s.minutes_per_connection, p.ws_connection_minute)]
        for fn, (k, ms) in calls.items():
            lines.append(Line("Lambda", f"{fn} requests (connections)", k, p.lambda_request))
            lines.append(Line("Lambda", f"{fn} duration (connections, {a.function_memory_mb} MB × {ms} ms)",
                              k * mb * ms / 1000, p.lambda_gb_s))
        cold = sum((k for k, _ms in calls.values()), D(0)) * a.cold_start_share
        lines += [Line("Lambda", "INIT of cold starts (connections)", cold * mb * a.init_ms / 1000, p.lambda_gb_s),
                  Line("DynamoDB", "write request units (connections)", n * a.per_connection_wru, p.ddb_write_unit),
                  Line("DynamoDB", "read request units (connections)", n * a.per_connection_rru, p.ddb_read_unit)]
        return lines

    def lcu_hours(self, s: Scenario) -> Decimal:
        """The ALB's capacity units, hour by hour of the day curve: the largest of its dimensions (new
        connections / 25 a second, active connections / 3,000, processed GB / 1 an hour)."""
        a = self.a
        curve_total = D(sum(a.day_curve))
        turn_bytes = self.counts.host_tier.bytes_out or a.default_bytes_out
        total = D(0)
        for w in a.day_curve:
            share = D(w) / curve_total / DAYS_PER_MONTH
            turns, sessions = s.turns * share, s.sessions * share
            gb = (turns * turn_bytes + sessions * a.per_connection_bytes) / GIB
            active = sessions * s.minutes_per_connection / 60
            total += max(sessions / 3600 / 25, active / 3000, gb)
        return total * DAYS_PER_MONTH

    def _load_balancer_lines(self, s: Scenario) -> list[Line]:
        a, p = self.a, self.p
        return [Line("Elastic Load Balancing", "ALB hours (WebSocketFront=LoadBalancer)", HOURS_PER_MONTH, p.alb_hour),
                Line("Elastic Load Balancing", "ALB capacity units (by hour of the day curve)", self.lcu_hours(s),
                     p.alb_lcu_hour),
                Line("VPC", f"public IPv4 (the ALB's, {a.alb_public_ipv4} AZs)", HOURS_PER_MONTH * a.alb_public_ipv4,
                     p.public_ipv4_hour)]

    def _schedule_lines(self, s: Scenario) -> list[Line]:
        a, p = self.a, self.p
        fmb = D(a.function_memory_mb) / MB_PER_GB
        records = s.turns / DAYS_PER_MONTH  # a daily run reads its day; the month is joined from the daily files
        export_ms = a.export_ms_base + a.export_ms_per_record * records
        puts = s.sessions * a.archive_puts_per_session
        archive_runs = a.archive_runs if s.turns else D(0)
        sweep_logs = a.sweep_runs * (a.emf_bytes_per_sweep + a.log_event_overhead) / GIB
        return [
            Line("Lambda", "turn_sweep requests (every 2 minutes)", a.sweep_runs, p.lambda_request),
            Line("Lambda", f"turn_sweep duration ({a.function_memory_mb} MB × {a.sweep_ms} ms)",
                 a.sweep_runs * fmb * a.sweep_ms / 1000, p.lambda_gb_s),
            Line("DynamoDB", "read request units (turn_sweep)", a.sweep_runs * a.sweep_rru, p.ddb_read_unit),
            Line("CloudWatch Logs", "ingestion (turn_sweep EMF)", sweep_logs, p.logs_ingest_gb),
            Line("Lambda", "usage_export requests (daily)", a.export_runs, p.lambda_request),
            Line("Lambda", f"usage_export duration ({a.export_memory_mb} MB × {export_ms:.0f} ms)",
                 a.export_runs * D(a.export_memory_mb) / MB_PER_GB * export_ms / 1000, p.lambda_gb_s),
            Line("DynamoDB", "read request units (usage_export)",
                 a.export_runs * records * a.usage_record_bytes / 4096 / 2, p.ddb_read_unit),
            Line("Lambda", "history_archive requests (300 s stream batches)", archive_runs, p.lambda_request),
            Line("Lambda", f"history_archive duration ({a.function_memory_mb} MB)",
                 (archive_runs * a.archive_ms_base + puts * a.archive_ms_per_put) / 1000 * fmb, p.lambda_gb_s),
            Line("S3", f"archive PUTs ({a.archive_puts_per_session} per session)", puts, p.s3_put),
        ]

    def _storage_lines(self, s: Scenario) -> tuple[list[Line], list[dict[str, str]]]:
        a, p = self.a, self.p
        hot_months = (a.history_hot_days + a.ttl_lag_days) / DAYS_PER_MONTH if a.history_hot_days else a.archive_months
        history_gb = s.turns * hot_months * a.stored_bytes_per_turn / GIB
        events_gb = s.turns * a.event_ttl_hours / HOURS_PER_MONTH * a.event_bytes_per_turn / GIB
        usage_gb = s.turns * a.usage_months_kept * a.usage_record_bytes / GIB
        table_gb = history_gb + events_gb + usage_gb
        object_bytes = (s.turns / s.sessions * a.archive_bytes_per_turn / a.archive_puts_per_session
                        if s.sessions else D(0))
        transitions = object_bytes >= a.glacier_min_object_bytes
        glacier_after = a.glacier_after_days / DAYS_PER_MONTH
        growth = []
        standard = glacier = D(0)
        for month in range(1, int(a.archive_months) + 1):
            archived = max(D(0), month - hot_months) if a.history_hot_days else D(0)
            glacier = max(D(0), archived - glacier_after) if transitions else D(0)
            standard = (archived - glacier) * s.turns * a.archive_bytes_per_turn / GIB
            glacier = glacier * s.turns * a.archive_bytes_per_turn / GIB
            growth.append({"month": str(month), "standard_gb": f"{standard:.3f}", "glacier_ir_gb": f"{glacier:.3f}"})
        objects = s.sessions * a.archive_puts_per_session if transitions else D(0)
        lines = [
            Line("DynamoDB", f"storage: history ({a.history_hot_days} hot days + TTL lag)", history_gb,
                 p.ddb_storage_gb_month),
            Line("DynamoDB", f"storage: event log ({a.event_ttl_hours} h)", events_gb, p.ddb_storage_gb_month),
            Line("DynamoDB", f"storage: usage records ({a.usage_months_kept} months)", usage_gb,
                 p.ddb_storage_gb_month),
            Line("DynamoDB", "point-in-time recovery", table_gb if a.pitr else D(0), p.ddb_pitr_gb_month),
            Line("S3", f"archive storage, Standard (month {a.archive_months})", standard, p.s3_storage_gb_month),
            Line("S3", f"archive storage, Glacier IR (month {a.archive_months})", glacier, p.s3_glacier_ir_gb_month),
            Line("S3", "lifecycle transitions to Glacier IR", objects, p.s3_transition_glacier_ir),
        ]
        return lines, growth

    def _fixed_lines(self, plan: dict[str, Any]) -> list[Line]:
        a, p = self.a, self.p
        cache = (D(a.snapstart_versions) * self.chat_turn_mb / MB_PER_GB * HOURS_PER_MONTH * 3600
                 if a.snapstart else D(0))
        return [
            Line("Lambda", f"SnapStart cache (chat_turn {self.chat_turn_mb} MB × {a.snapstart_versions} version)",
                 cache, p.snapstart_cache_gb_s),
            Line("CloudWatch", "custom metrics (EMF, metric × dimension combinations)", self.metric_months(plan),
                 p.custom_metric_month),
            Line("CloudWatch", "alarms (turn-host scaling)", D(a.alarms) if a.host_tier else D(0), p.alarm_month),
            Line("CloudWatch", "alarms (guard rails)",
                 D(a.guard_alarms + (a.detailed_alarm_count if a.detailed_alarms else 0)), p.alarm_month),
            Line("Secrets Manager", "LLM key", D(a.secrets), p.secret_month),
            Line("ECR", "turn-host image storage", a.ecr_image_gb if a.host_tier else D(0), p.ecr_storage_gb_month),
        ]

    def metric_months(self, plan: dict[str, Any]) -> Decimal:
        """Custom metrics billed in the month: each combination × the share of hours it gets data."""
        busy = D(1) if plan["host_turns"] or plan["lambda_turns"] else D(0)
        lb = self.load_balancer  # the connection metrics come from the hosts' front, not ws_connect/ws_default
        share = {"lambda": plan["lambda_hours_share"], "host": plan["host_hours_share"],
                 "connections": D(0) if lb else busy, "front": busy if lb else D(0), "api": busy, "archive": busy,
                 "sweep": D(1), "export": self.a.export_runs / HOURS_PER_MONTH, "failure": D(0)}
        return sum((share[kind] for _fn, _name, kind in METRICS), D(0))

    # ---- crossover, goals, the whole answer --------------------------------------------------------

    def crossover(self) -> dict[str, Any]:
        lam, host = self.counts.lambda_tier, self.counts.host_tier
        saved = self.per_turn(lam) - self.per_turn(host)
        task_hour = self.task_hour_usd()
        turn_s = self.turn_seconds(host)
        if saved <= 0:
            return {"turns_per_month": None, "concurrent_turns": None, "scale_out_concurrency":
                    str(self.a.scale_out_concurrency), "threshold_ok": False,
                    "why": "a turn costs no more on Lambda than on a host: the host tier never pays for itself"}
        concurrent = task_hour * turn_s / (3600 * saved)
        turns = task_hour * HOURS_PER_MONTH / saved
        ok = self.a.scale_out_concurrency >= concurrent
        scale_in = self.a.scale_in_turns
        return {
            "scale_in_check": {
                "scale_in_turns": str(scale_in),
                "why": (f"a host goes when the hosts' running turns average under {scale_in} for 15 minutes "
                        f"(HostRunningTurns); chat_turn starts one at {self.a.scale_out_concurrency} concurrent "
                        "turns: " + ("below the scale-out threshold, so the turns a stopped host gave back do not "
                                     "start it again: no cycling."
                                     if scale_in < self.a.scale_out_concurrency else
                                     "not below the scale-out threshold: the tier cycles (a stopped host's turns "
                                     "go back to Lambda and start a host again)."))},
            "turns_per_month": str(turns.quantize(D(1))), "concurrent_turns": str(concurrent.quantize(D("0.01"))),
            "scale_out_concurrency": str(self.a.scale_out_concurrency), "threshold_ok": ok,
            "why": (f"one task costs ${task_hour.quantize(D('0.00001'))} an hour; each turn it takes saves "
                    f"${saved.quantize(D('0.0000001'))} (Lambda tier minus host tier, per turn), so it pays for "
                    f"itself from {concurrent:.2f} concurrent turns of {turn_s:.2f} s = {turns:,.0f} turns a month "
                    f"of flat traffic; the scale-out threshold ({self.a.scale_out_concurrency} concurrent chat_turn "
                    + ("executions) is at or above it: a host started by it pays for itself" if ok else
                       "executions) is below it: hosts start before they pay for themselves")),
        }

    def fronts(self) -> tuple[str, ...]:
        if self.a.front != "cheapest":
            return (self.a.front,)
        return FRONTS if self.a.host_tier else ("api_gateway",)  # the load balancer's targets are the hosts

    def priced(self, s: Scenario) -> tuple[str, list[Line], dict[str, Any], dict[str, Decimal]]:
        """The scenario on the front it is priced on (the cheaper one when `front` is "cheapest"), with the
        total on each front considered."""
        options = {f: self.with_front(f).scenario_lines(s) for f in self.fronts()}
        totals = {f: sum((line.cost for line in lines), D(0)) for f, (lines, _plan) in options.items()}
        front = min(totals, key=lambda f: (totals[f], FRONTS.index(f)))
        return front, options[front][0], options[front][1], totals

    def totals(self) -> dict[str, Decimal]:
        out = {}
        for s in SCENARIOS:
            front, _lines, _plan, by_front = self.priced(s)
            out[s.name] = by_front[front]
        return out

    def front_crossover(self) -> dict[str, str]:
        """Turns a month of flat traffic from which WebSocketFront=LoadBalancer costs less than API Gateway:
        the load balancer's fixed month (ALB hours, its addresses, the host that always runs) over what a
        turn saves (API Gateway's messages, ws_default, the SQS hop)."""
        lb, gw = self.with_front("load_balancer"), self.with_front("api_gateway")
        p, a = self.p, self.a
        fixed = (p.alb_hour.cost(HOURS_PER_MONTH) + p.public_ipv4_hour.cost(HOURS_PER_MONTH * a.alb_public_ipv4)
                 + lb.task_hour_usd(on_demand=True) * HOURS_PER_MONTH * a.lb_min_tasks)
        saved = gw.per_turn(gw.host_counts) - lb.per_turn(lb.host_counts)
        turns = fixed / saved if saved > 0 else None
        return {"fixed_month_usd": str(fixed.quantize(D("0.01"))), "saved_per_turn_usd": str(saved),
                "turns_per_month": str(turns.quantize(D(1))) if turns is not None else "never",
                "why": "the ALB's hours and addresses plus one always-running host, over what a host turn saves "
                       "without API Gateway (its messages, ws_default, the SQS hop); connections save more"}

    def levers(self) -> dict[str, dict[str, str]]:
        """The month totals with one assumption changed (the design levers and the unknowns)."""
        a, c = self.a, self.counts
        spot_half = replace(self.p, **{
            name: replace(getattr(self.p, name), amount=getattr(self.p, od).amount / 2,
                          as_of="lever: Fargate Spot at 50 % off on-demand (the low end seen)")
            for name, od in (("fargate_spot_arm_vcpu_hour", "fargate_arm_vcpu_hour"),
                             ("fargate_spot_arm_gb_hour", "fargate_arm_gb_hour"))})
        priced = {
            "turn hosts on Fargate Spot (TurnHostCapacityProvider=FargateSpot)":
                (c, replace(a, capacity_provider="spot"), self.p),
            "turn hosts on on-demand Fargate (TurnHostCapacityProvider=Fargate)":
                (c, replace(a, capacity_provider="on_demand"), self.p),
            "Fargate Spot at 50 % off on-demand, not 67 %": (c, a, spot_half),
        }
        variants = {
            "every client on batched frames (batched_share 1)": (c, replace(a, batched_share=D(1))),
            "chat_turn at 512 MB": (replace(c, chat_turn_memory_mb=512), a),
            "chat_turn at 128 MB": (replace(c, chat_turn_memory_mb=128), a),
            "one more SnapStart version kept": (c, replace(a, snapstart_versions=a.snapstart_versions + 1)),
            "PITR off": (c, replace(a, pitr=False)),
            "usage records kept 2 months, not 12": (c, replace(a, usage_months_kept=D(2))),
            "LLM wait 20 s, not 10": (c, replace(a, llm_seconds=a.llm_seconds * 2)),
            "no turn-host tier (Lambda only)": (c, replace(a, host_tier=False, front="api_gateway")),
            "WebSocketFront=ApiGateway for every month": (c, replace(a, front="api_gateway")),
            "WebSocketFront=LoadBalancer for every month": (c, replace(a, front="load_balancer")),
            "DetailedAlarms on (21 alarms, not 8)": (c, replace(a, detailed_alarms=True)),
        }
        every = {**{name: (vc, va, self.p) for name, (vc, va) in variants.items()}, **priced}
        return {name: {k: str(v.quantize(D("0.01"))) for k, v in Model(vc, va, vp).totals().items()}
                for name, (vc, va, vp) in every.items()}

    def result(self) -> dict[str, Any]:
        scenarios: dict[str, Any] = {}
        totals: dict[str, Decimal] = {}
        for s in SCENARIOS:
            front, lines, plan, by_front = self.priced(s)
            total = by_front[front]
            totals[s.name] = total
            scenarios[s.name] = {
                "turns": int(s.turns), "monthly_usd": str(total), "front": front,
                "monthly_usd_by_front": {f: str(v) for f, v in by_front.items()},
                "per_turn_usd": str(total / s.turns) if s.turns else "0", "why": s.why,
                "host_turns": str(plan["host_turns"]), "lambda_turns": str(plan["lambda_turns"]),
                "task_hours": str(plan["task_hours"]), "tasks_by_hour": plan["tasks_by_hour"],
                "archive_growth_gb": plan["archive_growth_gb"],
                "line_items": [line.as_json() for line in lines]}
        goal_name, goal_per_turn = PER_TURN_GOAL
        goals = {name: {"limit_usd": str(limit), "monthly_usd": str(totals[name]), "met": totals[name] <= limit}
                 for name, limit in GOALS.items()}
        per_turn = totals[goal_name] / D(scenarios[goal_name]["turns"])
        goals[f"per_turn_{goal_name}"] = {"limit_usd": str(goal_per_turn), "per_turn_usd": str(per_turn),
                                          "met": per_turn <= goal_per_turn}
        c = self.counts
        return {
            "scenarios": scenarios,
            "tiers": {
                "lambda": {"per_turn_usd": str(self.per_turn(c.lambda_tier)), "chat_turn_memory_mb": self.chat_turn_mb,
                           "turn_seconds": str(self.turn_seconds(c.lambda_tier))},
                "host": {"per_turn_usd": str(self.per_turn(c.host_tier)),
                         "task_hour_usd": str(self.task_hour_usd()),
                         "task_month_usd": str(self.task_hour_usd() * HOURS_PER_MONTH),
                         "turns_per_task": str(self.task_capacity),
                         "per_turn_at_capacity_usd": str(self.per_turn(c.host_tier) + self.task_hour_usd()
                                                         * self.turn_seconds(c.host_tier) / 3600 / self.task_capacity),
                         "turn_seconds": str(self.turn_seconds(c.host_tier))}},
            "crossover": self.crossover(),
            "front_crossover": self.front_crossover(),
            "goals": goals,
            "levers": self.levers(),
            "assumptions": {**self.a.why(), "length_weights": "turn 1: 0.25, 20: 0.5, 100: 0.25 of a month's turns",
                            "stream_reads": "the archive's DynamoDB Stream reads: free for a Lambda trigger",
                            "free_tier": "not subtracted anywhere"},
            "counts": {"file": c.file, "model": c.model, "lambda_source": c.lambda_tier.source,
                       "host_source": c.host_tier.source, "host_figures": c.host.source,
                       "chat_turn_memory_mb": self.chat_turn_mb, "measured": c.measured},
        }


# ---- output --------------------------------------------------------------------------------------


def usd(v: Decimal | str, places: str = "0.01") -> str:
    return f"${D(v).quantize(D(places), rounding=ROUND_HALF_UP):,}"


def qty(v: Decimal) -> str:
    if v == v.to_integral_value():
        return f"{v:,.0f}"
    return f"{v:,.2f}" if abs(v) >= 1 else f"{v:.4f}"


def table(rows: Sequence[tuple[str, ...]], right: Iterable[int]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    r_cols = set(right)
    lines = ["  ".join(c.rjust(w) if i in r_cols else c.ljust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render(r: dict[str, Any]) -> str:
    out = [f"counts: {r['counts']['lambda_source']}; host tier: {r['counts']['host_source']}"]
    for name, s in r["scenarios"].items():
        rows = [("service", "line item", "tier", "quantity", "unit", "unit price", "monthly")]
        rows += [(i["service"], i["item"], i.get("tier", ""), qty(D(i["quantity"])), i["unit"],
                  f"${D(i['unit_price_usd']).normalize():f}", usd(i["monthly_usd"])) for i in s["line_items"]]
        rows.append(("", "TOTAL", "", "", "", "", usd(s["monthly_usd"])))
        by_front = ", ".join(f"{f} {usd(v)}" for f, v in s["monthly_usd_by_front"].items())
        out += ["", f"== {name}: {s['turns']:,} turns a month ({s['why']})",
                f"   WebSocket front: {s['front']} (totals by front: {by_front})",
                f"   on hosts {qty(D(s['host_turns']))}, on Lambda {qty(D(s['lambda_turns']))}, "
                f"task-hours {qty(D(s['task_hours']))}, tasks by hour of day {s['tasks_by_hour']}",
                table(rows, right=(3, 6)), f"per turn: {usd(s['per_turn_usd'], '0.000001')}"]
    t = r["tiers"]
    out += ["", f"tiers: Lambda {usd(t['lambda']['per_turn_usd'], '0.0000001')} a turn "
                f"(chat_turn {t['lambda']['chat_turn_memory_mb']} MB × {t['lambda']['turn_seconds']} s); host "
                f"{usd(t['host']['per_turn_usd'], '0.0000001')} a turn + {usd(t['host']['task_hour_usd'], '0.00001')} "
                f"a task-hour ({usd(t['host']['task_month_usd'])} a task-month, {t['host']['turns_per_task']} turns "
                f"a task: {usd(t['host']['per_turn_at_capacity_usd'], '0.0000001')} a turn at capacity)",
            f"crossover: {r['crossover']['why']}",
            f"front crossover: WebSocketFront=LoadBalancer pays for itself from "
            f"{r['front_crossover']['turns_per_month']} turns a month ({r['front_crossover']['why']})",
            f"scale in: {r['crossover']['scale_in_check']['why']}", ""]
    levers: list[tuple[str, ...]] = [("lever (one change)", *r["scenarios"])]
    levers.append(("as above", *(usd(s["monthly_usd"]) for s in r["scenarios"].values())))
    levers += [(name, *(usd(v) for v in totals.values())) for name, totals in r["levers"].items()]
    out += [table(levers, right=(1, 2, 3)), ""]
    for name, g in r["goals"].items():
        got = g.get("monthly_usd") or g["per_turn_usd"]
        places = "0.01" if "monthly_usd" in g else "0.0000001"
        out.append(f"goal {name}: {usd(got, places)} <= {usd(g['limit_usd'], places)}: "
                   f"{'met' if g['met'] else 'MISSED'}")
    return "\n".join(out)


def _on_off(v: str) -> bool:
    if v not in ("on", "off"):
        raise argparse.ArgumentTypeError("on or off")
    return v == "on"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.cost_model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=Path, required=True, metavar="FILE", help="the AWS-calls bench's JSON")
    parser.add_argument("--json", metavar="FILE", help="write the result as JSON to FILE ('-': stdout, no table)")
    parser.add_argument("--flush-ms", default="250", help="old-schema files only: the flush window to read")
    parser.add_argument("--chat-turn-memory", type=int, help="chat_turn MB (default: the counts' memory_mb, else 512)")
    parser.add_argument("--batched-share", type=D, default=D(0), help="share of clients on batched frames (0..1)")
    parser.add_argument("--snapstart-versions", type=int, default=1, help="published chat_turn versions kept")
    parser.add_argument("--pitr", type=_on_off, default=True, help="point-in-time recovery on|off (default on)")
    parser.add_argument("--llm-seconds", type=D, default=D(10), help="assumed LLM wait per turn (default 10)")
    parser.add_argument("--scale-out-concurrency", type=D, default=Assumptions.scale_out_concurrency,
                        help="TurnHostScaleOutConcurrency")
    parser.add_argument("--host-tier", type=_on_off, default=True, help="the turn-host tier deployed on|off")
    parser.add_argument("--capacity-provider", choices=("spot", "on_demand"), default=Assumptions.capacity_provider,
                        help="TurnHostCapacityProvider: FargateSpot (spot, default) or Fargate (on_demand)")
    parser.add_argument("--front", choices=("cheapest", *FRONTS), default="cheapest",
                        help="the WebSocket front each month is priced on (default: the cheaper one per month)")
    parser.add_argument("--usage-months", type=D, default=D(12), help="months of usage records in the table")
    args = parser.parse_args(argv)
    if not D(0) <= args.batched_share <= D(1):
        parser.error("--batched-share must be between 0 and 1")
    counts = load_counts(args.counts, args.flush_ms)
    if args.chat_turn_memory:
        counts = replace(counts, chat_turn_memory_mb=args.chat_turn_memory)
    a = Assumptions(batched_share=args.batched_share, snapstart_versions=args.snapstart_versions, pitr=args.pitr,
                    llm_seconds=args.llm_seconds, scale_out_concurrency=args.scale_out_concurrency,
                    host_tier=args.host_tier, usage_months_kept=args.usage_months, front=args.front,
                    capacity_provider=args.capacity_provider)
    r = Model(counts, a).result()
    if args.json == "-":
        print(json.dumps(r, indent=2))
    else:
        print(render(r))
        if args.json:
            Path(args.json).write_text(json.dumps(r, indent=2) + "\n")
    missed = [name for name, g in r["goals"].items() if not g["met"]]
    if missed:
        print(f"FAILED: goal(s) missed: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
