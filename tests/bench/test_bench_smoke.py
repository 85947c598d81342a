"""`make bench` in its small version, so that the benchmarks cannot rot.

One `python -m tests.bench.run --quick` run serves every test here: the load figures and the handler
cold-import table that `make bench` prints after them. The load figures are only checked to be
produced and sane, never how fast anything is: those claims live in `make bench` and
docs/benchmarks.md. The cold imports are the exception: each function's import must stay within
2.5 × a bare `import boto3` (issue 18, finding 9), judged as the bench judges it, on the median CPU
time of runs alternating with boto3's in the same fresh-interpreter set-up, which load moves by a few
per cent at most (the two FastAPI apps, closest to the limit, get a margin for the load of the suite
around this quick run, which `make bench` does not give them). What a handler loads is
deterministic, so that is asserted for every handler: none loads the anthropic SDK, aioboto3 or
aiohttp; only `http_api` and `chat_stream` (the two web apps) load FastAPI, and only `chat_stream` (its
server) uvicorn. The bench covers every function of template.yaml.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest

from tests.bench.cold_imports import EXPECTED, FIRST_REQUESTS, LIMIT_RATIO, discover
from tests.support.exclusive import exclusive
from tests.support.servers import REPO
from tests.template.template_model import _resources

pytestmark = pytest.mark.e2e

FIGURES = {
    "first_delta_p50_ms", "first_delta_p99_ms", "concurrent_turns_per_s", "concurrent_turn_p99_ms",
    "text_delta_frames_per_s", "create_pairs_per_s", "rss_bytes_per_container",
}
WITHOUT_BASELINE = {"rss_bytes_per_container"}
NEVER = {"anthropic", "aioboto3", "aiobotocore", "aiohttp"}
WEB_APPS = {"http_api", "chat_stream"}
# Measured (2026-11-26, `make bench`, load 1.4): http_api 2.16 ×, chat_stream 2.27 ×, within LIMIT_RATIO with
# less room than the others (≤ 1.97 ×): in this quick run (3 samples, the suite's other workers busy)
# they may read up to 8 % over it; `make bench` (7 samples) judges them at LIMIT_RATIO itself.
LOADED_MARGIN = {"http_api": 1.08, "chat_stream": 1.08}

QuickRun = tuple[subprocess.CompletedProcess[str], dict[str, Any]]


def positive(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> QuickRun:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    with exclusive():  # a CPU-heavy benchmark (tests/support/exclusive.py)
        proc = subprocess.run([sys.executable, "-m", "tests.bench.run", "--quick", "--json", str(out)], cwd=REPO,
                              capture_output=True, text=True, timeout=240)
    assert out.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc, json.loads(out.read_text())


def test_quick_bench_produces_every_figure(quick_run: QuickRun) -> None:
    proc, result = quick_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert result["mode"] == "quick"
    assert result["machine"]["cores"] >= 1 and result["machine"]["python"]
    figures = {f["key"]: f for f in result["figures"]}
    assert set(figures) == FIGURES
    for key, f in figures.items():
        assert positive(f["value"]), (key, f)
        assert positive(f["target"]), (key, f)
        assert isinstance(f["met"], bool), (key, f)
        if key in WITHOUT_BASELINE:
            assert f["baseline"] is None and f["ratio"] is None, (key, f)
        else:
            assert positive(f["baseline"]) and positive(f["ratio"]), (key, f)
        assert f["label"] in proc.stdout  # the table shows every figure


def cold_rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in result["cold_imports"]["handlers"]}


def test_cold_imports_have_a_measured_row_per_handler(quick_run: QuickRun) -> None:
    proc, result = quick_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    cold = result["cold_imports"]
    assert cold["mode"] == "quick" and cold["runs"] == 3 and cold["passed"] is True
    by_name = cold_rows(result)
    existing = set(discover())
    # Every expected handler has a row; the ones written so far are measured.
    assert set(EXPECTED) <= set(by_name)
    assert {n for n, r in by_name.items() if r["status"] != "missing"} == existing
    assert set(cold["missing"]) == set(EXPECTED) - existing
    for name in existing:
        r = by_name[name]
        assert r["status"] == "ok", r
        assert len(r["samples_ms"]) == len(r["boto3_samples_ms"]) == 3, r
        assert len(r["cpu_samples_ms"]) == len(r["boto3_cpu_samples_ms"]) == 3, r
        assert all(positive(v) for v in r["samples_ms"] + r["boto3_samples_ms"]), r
        assert all(positive(v) for v in r["cpu_samples_ms"] + r["boto3_cpu_samples_ms"]), r
        assert positive(r["median_ms"]) and positive(r["boto3_median_ms"]) and positive(r["ratio"]), r
        assert positive(r["cpu_ratio"]), r
        assert isinstance(r["within_limit"], bool), r
        assert r["modules"] > 0, r
        assert name in proc.stdout  # the table shows every row
    for name in set(EXPECTED) - existing:
        assert by_name[name]["median_ms"] is None


@pytest.mark.parametrize("name", EXPECTED)
def test_handler_loads_nothing_heavy(quick_run: QuickRun, name: str) -> None:
    row = cold_rows(quick_run[1])[name]
    if row["status"] == "missing":
        pytest.skip(f"functions/{name}/handler.py is not written yet")
    assert row["status"] == "ok", row
    loaded = set(row["heavy"])
    assert not loaded & NEVER, loaded
    assert ("fastapi" in loaded) == (name in WEB_APPS), loaded
    assert ("uvicorn" in loaded) == (name == "chat_stream"), loaded
    assert row["loads_anthropic"] is False


@pytest.mark.parametrize("name", EXPECTED)
def test_handler_cold_import_is_within_budget(quick_run: QuickRun, name: str) -> None:
    row = cold_rows(quick_run[1])[name]
    assert row["status"] == "ok", row
    ratio = row["cpu_ratio"]
    assert positive(ratio) and len(row["cpu_samples_ms"]) == 3, row
    limit = LIMIT_RATIO * LOADED_MARGIN.get(name, 1.0)
    assert ratio <= limit, f"{name}: {ratio:.2f} × boto3 (CPU time) > {limit:.2f}"
    if name not in LOADED_MARGIN:
        assert row["within_limit"] is True, row


def test_the_first_request_of_a_web_app_builds_its_own_routes_only(quick_run: QuickRun) -> None:
    rows = {(r["function"], r["path"]): r for r in quick_run[1]["cold_imports"]["first_requests"]}
    assert set(rows) == {(name, path) for name, paths in FIRST_REQUESTS.items() for path in paths}
    for row in rows.values():
        assert all(positive(row[k]) for k in ("init_cpu_ms", "first_request_cpu_ms", "total_cpu_ms", "boto3_cpu_ms"))
        # the request builds its router (≥ 30 ms measured; ~0 if init had built it already), and building
        # one router takes far less than the import did (every router built: ~100-200 ms more)
        assert 1.0 < row["first_request_cpu_ms"] < row["init_cpu_ms"] / 2, row


def test_the_cold_import_bench_covers_every_function_of_the_template() -> None:
    code = {str(r["Properties"]["CodeUri"]).strip("/").removeprefix("functions/")
            for r in _resources("AWS::Serverless::Function").values()}
    assert code == set(EXPECTED)
    assert set(discover()) == set(EXPECTED)  # each one is found and measured
