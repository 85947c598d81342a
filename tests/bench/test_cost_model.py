"""The monthly AWS cost model: exact Decimal arithmetic on hand-computed inputs, the JSON shape, the goals,
the crossover, and the idle month. Not a timing test: it runs in `make test`. docs/cost-model.md."""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from tests.bench.cost_inputs import (
    DAYS_PER_MONTH,
    GIB,
    HOURS_PER_MONTH,
    SCENARIOS,
    Assumptions,
    Counts,
    HostFigures,
    Scenario,
    TierCounts,
    load_counts,
    parse_counts,
)
from tests.bench.cost_model import Model, main
from tests.bench.cost_prices import US_EAST_1, Price, Prices

D = Decimal
FIXTURE = Path(__file__).parents[1] / "fixtures" / "cost" / "aws-calls.json"
DOCS_COUNTS = Path(__file__).parents[2] / "docs" / "aws-calls.json"


def flat_prices() -> Prices:
    """$1 per unit everywhere, so that each line's cost is its quantity."""
    return Prices(**{name: Price(name, D(1), D(1), "unit", "test", "test") for name in Prices.__dataclass_fields__})


def tier(name: str, **kw: object) -> TierCounts:
    base: dict[str, object] = dict(
        tier=name, source="hand-made", inbound_frames=D(1), frames_stock=D(3), frames_batched=D(1),
        extra_32kb_units=D(0), ddb_write_units=D(2), ddb_read_units=D(3),
        lambda_invocations={"ws_default": D(1), "chat_turn": D(1)} if name == "lambda" else {"ws_default": D(1)},
        sqs_requests=D(0) if name == "lambda" else D(3), s3_put_requests=D(1), s3_get_requests=D(2),
        bytes_out=GIB / 100, turn_seconds=D("2.5"))
    base.update(kw)
    return TierCounts(**base)  # type: ignore[arg-type]


def counts(**kw: object) -> Counts:
    base: dict[str, object] = dict(
        file="hand-made", lambda_tier=tier("lambda"), host_tier=tier("host"),
        host=HostFigures(vcpu=D("0.5"), memory_mb=D(1024), cpu_ms_per_turn=D(35), concurrent_turns_at_70pct=D(5),
                         peak_rss_mb=D(300), source="hand-made"),
        chat_turn_memory_mb=1024, chat_turn_peak_rss_mb=None, scripted_reply_s=D(2), model="m", measured={})
    base.update(kw)
    return Counts(**base)  # type: ignore[arg-type]


# chat_turn waits 10 s (assumed) + 0.5 s measured around the bench's 2 s scripted reply.
HAND = Assumptions(batched_share=D("0.5"), function_memory_mb=512, ws_default_ms=D(100), cold_start_share=D("0.1"),
                   init_ms=D(1000), log_line_bytes=GIB / 200, emf_bytes_per_turn=D(0), log_event_overhead=D(0))


def test_the_lines_of_100_lambda_turns_match_the_hand_computation() -> None:
    m = Model(counts(), HAND, flat_prices())
    got = {line.item: line.quantity for line in m.turn_lines(m.counts.lambda_tier, D(100))}
    assert got == {
        "WebSocket messages (turns)": D(300),  # 100 × (1 in + 0.5 × 3 stock + 0.5 × 1 batched)
        "chat_turn requests": D(100),
        "chat_turn duration (1024 MB × 10500 ms)": D(1050),  # 100 × 1 GB × 10.5 s
        "ws_default requests": D(100),
        "ws_default duration (512 MB × 100 ms)": D(5),  # 100 × 0.5 GB × 0.1 s
        "INIT of cold starts (10%)": D(5),  # 10 cold ws_default × 0.5 GB × 1 s (chat_turn has SnapStart)
        "SnapStart restores (chat_turn cold starts)": D(10),  # 10 cold chat_turn × 1 GB
        "write request units (turns)": D(200),
        "read request units (turns)": D(300),
        "PUT requests (turns)": D(100),
        "GET requests (turns)": D(200),
        "ingestion (app line + EMF per turn)": D("0.5"),  # 100 × GiB / 200
        "storage (14 days)": D("0.5") * 14 / DAYS_PER_MONTH,
        "out to the internet": D(1),  # 100 × GiB / 100
        "GetSecretValue (chat_turn cold starts)": D(10),
    }
    assert all(line.tier == "lambda" for line in m.turn_lines(m.counts.lambda_tier, D(1)))


def test_the_host_tier_has_no_chat_turn_and_pays_the_queue() -> None:
    m = Model(counts(), HAND, flat_prices())
    got = {line.item: line.quantity for line in m.turn_lines(m.counts.host_tier, D(10))}
    assert got["requests (send, receive, delete)"] == D(30)
    assert not any(item.startswith(("chat_turn", "SnapStart", "GetSecretValue")) for item in got)


def test_list_prices_give_exact_decimal_costs() -> None:
    m = Model(counts(), replace(HAND, batched_share=D(0)), US_EAST_1)
    costs = {line.item: line.cost for line in m.turn_lines(m.counts.lambda_tier, D(1_000_000))}
    assert costs["WebSocket messages (turns)"] == D(4)  # 4 messages × 1M × $1.00 / M
    assert costs["chat_turn duration (1024 MB × 10500 ms)"] == D("140.0007")  # 10.5M GB-s × $0.0000133334
    assert costs["write request units (turns)"] == D("1.25")  # 2M × $0.625 / M
    assert costs["read request units (turns)"] == D("0.375")  # 3M × $0.125 / M
    assert costs["out to the internet"] == D("900")  # 10,000 GB × $0.09


def test_one_task_hour_and_the_crossover_formula() -> None:
    m = Model(counts(), HAND, US_EAST_1)
    # on Fargate Spot (the template's default), 67 % off on-demand: 0.5 vCPU × $0.0106854 + 1 GB × $0.0011748
    # + IPv4 $0.005 (not discounted) + 360 heartbeats × $0.625 / M
    assert m.task_hour_usd() == D("0.0117425")
    # on-demand: 0.5 vCPU × $0.03238 + 1 GB × $0.00356 + IPv4 $0.005 + 360 heartbeats × $0.625 / M
    assert m.task_hour_usd(on_demand=True) == D("0.024975")
    assert Model(counts(), replace(HAND, capacity_provider="on_demand"), US_EAST_1).task_hour_usd() == D("0.024975")
    saved = m.per_turn(m.counts.lambda_tier) - m.per_turn(m.counts.host_tier)
    x = m.crossover()
    assert D(x["turns_per_month"]) == (D("0.0117425") * 730 / saved).quantize(D(1))
    assert D(x["concurrent_turns"]) == (D("0.0117425") * D("10.5") / (3600 * saved)).quantize(D("0.01"))
    assert x["threshold_ok"] is (D(2) >= D("0.0117425") * D("10.5") / (3600 * saved))
    assert Model(counts(), replace(HAND, scale_out_concurrency=D(0)), US_EAST_1).crossover()["threshold_ok"] is False
    # hosts go below 1 running turn a host, under the scale-out threshold of 3: no cycling
    check = x["scale_in_check"]
    assert check["scale_in_turns"] == "1" and "no cycling" in check["why"]
    cycling = Model(counts(), replace(HAND, scale_in_turns=D(3)), US_EAST_1).crossover()["scale_in_check"]
    assert "the tier cycles" in cycling["why"]


def test_the_plan_puts_turns_on_hosts_when_the_scale_out_threshold_is_reached() -> None:
    half_day = (0,) * 12 + (1,) * 12  # 12 busy hours a day
    a = replace(HAND, day_curve=half_day)
    m = Model(counts(), a, flat_prices())
    plan = m.plan(Scenario("t", D(1_200_000), D(1), D(1), ""))
    # 1.2M / 12 h / 30.42 days = 3,288 turns an hour × 10.5 s = 9.6 concurrent: ≥ 2, and
    # ceil(9.6 × 1.25 / 5 turns a task) = 3 tasks
    assert plan["tasks_by_hour"] == [0] * 12 + [3] * 12
    # the first busy hour stays on Lambda for the 3-minute scale-out lag: 1.2M × 0.05 / 12
    assert (plan["host_turns"], plan["lambda_turns"]) == (D(1_195_000), D(5_000))
    # 12 h × 3 tasks + 3 tasks × 15 minutes after the traffic stops, every day
    assert plan["task_hours"] == D("36.75") * DAYS_PER_MONTH
    assert (plan["host_hours_share"], plan["lambda_hours_share"]) == (D("0.5"), D(1) / 24)
    below = m.plan(Scenario("t", D(10_000), D(1), D(1), ""))  # 0.08 concurrent: Lambda only
    assert below["tasks_by_hour"] == [0] * 24 and below["host_turns"] == 0 and below["task_hours"] == 0
    off = Model(counts(), replace(a, host_tier=False), flat_prices()).plan(Scenario("t", D(1_200_000), D(1), D(1), ""))
    assert off["host_turns"] == 0 and off["lambda_turns"] == D(1_200_000)


def test_the_idle_month_is_the_deployment_alone() -> None:
    m = Model(counts(chat_turn_memory_mb=256), Assumptions(), flat_prices())
    idle = next(s for s in SCENARIOS if s.name == "idle")
    lines, plan = m.scenario_lines(idle)
    assert plan["host_turns"] == plan["lambda_turns"] == plan["task_hours"] == 0
    assert all(line.tier is None for line in lines)  # no per-turn or per-task item
    assert {line.item: line.quantity for line in lines} == {
        "turn_sweep requests (every 2 minutes)": D(21_900),  # 730 h × 30
        "turn_sweep duration (256 MB × 150 ms)": D("821.25"),  # 21,900 × 0.25 GB × 0.15 s
        "read request units (turn_sweep)": D(175_200),  # 21,900 × 8
        "ingestion (turn_sweep EMF)": D(21_900) * (243 + 26) / GIB,
        "usage_export requests (daily)": D(30),
        "usage_export duration (1769 MB × 1000 ms)": D(30) * 1769 / 1024,  # 30 × 1.73 GB × 1 s
        "SnapStart cache (chat_turn 256 MB × 1 version)": D(657_000),  # 0.25 GB × 730 h × 3600 s
        "custom metrics (EMF, metric × dimension combinations)": 1 + D(30) / HOURS_PER_MONTH,  # SweepDispatched
        "alarms (turn-host scaling)": D(2),
        "alarms (guard rails)": D(8),  # template: 8 alarms in every stack (DetailedAlarms off)
        "LLM key": D(1),
        "turn-host image storage": D("0.3"),
    }


def test_custom_metrics_count_one_metric_per_function_and_name() -> None:
    m = Model(counts(), Assumptions(), flat_prices())
    # per turn tier 5 (TurnsRun, TurnDuration, TurnErrors, InputTokens, OutputTokens), + HostRunningTurns on
    # the host tier; connections 3; http_api Requests 1; history_archive 1; turn_sweep 1 (every hour);
    # usage_export one hour a day; failure-only metrics (ServerErrors, InvalidPayloads, SweepDispatchFailed) 0
    plan = {"host_turns": D(1), "lambda_turns": D(0), "host_hours_share": D(1), "lambda_hours_share": D(0)}
    assert m.metric_months(plan) == 6 + 3 + 1 + 1 + 1 + D(30) / HOURS_PER_MONTH
    both = {**plan, "host_hours_share": D("0.5"), "lambda_hours_share": D("0.75")}
    assert m.metric_months(both) == 5 * D("0.75") + 6 * D("0.5") + 3 + 1 + 1 + 1 + D(30) / HOURS_PER_MONTH
    # behind a load balancer the hosts' front emits the 2 connection metrics instead of ws_connect/ws_default's 3
    lb = Model(counts(), Assumptions(front="load_balancer"), flat_prices())
    assert lb.metric_months(plan) == 6 + 2 + 1 + 1 + 1 + D(30) / HOURS_PER_MONTH


def test_small_archive_objects_stay_in_s3_standard_and_large_ones_move_to_glacier_ir() -> None:
    m = Model(counts(), Assumptions(), flat_prices())
    small_lines, _growth = m._storage_lines(Scenario("s", D(1_000_000), D(100_000), D(1), ""))
    small = {line.item: line.quantity for line in small_lines}
    hot_months = D(32) / DAYS_PER_MONTH
    # 10 turns × 700 B / 2 PUTs = 3.5 KB an object: under 128 KB, never transitioned
    assert small["archive storage, Standard (month 12)"] == (12 - hot_months) * 1_000_000 * 700 / GIB
    assert "archive storage, Glacier IR (month 12)" not in {k for k, v in small.items() if v}
    big = {line.item: line.quantity for line in m._storage_lines(Scenario("b", D(1_000_000), D(1_000), D(1), ""))[0]}
    # 1,000 turns × 700 B / 2 = 350 KB an object: older than 90 days in Glacier IR
    glacier_months = 12 - hot_months - D(90) / DAYS_PER_MONTH
    assert big["archive storage, Glacier IR (month 12)"] == glacier_months * 1_000_000 * 700 / GIB
    assert big["lifecycle transitions to Glacier IR"] == D(2_000)  # every object, once
    # a year of usage records + 32 days of history + 48 h of events, all under PITR
    assert big["point-in-time recovery"] == (big["storage: history (30 hot days + TTL lag)"]
                                             + big["storage: event log (48 h)"]
                                             + big["storage: usage records (12 months)"])
    assert Model(counts(), Assumptions(pitr=False), flat_prices())._storage_lines(
        Scenario("b", D(1), D(1), D(1), ""))[0][3].quantity == 0


def test_counts_are_weighted_over_the_conversation_lengths(tmp_path: Path) -> None:
    def c(wru: int, rru: float) -> dict[str, object]:
        return {"post_to_connection": 10, "inbound_frames": 1, "ddb_write_units": wru, "ddb_read_units": rru,
                "lambda_invocations": {"ws_default": 1, "chat_turn": 1}, "turn_seconds": 10.4}
    data = {"deltas": 100, "delta_gap_ms": 100, "time_scale": 1.0,
            "tiers": {"lambda": {"1": c(8, 4), "20": c(8, 6), "100": c(12, 10)}}}
    got = parse_counts(data, "x.json")
    assert got.lambda_tier.ddb_write_units == D(9)  # 0.25 × 8 + 0.5 × 8 + 0.25 × 12
    assert got.lambda_tier.ddb_read_units == D("6.5")  # 0.25 × 4 + 0.5 × 6 + 0.25 × 10
    assert got.lambda_tier.frames_stock == got.lambda_tier.frames_batched == D(10)  # no frames_per_client: stock
    assert got.scripted_reply_s == D(10)
    # no host tier measured: the Lambda turn with the queue instead of chat_turn; host figures assumed
    assert dict(got.host_tier.lambda_invocations) == {"ws_default": D(1)} and got.host_tier.sqs_requests == D(3)
    assert got.host.source.startswith("assumed")
    assert got.host.concurrent_turns_at_70pct == D(121)  # 0.7 × 0.5 vCPU × 10.4 s × 1000 / 30 ms, floored


def test_the_old_schema_is_read_as_the_lambda_tier_at_length_1(tmp_path: Path) -> None:
    # the shape docs/aws-calls.json had before issue 17 (one turn, per flush window)
    old = {"post_to_connection": 22, "post_units_32kb": 22, "ddb_write_units": 21, "ddb_read_units": 40.5,
           "lambda_invocations": {"chat_turn": 1, "ws_default": 1}, "inbound_frames": 1, "turn_seconds": 10.32}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"mode": "full", "deltas": 100, "delta_gap_ms": 100.0, "time_scale": 1.0,
                                "flush_ms": {"0": {**old, "post_to_connection": 109}, "250": old}}))
    got = load_counts(path)
    assert got.lambda_tier.frames_stock == D(old["post_to_connection"])
    assert got.lambda_tier.ddb_write_units == D(str(old["ddb_write_units"]))
    assert "old schema, flushMs=250" in got.lambda_tier.source
    assert got.chat_turn_memory_mb is None  # not measured there: 512 MB (template default) is priced


def test_the_fixture_counts_are_read_with_every_key() -> None:
    got = load_counts(FIXTURE)
    assert (got.lambda_tier.frames_stock, got.lambda_tier.frames_batched) == (D(14), D(5))
    assert got.host_tier.sqs_requests == D(3) and got.host.concurrent_turns_at_70pct == D(142)
    assert got.chat_turn_memory_mb == 256 and got.host.source == "measured"


def test_the_json_has_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--counts", str(FIXTURE), "--json", "-"])
    r = json.loads(capsys.readouterr().out)
    assert set(r) == {"scenarios", "tiers", "crossover", "front_crossover", "goals", "levers", "assumptions", "counts"}
    assert {name: s["turns"] for name, s in r["scenarios"].items()} == {"1M": 1_000_000, "30M": 30_000_000, "idle": 0}
    for s in r["scenarios"].values():
        items = s["line_items"]
        assert sum((D(i["monthly_usd"]) for i in items), D(0)) == D(s["monthly_usd"])
        for i in items:
            assert {"service", "item", "quantity", "unit", "unit_price_usd", "monthly_usd"} <= set(i)
            assert D(i["monthly_usd"]) == D(i["quantity"]) * D(i["unit_price_usd"])
    assert D(r["scenarios"]["30M"]["per_turn_usd"]) == D(r["scenarios"]["30M"]["monthly_usd"]) / 30_000_000
    assert {k: g["limit_usd"] for k, g in r["goals"].items()} == {
        "30M": "750", "1M": "40", "idle": "3", "per_turn_30M": "0.000025"}
    assert {"per_turn_usd", "task_month_usd"} <= set(r["tiers"]["host"]) and "per_turn_usd" in r["tiers"]["lambda"]
    assert {"turns_per_month", "concurrent_turns", "why"} <= set(r["crossover"])
    for s in r["scenarios"].values():  # priced on the cheaper front, both totals given
        assert set(s["monthly_usd_by_front"]) == {"api_gateway", "load_balancer"}
        assert s["monthly_usd"] == min(s["monthly_usd_by_front"].values(), key=D)
        assert s["monthly_usd_by_front"][s["front"]] == s["monthly_usd"]
    assert r["scenarios"]["idle"]["front"] == "api_gateway"  # an idle ALB alone is $16.43 + its addresses
    assert {f: r["assumptions"][f].split(": ")[0] for f in Assumptions.__dataclass_fields__} == {
        f: str(getattr(Assumptions(), f)) for f in Assumptions.__dataclass_fields__}  # each one with its why
    assert r["counts"]["file"] == "aws-calls.json" and r["counts"]["measured"]["model"] == "claude-haiku-4-5"
    met = {k: g["met"] for k, g in r["goals"].items()}
    assert code == (0 if all(met.values()) else 1)
    assert met["30M"] is (D(r["scenarios"]["30M"]["monthly_usd"]) <= 750)


def test_goals_met_exit_0_and_missed_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cheap = json.loads(FIXTURE.read_text())
    for lengths in cheap["tiers"].values():
        for c in lengths.values():  # 3 write units a turn: room for the fixed costs (the guard alarms' $0.80)
            c.update(post_to_connection=4, post_units_32kb=4, frames_per_client={"stock": 4, "batched": 2},
                     ddb_write_units=3, ddb_read_units=2, bytes_out=6000)
    cheap["host"].update(vcpu=0.25, memory_mb=512, concurrent_turns_at_70pct=71)  # a quarter-vCPU task
    path = tmp_path / "cheap.json"
    path.write_text(json.dumps(cheap))
    assert main(["--counts", str(path)]) == 0
    assert "goal 30M: $" in capsys.readouterr().out
    # the same counts with two SnapStart versions of a 2 GB chat_turn: 2 × 2 GB × 730 h of cache is $15.82
    # a month (+ $0.80 of guard alarms), so the idle month passes $3 and the 1M month $40
    assert main(["--counts", str(path), "--chat-turn-memory", "2048", "--snapstart-versions", "2"]) == 1
    out = capsys.readouterr()
    assert "goal idle: $17.60 <= $3.00: MISSED" in out.out and out.err == "FAILED: goal(s) missed: 1M, idle\n"


def test_the_measured_counts_in_docs_have_both_tiers_at_every_length() -> None:
    """docs/aws-calls.json is what `make bench` measured (docs/cost-model.md prices it)."""
    data = json.loads(DOCS_COUNTS.read_text())
    assert data["mode"] == "full" and data["time_scale"] == 1.0
    for tier in ("lambda", "host"):
        assert sorted(data["tiers"][tier], key=int) == ["1", "20", "100"], tier
        for m in data["tiers"][tier].values():
            assert set(m["frames_per_client"]) == {"stock", "batched"}
    got = load_counts(DOCS_COUNTS)
    assert got.chat_turn_memory_mb == data["chat_turn"]["memory_mb"] and got.host.source == "measured"


def test_the_load_balancer_front_bills_no_message_and_always_runs_one_host() -> None:
    a = replace(HAND, front="load_balancer", day_curve=(0,) * 12 + (1,) * 12)
    m = Model(counts(), a, flat_prices())
    got = {line.item: line.quantity for line in m.turn_lines(m.host_counts, D(10))}
    assert "WebSocket messages (turns)" not in got and "requests (send, receive, delete)" not in got
    assert not any(item.startswith(("ws_default", "chat_turn")) for item in got)
    assert got["write request units (turns)"] == D(20) and got["read request units (turns)"] == D(30)
    # every turn on a host, whatever the volume; one host even in the quiet hours
    s = Scenario("t", D(1_200_000), D(60_000), D(30), "")
    plan = m.plan(s)
    assert plan["tasks_by_hour"] == [1] * 12 + [3] * 12 and plan["lambda_turns"] == 0
    assert plan["host_turns"] == D(1_200_000)
    lines = {line.item: line.quantity for line in m.scenario_lines(s)[0]}
    assert "WebSocket messages (connections)" not in lines and not any(k.startswith("ws_connect") for k in lines)
    assert lines["write request units (connections)"] == 60_000 * a.per_connection_wru
    assert lines["ALB hours (WebSocketFront=LoadBalancer)"] == HOURS_PER_MONTH
    assert lines["public IPv4 (the ALB's, 2 AZs)"] == 2 * HOURS_PER_MONTH
    # a busy hour: 1.2M / 12 / 30.42 days = 3,288 turns × GiB/100 each = 32.9 GB: the processed-bytes
    # dimension (1 GB an hour per LCU) dominates 5,000 sessions × 30 min / 60 = 82 active connections / 3,000
    per_hour = D(1_200_000) / 12 / DAYS_PER_MONTH
    sessions = D(60_000) / 12 / DAYS_PER_MONTH
    gb = (per_hour * GIB / 100 + sessions * a.per_connection_bytes) / GIB
    got_lcu = lines["ALB capacity units (by hour of the day curve)"]
    assert got_lcu.quantize(D("0.000001")) == (gb * 12 * DAYS_PER_MONTH).quantize(D("0.000001"))  # 12,000.23


def test_each_month_is_priced_on_its_cheaper_front_and_the_front_crossover() -> None:
    m = Model(counts(chat_turn_memory_mb=256), replace(HAND, batched_share=D(0)), US_EAST_1)
    totals = {s.name: m.priced(s) for s in SCENARIOS}
    for front, _lines, _plan, by_front in totals.values():
        assert by_front[front] == min(by_front.values())
    assert totals["idle"][0] == "api_gateway"
    x = m.front_crossover()
    lb, gw = m.with_front("load_balancer"), m.with_front("api_gateway")
    # the one host that always runs is on-demand FARGATE (base 1) even when the others are on Spot
    assert lb.task_hour_usd(on_demand=True) == D("0.024975")
    fixed = D("0.0225") * 730 + D("0.005") * 730 * 2 + D("0.024975") * 730
    saved = gw.per_turn(gw.host_counts) - lb.per_turn(lb.host_counts)
    # what API Gateway adds to a host turn: 4 messages (1 in + 3 stock), ws_default, 3 SQS requests
    ws_default = D("0.0000002") + D("0.5") * D("0.1") * D("0.0000133334")  # request + 0.5 GB × 0.1 s
    init = D("0.1") * D("0.5") * 1 * D("0.0000133334")  # its cold starts' INIT: 10 % × 0.5 GB × 1 s
    assert saved == D(4) / 1_000_000 + ws_default + D(3) * D("0.0000004") + init
    assert x["turns_per_month"] == str((fixed / saved).quantize(D(1)))
    only_gw = Model(counts(), replace(HAND, host_tier=False), US_EAST_1)
    assert only_gw.fronts() == ("api_gateway",)  # no hosts: nothing for a load balancer to send to


def test_hosts_are_priced_on_the_capacity_provider_and_the_front_s_base_task_on_demand() -> None:
    half_day = (0,) * 12 + (1,) * 12
    s = Scenario("t", D(1_200_000), D(60_000), D(30), "")

    def fargate(a: Assumptions) -> dict[str, Decimal]:
        lines, _plan = Model(counts(), a, flat_prices()).scenario_lines(s)
        return {line.item: line.quantity for line in lines if line.service in ("Fargate", "VPC")}

    hours = D("36.75") * DAYS_PER_MONTH  # 3 tasks 12 h a day + their 15-minute tails (the plan test)
    spot = fargate(replace(HAND, day_curve=half_day))
    assert spot == {"turn host vCPU (0.5 vCPU, arm64, Fargate Spot)": hours / 2,
                    "turn host memory (1 GB, Fargate Spot)": hours, "public IPv4 (one per task)": hours}
    on_demand = fargate(replace(HAND, day_curve=half_day, capacity_provider="on_demand"))
    assert on_demand == {"turn host vCPU (0.5 vCPU, arm64)": hours / 2, "turn host memory (1 GB)": hours,
                         "public IPv4 (one per task)": hours}
    # behind the load balancer: 1 task in the quiet hours, 3 in the busy ones; the base task's 730 hours
    # are on-demand, the rest on Spot
    lb = fargate(replace(HAND, day_curve=half_day, front="load_balancer"))
    lb_hours = (12 + 36 + D("0.5")) * DAYS_PER_MONTH  # + 2 tasks × 15 minutes when the busy hours end
    assert lb["turn host memory (1 GB)"] == HOURS_PER_MONTH
    assert lb["turn host memory (1 GB, Fargate Spot)"] == lb_hours - HOURS_PER_MONTH
    assert lb["public IPv4 (one per task)"] == lb_hours
    # the list prices: Spot is 67 % off on-demand (a stated assumption; Spot prices vary)
    assert US_EAST_1.fargate_spot_arm_vcpu_hour.amount == D("0.0106854")
    assert US_EAST_1.fargate_spot_arm_gb_hour.amount == D("0.0011748")


def test_each_capacity_provider_has_a_lever_and_the_default_is_the_template_s(
        capsys: pytest.CaptureFixture[str]) -> None:
    main(["--counts", str(FIXTURE), "--json", "-"])
    r = json.loads(capsys.readouterr().out)
    totals = {name: D(s["monthly_usd"]).quantize(D("0.01")) for name, s in r["scenarios"].items()}
    levers = {name: {k: D(v) for k, v in row.items()} for name, row in r["levers"].items()}
    assert levers["turn hosts on Fargate Spot (TurnHostCapacityProvider=FargateSpot)"] == totals
    on_demand = levers["turn hosts on on-demand Fargate (TurnHostCapacityProvider=Fargate)"]
    assert on_demand["1M"] > totals["1M"] and on_demand["idle"] == totals["idle"]  # idle: no task either way
    assert totals["1M"] < levers["Fargate Spot at 50 % off on-demand, not 67 %"]["1M"] < on_demand["1M"]
    main(["--counts", str(FIXTURE), "--json", "-", "--capacity-provider", "on_demand"])
    flag = json.loads(capsys.readouterr().out)
    assert {n: D(s["monthly_usd"]).quantize(D("0.01")) for n, s in flag["scenarios"].items()} == on_demand
