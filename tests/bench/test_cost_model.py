"""The monthly AWS cost model: arithmetic on hand-computed inputs, exact to the Decimal.

Not a timing test: the budget check (the default scenario under $150) is arithmetic, so it runs in
`make test`. docs/cost-model.md explains the model and its assumptions.
"""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from tests.bench.cost_model import (
    ASSUMED,
    BUDGET_USD,
    GIB,
    US_EAST_1,
    ConnectionCounts,
    Invocation,
    Price,
    Prices,
    Scenario,
    Scheduled,
    TurnCounts,
    load_counts,
    main,
    monthly_cost,
)

D = Decimal

# 100 turns a month: 50 active users × 2 turns, one 10-minute connection each; a job run 100 times a
# month, reading 2 units a run and 1 per turn of the month.
SWEEP = Scheduled(Invocation("turn_sweep", D(100), D(1000), 1024), read_units=D(2), read_units_per_turn=D(1))
SMALL = Scenario(registered_users=100, active_share=D("0.5"), turns_per_active_user=2,
                 connections_per_active_user=D(1), minutes_per_connection=D(10), cold_start_share=D("0.1"),
                 retained_months=1, event_ttl_hours=D(0), log_retention_days=D(30), secrets=1, schedules=(SWEEP,))

COUNTS = TurnCounts(
    source="hand-made", inbound_frames=D(1), outbound_frames=D(3), outbound_32kb_units=D(4),  # one 40 KB frame
    ddb_write_units=D(2), ddb_read_units=D(3),
    invocations=(Invocation("ws_default", D(1), D(100), 1024, init_ms=D(500)),
                 Invocation("chat_turn", D(1), D(2000), 512, snapstart=True)),
    per_connection=ConnectionCounts(inbound_frames=D(1), outbound_frames=D(1),
                                    invocations=(Invocation("ws_connect", D(1), D(1000), 1024),),
                                    ddb_write_units=D(1), ddb_read_units=D(1)),
    s3_put_requests=D(1), s3_get_requests=D(2), s3_stored_bytes=GIB / 100, stored_bytes=GIB / 100,
    event_bytes=D(0), log_bytes=D(0), platform_log_bytes=GIB / 250, egress_bytes=GIB / 50)

# Quantities for SMALL × COUNTS, by hand:
EXPECTED_QUANTITIES = {
    "WebSocket messages (per 32 KB)": D(600),  # 100 × (1 + 4) + 50 × (1 + 1)
    "WebSocket connection minutes": D(500),  # 50 × 10
    "requests": D(350),  # 100 × 2 + 50 × 1 + 100 scheduled
    "ws_default duration (1024 MB × 100 ms)": D(10),  # 100 × 1 GB × 0.1 s
    "chat_turn duration (512 MB × 2000 ms)": D(100),  # 100 × 0.5 GB × 2 s
    "ws_connect duration (1024 MB × 1000 ms)": D(50),  # 50 × 1 GB × 1 s
    "turn_sweep duration (1024 MB × 1000 ms)": D(100),  # 100 runs × 1 GB × 1 s
    "INIT of cold starts (10% of invocations)": D(5),  # 10 cold ws_default × 1 GB × 0.5 s
    "SnapStart cache (chat_turn)": D(1_314_000),  # 0.5 GB × 730 h × 3600 s
    "SnapStart restores (cold starts)": D(5),  # 10 cold chat_turn × 0.5 GB
    "write request units": D(250),  # 100 × 2 + 50 × 1
    "read request units": D(650),  # 100 × 3 + 50 × 1 + 100 runs × 2 + 100 turns × 1
    "storage (1 months of turns)": D(1),
    "point-in-time recovery": D(1),
    "ingestion": D("1.4"),  # 350 invocations × GiB / 250
    "storage (30 days)": D("1.4"),
    "PUT requests": D(100),
    "GET requests": D(200),
    "storage": D(1),
    "out to the internet": D(2),
    "LLM key": D(1),
    "GetSecretValue (chat_turn cold starts)": D(10),
}


def flat_prices(**free: Decimal) -> Prices:
    """$1 per unit everywhere, so that each line's cost is its quantity."""
    return Prices(**{name: Price(name, D(1), D(1), "unit", "test", "test", free.get(name, D(0)), "always free")
                     for name in Prices.__dataclass_fields__})


def test_every_quantity_matches_the_hand_computation() -> None:
    b = monthly_cost(COUNTS, SMALL, flat_prices())
    assert {i.item: i.quantity for i in b.items} == EXPECTED_QUANTITIES
    assert b.total == sum(EXPECTED_QUANTITIES.values()) == D("1316938.8")
    assert all(isinstance(i.cost, Decimal) for i in b.items)


def test_list_prices_give_exact_decimal_costs() -> None:
    costs = {i.item: i.cost for i in monthly_cost(COUNTS, SMALL, US_EAST_1).items}
    assert costs["WebSocket messages (per 32 KB)"] == D("0.0006")  # 600 × $1.00 / 1M
    assert costs["WebSocket connection minutes"] == D("0.000125")  # 500 × $0.25 / 1M
    assert costs["requests"] == D("0.00007")  # 350 × $0.20 / 1M
    assert costs["chat_turn duration (512 MB × 2000 ms)"] == D("0.00133334")  # 100 GB-s × $0.0000133334
    assert costs["SnapStart cache (chat_turn)"] == D("1.9770444")  # 1,314,000 GB-s × $0.0000015046
    assert costs["write request units"] == D("0.00015625")  # 250 × $0.625 / 1M
    assert costs["read request units"] == D("0.00008125")  # 650 × $0.125 / 1M
    assert costs["storage (1 months of turns)"] == D("0.25")
    assert costs["out to the internet"] == D("0.18")
    assert costs["GetSecretValue (chat_turn cold starts)"] == D("0.00005")  # 10 × $0.05 / 10,000


def test_the_free_tier_is_shared_by_the_lines_of_one_price_and_never_subtracted() -> None:
    b = monthly_cost(COUNTS, SMALL, flat_prices(lambda_gb_s=D(100), ws_message=D(10_000)))
    # Lambda GB-s lines: 10 + 100 + 50 + 100 + 5 = 265, of which 100 free; messages: all 600 free.
    assert b.free_tier() == {"always free": D(700)}
    assert b.total == D("1316938.8")


def test_an_idle_month_costs_only_the_fixed_items() -> None:
    idle = monthly_cost(COUNTS, replace(SMALL, active_share=D(0)), flat_prices())
    # the SnapStart cache, the secret and the schedule's runs (their requests, time, reads and logs)
    assert {i.item: i.quantity for i in idle.items if i.quantity} == {
        "SnapStart cache (chat_turn)": D(1_314_000), "LLM key": D(1), "requests": D(100),
        "turn_sweep duration (1024 MB × 1000 ms)": D(100), "read request units": D(200), "ingestion": D("0.4"),
        "storage (30 days)": D("0.4")}
    assert idle.per_turn == 0


def test_the_default_scenario_is_a_million_turns_under_budget() -> None:
    scenario = Scenario()
    assert scenario.turns == 1_000_000 and scenario.active_users == 50_000
    b = monthly_cost(ASSUMED[250], scenario)
    assert b.total < BUDGET_USD
    assert b.top(1)[0].item.startswith("chat_turn duration")  # waiting on the LLM stream dominates


def measurement(tmp_path: Path) -> Path:
    path = tmp_path / "aws_calls.json"
    path.write_text(json.dumps({"flush_ms": {
        "0": {"post_to_connection": 101, "ddb_write_requests": 6, "ddb_write_units": 12, "ddb_read_requests": 9,
              "ddb_read_units": 9, "lambda_invocations": {"ws_default": 1, "chat_turn": 1}, "inbound_frames": 1},
        "250": {"post_to_connection": 25, "ddb_write_requests": 6, "ddb_write_units": 14, "ddb_read_requests": 9,
                "ddb_read_units": 10, "lambda_invocations": {"ws_default": 1, "chat_turn": 1},
                "inbound_frames": 1}}}))
    return path


def test_measured_counts_replace_the_assumed_ones(tmp_path: Path) -> None:
    counts = load_counts(measurement(tmp_path))
    assert set(counts) == {0, 250}
    c = counts[0]
    assert c.source == "measured: aws_calls.json, flushMs=0"
    assert (c.outbound_frames, c.outbound_32kb_units) == (D(101), D(101))  # every frame under 32 KB
    assert (c.ddb_write_units, c.ddb_read_units) == (D(12), D(9))
    assert [(i.function, i.count, i.memory_mb) for i in c.invocations] == [("chat_turn", D(1), 512),
                                                                           ("ws_default", D(1), 256)]
    assert c.per_connection == ASSUMED[0].per_connection  # not measured yet: assumed


def test_the_script_prints_every_line_and_passes_under_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--assume"]) == 0
    out = capsys.readouterr().out
    assert "counts: assumed (flushMs=250)" in out
    for item in EXPECTED_QUANTITIES:
        assert item.split(" (")[0] in out
    assert "TOTAL" in out and "OK: the monthly total $" in out


def test_the_script_fails_at_or_over_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # flushMs=0: one post per delta, 101 frames a turn, and chat_turn at 512 MB: over $150.
    assert main(["--counts", str(measurement(tmp_path)), "--flush-ms", "0"]) == 1
    assert "FAILED: the monthly total" in capsys.readouterr().out
    assert main(["--counts", str(measurement(tmp_path)), "--flush-ms", "250", "--json", str(tmp_path / "o.json")]) == 0
    written = json.loads((tmp_path / "o.json").read_text())
    assert Decimal(written["total_usd"]) < BUDGET_USD
