"""The 1,000-client load of `make bench` (tests/bench/many_clients.py) in its small version: 50
clients × 3 turns against a real `avm serve` and the baseline, plus the slow client. It checks that
there are no errors, that the slow client is closed with the reason, and that every figure is
produced — never how fast anything is (performance claims live in `make bench`)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from agentvm.api.ws_hub import OVERFLOW_REASON
from tests.bench.many_clients import QUICK
from tests.support.servers import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]  # a CPU-heavy benchmark


def positive(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def test_quick_load_has_no_errors_and_closes_the_slow_client(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    proc = subprocess.run([sys.executable, "-m", "tests.bench.many_clients", "--quick", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "quick" and result["failed"] == [] and result["errors"] == 0
    assert result["machine"]["nofile"][0] >= 2 * QUICK.clients
    assert set(result["rounds"]) == {"agentvm", "agentvm_slow", "baseline"}
    for name, r in result["rounds"].items():
        assert r["errors"] == 0 and r["turns"] == QUICK.clients * QUICK.turns, (name, r)
        for key in ("first_delta_p50_ms", "first_delta_p99_ms", "turns_per_s", "rss_peak_bytes", "vmhwm_after_bytes"):
            assert positive(r[key]), (name, key, r)
        assert r["first_delta_p50_ms"] <= r["first_delta_p99_ms"]
    for side in ("agentvm", "baseline"):
        for key in ("vmhwm_bytes", "rss_idle_bytes", "rss_connected_bytes"):
            assert positive(result[f"{side}_{key}"]), (side, key)
    slow = result["slow"]
    assert (slow["close_code"], slow["close_reason"]) == (1013, OVERFLOW_REASON), slow
    assert slow["subscribed"] == QUICK.clients and slow["closed_after_s"] is not None
    for label in ("first-delta p50 (ms)", "first-delta p99 (ms)", "turns/s", "server peak RSS", "per client",
                  "slow client"):
        assert label in proc.stdout
