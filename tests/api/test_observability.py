"""Observability of `avm serve`: the per-tenant metrics (`/v1/metrics`), the operator's Prometheus
scrape (`/metrics`, no ids as labels), the turn logs (`/v1/logs`) and the rotating JSON log file."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import prometheus_client
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from agentvm.domain.models import Turn, TurnStatus, Usage
from agentvm.domain.usage import model_family
from agentvm.errors import InvalidRequest
from agentvm.logs import REDACTED, setup_logging
from agentvm.services.metrics import TurnMetrics, parse_window, percentile
from agentvm.services.prometheus import exposition, prometheus_text
from tests.api.test_keys_http import bearer, cli, token_of
from tests.support.scripts import reference_driver
from tests.support.servers import in_process
from tests.support.stock_client import StockClient

REPO = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000_000  # a whole minute


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def turn(tenant: str = "t1", n: int = 0, *, status: TurnStatus = TurnStatus.COMPLETED, ms: int | None = 100,
         model: str | None = "claude-sonnet-4-5", tier: str = "function", usage: Usage | None = None,
         container: str = "c1") -> Turn:
    started = T0 + n
    return Turn(tenant, f"turn_{tenant}_{n}", f"sess_{tenant}", f"img_{tenant}", container, f"msg_{n}", status,
                created_at=started, tier=tier, model=model, usage=usage or Usage(10, 2),
                started_at=started if ms is not None else None,
                ended_at=started + ms if ms is not None else None)


# ---- the registry ------------------------------------------------------------------------------


def test_counts_tokens_rates_and_exact_percentiles_per_tenant() -> None:
    clock = Clock()
    m = TurnMetrics(clock=clock, connections=lambda: {"t1": 3, "t2": 1}, containers=lambda: {"t1": 2})
    for i, ms in enumerate([700, 100, 1000, 300, 500, 900, 200, 800, 400, 600]):  # 100..1000 in any order
        m.observe_turn(turn(n=i, ms=ms, usage=Usage(10 + i, 2, 5, 1)), ms // 10)
    m.observe_turn(turn(n=20, status=TurnStatus.FAILED, ms=None, usage=Usage()), None)  # never started
    m.observe_turn(turn(n=21, status=TurnStatus.INTERRUPTED, ms=50, usage=Usage(1, 1)), None)
    m.observe_turn(turn("t2", 1, ms=5000, usage=Usage(7, 7)), 4000)

    t1 = m.tenant("t1")
    c = t1.counts
    assert (c.turns, c.completed, c.failed, c.interrupted) == (12, 10, 1, 1)
    assert (c.input_tokens, c.output_tokens, c.cache_read_tokens, c.cache_write_tokens) == (
        sum(10 + i for i in range(10)) + 1, 21, 50, 10)
    assert t1.success_rate == 10 / 12 and t1.error_rate == 1 / 12
    # nearest rank over the turns that ran: 100..1000 and 50 (11 samples); first tokens 10..100
    assert (t1.turn.p50, t1.turn.p95, t1.turn.samples) == (500, 1000, 11)
    assert (t1.first_token.p50, t1.first_token.p95, t1.first_token.samples) == (50, 100, 10)
    assert (t1.active_containers, t1.active_connections) == (2, 3)
    t2 = m.tenant("t2")
    assert (t2.counts.turns, t2.counts.input_tokens, t2.turn.p50, t2.first_token.p95) == (1, 7, 5000, 4000)
    assert (t2.active_containers, t2.active_connections) == (0, 1)
    nobody = m.tenant("nobody")
    assert (nobody.counts.turns, nobody.success_rate, nobody.turn.p50, nobody.turn.samples) == (0, None, None, 0)

    assert percentile([], 50) is None
    assert percentile([7], 95) == 7
    assert percentile(list(range(1, 101)), 95) == 95


def test_windows_count_whole_minutes() -> None:
    clock = Clock(T0 + 5_000)
    m = TurnMetrics(clock=clock)
    m.observe_turn(turn(n=0, ms=100), 10)  # minute 0
    clock.now = T0 + 10 * 60_000 + 1_000  # minute 10
    m.observe_turn(turn(n=1, ms=300, status=TurnStatus.FAILED), 30)
    clock.now = T0 + 12 * 60_000  # minute 12
    m.observe_turn(turn(n=2, ms=200), 20)

    every = m.tenant("t1")
    assert (every.window_minutes, every.since_ms, every.counts.turns, every.turn.p50) == (None, T0 + 5_000, 3, 200)
    five = m.tenant("t1", 5)  # minutes 8..12
    assert (five.since_ms, five.until_ms) == (T0 + 8 * 60_000, T0 + 12 * 60_000)
    assert (five.counts.turns, five.counts.failed, five.turn.samples, five.turn.p50, five.turn.p95) == (
        2, 1, 2, 200, 300)
    one = m.tenant("t1", 1)
    assert (one.counts.turns, one.first_token.p50) == (1, 20)
    hour = m.tenant("t1", parse_window("1h"))
    assert hour.since_ms == T0 + 5_000 and hour.counts.turns == 3  # not before the process started

    assert [parse_window(w) for w in (None, "all", "5m", "60m", "1h")] == [None, None, 5, 60, 60]
    for bad in ("0m", "61m", "2h", "5s", "m", "5", "all "):
        with pytest.raises(InvalidRequest):
            parse_window(bad)


def test_memory_stays_bounded() -> None:
    clock = Clock()
    m = TurnMetrics(clock=clock, max_tenants=3)
    for i in range(5_000):
        clock.now = T0 + i * 1_000  # ~83 minutes of turns
        m.observe_turn(turn(n=i, ms=i % 700 + 1), None)
    t = m._tenants["t1"]
    assert len(t.minutes) == 60 and len(t.samples.at) == 256
    assert m.tenant("t1").counts.turns == 5_000 and m.tenant("t1").turn.samples == 256
    for name in ("a", "b", "c", "d"):
        m.observe_turn(turn(name), None)
    assert list(m._tenants) == ["b", "c", "d"]  # the least recently active went first
    assert m.tenant("t1").counts.turns == 0
    # the aggregate series do not grow with turns or tenants
    assert len(m._series) == 1


def test_labels_are_a_few_known_values() -> None:
    assert [model_family(x) for x in (None, "", "scripted", "claude-opus-4-1", "claude-3-5-haiku-latest",
                                      "claude-sonnet-4-5-20250929", "claude-x", "gpt-4o", "user_secret_model")] == [
        "none", "none", "scripted", "claude-opus", "claude-haiku", "claude-sonnet", "claude-other", "other", "other"]
    m = TurnMetrics()
    m.observe_turn(turn(model="my-own-model-abc123", tier="weird_tier_xyz"), None)
    families = {f.name: f for f in text_string_to_metric_families(prometheus_text(m))}
    [sample] = families["avm_turns"].samples
    assert sample.labels == {"tier": "other", "status": "completed", "model_family": "other"}


def test_exposition_is_prometheus_clients_per_registry_and_negotiated() -> None:
    clock = Clock()
    a, b = TurnMetrics(clock=clock), TurnMetrics(clock=clock)
    for i, ms in enumerate((40, 300, 7_000)):
        a.observe_turn(turn(n=i, ms=ms), 120)
    a.observe_budget_overrun("claude-sonnet-4-5")
    b.observe_turn(turn(model="claude-3-5-haiku-latest", status=TurnStatus.FAILED), None)

    body, content_type = exposition(a)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert {(s.name, s.labels["le"], s.value) for s in families["avm_turn_duration_seconds"].samples
            if s.labels.get("le") in ("0.05", "0.5", "5.0", "10.0", "+Inf")} == {
        ("avm_turn_duration_seconds_bucket", "0.05", 1.0), ("avm_turn_duration_seconds_bucket", "0.5", 2.0),
        ("avm_turn_duration_seconds_bucket", "5.0", 2.0), ("avm_turn_duration_seconds_bucket", "10.0", 3.0),
        ("avm_turn_duration_seconds_bucket", "+Inf", 3.0)}
    [total] = [s for s in families["avm_turn_duration_seconds"].samples if s.name.endswith("_sum")]
    assert total.value == pytest.approx(7.34)
    [overrun] = families["avm_budget_overruns"].samples
    assert (overrun.name, overrun.labels, overrun.value) == (
        "avm_budget_overruns_total", {"model_family": "claude-sonnet"}, 1.0)
    # each TurnMetrics has its own registry: b's turn is not in a's scrape, nothing in the global one
    assert {s.labels["model_family"] for s in families["avm_turns"].samples} == {"claude-sonnet"}
    assert [s.labels["status"] for f in text_string_to_metric_families(prometheus_text(b))
            if f.name == "avm_turns" for s in f.samples] == ["failed"]
    assert not [m for m in prometheus_client.REGISTRY.collect() if m.name.startswith("avm_")]

    body, content_type = exposition(a, "application/openmetrics-text;version=1.0.0;q=0.6,text/plain;q=0.3")
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")
    om = {f.name: f for f in openmetrics_families(body.decode())}
    assert [s.value for s in om["avm_turns"].samples] == [3.0]
    # an Accept the library cannot read is the client's problem: the default format, not a 500
    assert exposition(a, "application/openmetrics-text; version=abc")[1] == "text/plain; version=0.0.4; charset=utf-8"


def test_prometheus_client_loads_at_the_first_scrape_only() -> None:
    # ops_http and the metrics are on the cloud functions' cold path, which never serve /metrics
    code = ("import sys, agentvm.api.ops_http, agentvm.services.metrics as m\n"
            "assert 'prometheus_client' not in sys.modules\n"
            "from agentvm.services.prometheus import prometheus_text\n"
            "text = prometheus_text(m.TurnMetrics())\n"
            "assert '# TYPE avm_turns_total counter' in text and 'avm_turns_total{' not in text  # no turn yet\n"
            "assert 'prometheus_client' in sys.modules\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("shared", "local", "client"))}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# ---- end to end --------------------------------------------------------------------------------


async def wait_turns(http: httpx.AsyncClient, n: int, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    for _ in range(300):
        items = (await http.get("/v1/turns", params={"limit": 200}, headers=headers)).json()["items"]
        if len(items) >= n:
            return list(items)
        await asyncio.sleep(0.02)
    raise AssertionError("the turns did not finish")


def label_values(text: str) -> set[str]:
    return {v for f in text_string_to_metric_families(text) for s in f.samples for v in s.labels.values()}


async def test_real_turns_show_in_metrics_prometheus_and_logs(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=reference_driver()) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http, StockClient(srv.url) as ws:
        empty = (await http.get("/v1/metrics")).json()
        assert empty["turns"] == {"total": 0, "completed": 0, "failed": 0, "interrupted": 0}
        assert empty["successRate"] is None and empty["active"] == {"containers": 0, "connections": 1}

        a = await ws.new_image("c-obs-a")
        b = await ws.new_image("c-obs-b")
        await ws.turn(a["imageId"], "Hello")
        await ws.turn(a["imageId"], "Hello again")
        await ws.turn(b["imageId"], "error turn")
        # an interrupted turn
        start = len(ws.events)
        await ws.request("message_send_request", {"imageId": b["imageId"], "content": "slow reply"})
        await ws.wait_for(lambda e: e.get("type") == "text_delta", start=start)
        await ws.request("agent_interrupt_request", {"imageId": b["imageId"]})
        await ws.wait_for(lambda e: e.get("type") == "turn_response", start=start)
        turns = await wait_turns(http, 4)
        by_status = {t["status"]: t for t in turns}
        assert sorted(t["status"] for t in turns) == ["completed", "completed", "failed", "interrupted"]

        got = (await http.get("/v1/metrics")).json()
        assert got["tenantId"] == "local" and got["window"] == "all"
        assert got["turns"] == {"total": 4, "completed": 2, "failed": 1, "interrupted": 1}
        assert (got["successRate"], got["errorRate"]) == (0.5, 0.25)
        assert got["tokens"]["input"] == 24 + by_status["interrupted"]["usage"]["inputTokens"]  # "Hello": 12 in, 3 out
        assert got["tokens"]["output"] == sum(t["usage"]["outputTokens"] for t in turns)
        assert got["tokens"]["cacheRead"] == 0
        assert got["latencyMs"]["turn"]["samples"] == 4
        assert got["latencyMs"]["firstToken"]["samples"] == 3  # the failed turn streamed no text
        # each turn keeps it in the turn log (the cloud's /v1/metrics reads it there)
        firsts = sorted(t["firstTokenMs"] for t in turns if t["firstTokenMs"] is not None)
        assert len(firsts) == 3 and by_status["failed"]["firstTokenMs"] is None
        assert all(0 <= f <= t["durationMs"] for t in turns for f in [t["firstTokenMs"]] if f is not None)
        assert got["latencyMs"]["firstToken"]["p50"] == firsts[1]
        durations = sorted(t["durationMs"] for t in turns)
        assert got["latencyMs"]["turn"]["p50"] == durations[1] and got["latencyMs"]["turn"]["p95"] == durations[3]
        assert got["active"] == {"containers": 2, "connections": 1}
        assert (await http.get("/v1/metrics", params={"window": "5m"})).json()["turns"]["total"] == 4
        bad = await http.get("/v1/metrics", params={"window": "2d"})
        assert (bad.status_code, bad.json()["error"]["field"]) == (400, "window")

        scrape = await http.get("/metrics")  # the open local mode: no key needed
        assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain; version=0.0.4")
        om = await http.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
        assert om.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
        assert om.text.endswith("# EOF\n") and "avm_turns_total" in om.text
        families = {f.name: f for f in text_string_to_metric_families(scrape.text)}
        assert {"avm_turns", "avm_tokens", "avm_turn_duration_seconds", "avm_turn_first_token_seconds",
                "avm_active_connections", "avm_active_containers", "avm_build_info"} <= set(families)
        assert (families["avm_turns"].type, families["avm_turn_duration_seconds"].type) == ("counter", "histogram")
        counted = {(s.labels["status"], s.labels["model_family"]): s.value
                   for s in families["avm_turns"].samples if s.name == "avm_turns_total"}
        assert sum(counted.values()) == 4 and counted[("completed", "claude-other")] == 2  # "claude-x"
        tokens = {s.labels["kind"]: 0.0 for s in families["avm_tokens"].samples}
        for s in families["avm_tokens"].samples:
            tokens[s.labels["kind"]] += s.value
        assert tokens["input"] == got["tokens"]["input"] and tokens["output"] == got["tokens"]["output"]
        counts = [s.value for s in families["avm_turn_duration_seconds"].samples
                  if s.name == "avm_turn_duration_seconds_count"]
        infs = [s.value for s in families["avm_turn_duration_seconds"].samples
                if s.name == "avm_turn_duration_seconds_bucket" and s.labels["le"] == "+Inf"]
        assert sum(counts) == sum(infs) == 4
        assert [s.value for s in families["avm_active_containers"].samples] == [2]
        ids = {"local", a["imageId"], b["imageId"], a["sessionId"], b["sessionId"], "c-obs-a", "c-obs-b",
               *(t["turnId"] for t in turns)}
        assert not label_values(scrape.text) & ids
        assert set(label_values(scrape.text)) - {"0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "30.0",
                                                 "60.0", "120.0", "300.0", "+Inf"} <= {
            "function", "container", "other", "completed", "failed", "interrupted", "claude-other", "none",
            "scripted", "input", "output", "cache_read", "cache_write", families["avm_build_info"].samples[0]
            .labels["version"]}

        # the logs: newest first, every turn at level info
        logs = (await http.get("/v1/logs")).json()
        assert [e["turnId"] for e in logs["items"]] == [t["turnId"] for t in turns] and logs["nextCursor"] is None
        failed = by_status["failed"]
        [entry] = (await http.get("/v1/logs", params={"level": "error"})).json()["items"]
        assert entry == {"time": failed["endedAt"], "level": "error", "turnId": failed["turnId"],
                         "sessionId": b["sessionId"], "containerId": "c-obs-b", "imageId": b["imageId"],
                         "status": "failed", "errorCode": "rate_limit_error", "message": "Rate limit exceeded",
                         "model": failed["model"], "tier": "function", "durationMs": failed["durationMs"],
                         "firstTokenMs": None, "tokens": failed["usage"], "createdAt": failed["createdAt"]}
        warn = (await http.get("/v1/logs", params={"level": "warning"})).json()["items"]
        assert [(e["status"], e["level"]) for e in warn] == [("interrupted", "warning"), ("failed", "error")]
        ok = [e for e in logs["items"] if e["status"] == "completed"]
        assert {(e["level"], e["message"], e["errorCode"], e["containerId"]) for e in ok} == {
            ("info", "turn completed", None, "c-obs-a")}
        assert ok[0]["tokens"] == {"inputTokens": 12, "outputTokens": 3, "cacheReadTokens": 0, "cacheWriteTokens": 0}
        of_a = (await http.get("/v1/logs", params={"containerId": "c-obs-a"})).json()["items"]
        assert [e["turnId"] for e in of_a] == [e["turnId"] for e in ok]
        assert (await http.get("/v1/logs", params={"containerId": "c-obs-a", "level": "error"})).json()["items"] == []
        one = (await http.get("/v1/logs", params={"turnId": failed["turnId"]})).json()
        assert [e["turnId"] for e in one["items"]] == [failed["turnId"]] and one["nextCursor"] is None
        assert (await http.get("/v1/logs", params={"turnId": failed["turnId"], "level": "warning"})
                ).json()["items"] != []
        assert (await http.get("/v1/logs", params={"turnId": "turn_nope"})).json()["items"] == []

        # pages: limit and cursor, unfiltered and filtered
        for params in ({}, {"containerId": "c-obs-b"}, {"level": "warning"}):
            seen: list[str] = []
            cursor = None
            for _ in range(10):
                page = (await http.get("/v1/logs", params={**params, "limit": 1,
                                                           **({"cursor": cursor} if cursor else {})})).json()
                seen += [e["turnId"] for e in page["items"]]
                cursor = page["nextCursor"]
                if cursor is None:
                    break
            every = (await http.get("/v1/logs", params=params)).json()["items"]
            assert seen == [e["turnId"] for e in every] and len(seen) >= 2, params

        # time filters: epoch ms and ISO 8601, on when the turn was created
        oldest, newest = turns[-1], turns[0]
        since = (await http.get("/v1/logs", params={"since": newest["createdAt"]})).json()["items"]
        assert newest["turnId"] in [e["turnId"] for e in since] and oldest["turnId"] not in [e["turnId"] for e in since]
        until = (await http.get("/v1/logs", params={"until": str(oldest["createdAt"] + 1)})).json()["items"]
        assert oldest["turnId"] in [e["turnId"] for e in until] and newest["turnId"] not in [e["turnId"] for e in until]
        assert (await http.get("/v1/logs", params={"since": "2000-01-01T00:00:00Z", "until": "2001-01-01"})
                ).json()["items"] == []
        assert len((await http.get("/v1/logs", params={"since": "2000-01-01T00:00:00+02:00"})).json()["items"]) == 4
        for params in ({"since": "yesterday"}, {"level": "debug"}, {"limit": "0"}, {"cursor": "nope"}):
            res = await http.get("/v1/logs", params=params)
            assert res.status_code == 400, params


async def test_tenants_see_only_their_own_and_prometheus_needs_an_operator_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    _, out, _ = await asyncio.to_thread(cli, capsys, "keys", "create", "--tenant", "acme", "--scope", "admin",
                                        "--data-dir", str(data))
    acme_admin = token_of(out)
    _, out, _ = await asyncio.to_thread(cli, capsys, "keys", "create", "--tenant", "acme", "--data-dir", str(data))
    acme_user = token_of(out)
    _, out, _ = await asyncio.to_thread(cli, capsys, "keys", "create", "--tenant", "bob", "--data-dir", str(data))
    bob = token_of(out)
    _, out, _ = await asyncio.to_thread(cli, capsys, "keys", "create", "--tenant", "ops", "--scope", "operator",
                                        "--data-dir", str(data))
    operator = token_of(out)

    async with in_process(data, driver=reference_driver(), auth="keys") as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        async with StockClient(f"{srv.url}?token={acme_user}") as ws:
            image = await ws.new_image("c-acme")
            await ws.turn(image["imageId"], "Hello")
            await ws.turn(image["imageId"], "error turn")
            [_, failed] = await wait_turns(http, 2, bearer(acme_user))
            async with StockClient(f"{srv.url}?token={bob}") as bob_ws:
                await bob_ws.request("container_create_request", {"containerId": "c-bob"})
                acme = (await http.get("/v1/metrics", headers=bearer(acme_user))).json()
                mine = (await http.get("/v1/metrics", headers=bearer(bob))).json()
        assert acme["tenantId"] == "acme" and acme["turns"]["total"] == 2 and acme["tokens"]["input"] == 12
        assert acme["active"] == {"containers": 1, "connections": 1}
        assert mine["tenantId"] == "bob" and mine["turns"]["total"] == 0 and mine["tokens"]["input"] == 0
        assert mine["active"] == {"containers": 0, "connections": 1}

        assert len((await http.get("/v1/logs", headers=bearer(acme_user))).json()["items"]) == 2
        assert (await http.get("/v1/logs", headers=bearer(bob))).json()["items"] == []
        assert (await http.get("/v1/logs", params={"turnId": failed["turnId"]}, headers=bearer(bob))
                ).json()["items"] == []
        assert (await http.get("/v1/logs", params={"containerId": "c-acme"}, headers=bearer(bob))
                ).json()["items"] == []
        assert (await http.get("/v1/metrics")).status_code == 401
        assert (await http.get("/v1/logs")).status_code == 401

        # /metrics: the operator's (an operator key; a tenant's admin key is not one); every tenant
        # aggregated, no id as a label
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/metrics", headers=bearer(bob))).status_code == 403
        assert (await http.get("/metrics", headers=bearer(acme_user))).status_code == 403
        assert (await http.get("/metrics", headers=bearer(acme_admin))).status_code == 403
        scrape = await http.get("/metrics", headers=bearer(operator))
        assert scrape.status_code == 200
        families = {f.name: f for f in text_string_to_metric_families(scrape.text)}
        assert sum(s.value for s in families["avm_turns"].samples) == 2
        key_ids = {t.split(".")[0] for t in (acme_admin, acme_user, bob)}
        assert not label_values(scrape.text) & {"acme", "bob", "c-acme", "c-bob", image["imageId"],
                                                image["sessionId"], failed["turnId"], *key_ids}


# ---- the log file ------------------------------------------------------------------------------



def test_json_lines_go_to_a_rotating_file_without_secrets(tmp_path: Path, root_logging: None) -> None:
    log_file = tmp_path / "data" / "logs" / "avm.log"
    setup_logging("INFO", log_file=log_file, max_bytes=2_000, backups=2)
    log = logging.getLogger("agentvm.test")
    secret = "avmk_0123456789ab.s3cr3t-Value_x"
    log.info("turn finished", extra={"turn_id": "turn_1", "status": "completed", "input_tokens": 12})
    log.warning(f"rejected {secret}", extra={"token": "raw-token", "llm_api_key": "sk-ant-abc",
                                             "header": "Bearer abc.def", "note": "key sk-ant-api03-XYZ here"})
    for i in range(60):
        log.info("filler", extra={"i": i, "pad": "x" * 50})
    for h in logging.getLogger().handlers:
        h.flush()

    files = sorted(p.name for p in log_file.parent.iterdir())
    assert files == ["avm.log", "avm.log.1", "avm.log.2"]  # rotated, two old files kept
    assert all(p.stat().st_size <= 2_000 for p in log_file.parent.iterdir())
    lines = [json.loads(line) for p in log_file.parent.iterdir() for line in p.read_text().splitlines()]
    assert all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
    newest = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert newest[-1]["msg"] == "filler" and newest[-1]["i"] == 59

    # the first lines rotated away: log again from scratch to read them
    setup_logging("INFO", log_file=log_file, max_bytes=1_000_000)
    log.info("turn finished", extra={"turn_id": "turn_1", "status": "completed", "input_tokens": 12})
    log.warning(f"rejected {secret}", extra={"token": "raw-token", "llm_api_key": "sk-ant-abc",
                                             "header": "Bearer abc.def", "note": "key sk-ant-api03-XYZ here"})
    for h in logging.getLogger().handlers:
        h.flush()
    text = log_file.read_text()
    for leaked in ("s3cr3t", "raw-token", "sk-ant-", "abc.def", "XYZ"):
        assert leaked not in text
    *_, done, warned = [json.loads(line) for line in text.splitlines()]
    assert (done["turn_id"], done["input_tokens"], done["level"]) == ("turn_1", 12, "INFO")
    assert warned["msg"] == f"rejected avmk_0123456789ab.{REDACTED}"
    assert (warned["token"], warned["llm_api_key"], warned["header"], warned["note"]) == (
        REDACTED, REDACTED, f"Bearer {REDACTED}", f"key {REDACTED} here")


def test_avm_serve_logs_to_the_data_dir(tmp_path: Path, root_logging: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import avm.cli

    seen: dict[str, Any] = {}

    def fake_setup(level: str, **kwargs: Any) -> None:
        seen.update(level=level, **kwargs)
        raise SystemExit(0)  # stop before anything listens

    monkeypatch.setattr("agentvm.logs.setup_logging", fake_setup)
    with pytest.raises(SystemExit):
        avm.cli.main(["serve", "--data-dir", str(tmp_path / "d"), "--port", "0"])
    assert seen == {"level": "INFO", "log_file": tmp_path / "d" / "logs" / "avm.log", "console": False}  # no TTY
