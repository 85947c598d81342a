"""The token API's overhead benchmark (tests/bench/token_gateway.py) in its small version: a real `avm
serve` in front of the fake Anthropic API, every kind of call made, streaming and not. It checks that
every call succeeded, was billed once, and that every figure is produced — never how fast anything is
(the figures and the 2 ms target live in `make bench`, docs/benchmarks.md)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from tests.bench.token_gateway import KINDS, QUICK_CALLS, QUICK_WARMUP, ROUTES, TARGET_ADDED_P50_MS
from tests.support.servers import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]  # a latency benchmark


def finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def test_quick_run_measures_every_kind_against_the_direct_baseline(tmp_path: Path) -> None:
    out = tmp_path / "token-gateway.json"
    proc = subprocess.run([sys.executable, "-m", "tests.bench.token_gateway", "--quick", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "quick" and result["calls_per_kind"] == QUICK_CALLS
    assert result["target_added_p50_ms"] == TARGET_ADDED_P50_MS and finite(result["worst_added_p50_ms"])
    assert set(result["modes"]) == {"json", "stream"}
    for mode, m in result["modes"].items():
        assert set(m["kinds"]) == set(KINDS) and set(m["added"]) == set(ROUTES), mode
        for kind, s in m["kinds"].items():
            for key in ("ttfb_p50_ms", "ttfb_p95_ms", "total_p50_ms", "total_p95_ms"):
                assert finite(s[key]) and s[key] > 0, (mode, kind, key, s)
            assert s["ttfb_p50_ms"] <= s["total_p50_ms"] and s["ttfb_p50_ms"] <= s["ttfb_p95_ms"], (mode, kind, s)
        for route, a in m["added"].items():
            base, via = m["kinds"]["direct"], m["kinds"][route]
            assert a["total_p50_added_ms"] == via["total_p50_ms"] - base["total_p50_ms"], (mode, route)
            assert a["ttfb_p50_ratio"] == via["ttfb_p50_ms"] / base["ttfb_p50_ms"], (mode, route)
    # every call through avm serve was metered: one record each (2 routes × 2 modes × warm-up + timed calls),
    # the fake's 10 input and 5 output tokens on Claude Haiku 4.5 ($1 and $5 per million) at list × 1.05
    calls = len(ROUTES) * 2 * (QUICK_WARMUP + QUICK_CALLS)
    billed = result["billed"]
    assert billed["calls"] == calls, billed
    assert billed["usage"] == {"inputTokens": 10 * calls, "outputTokens": 5 * calls, "cacheReadTokens": 0,
                               "cacheWriteTokens": 0}, billed
    assert Decimal(billed["listCost"]) == calls * Decimal("0.000035"), billed
    assert Decimal(billed["billedCost"]) == Decimal(billed["listCost"]) * Decimal("1.05"), billed
    assert "worst added p50" in proc.stdout and "| stream | chat |" in proc.stdout
