"""`make bench` in its small version, so that the benchmarks cannot rot.

It checks that every figure is produced and sane, never how fast anything is: performance claims
live in `make bench` and docs/benchmarks.md, not in timed unit tests.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import REPO

pytestmark = pytest.mark.e2e

FIGURES = {
    "first_delta_p50_ms", "first_delta_p99_ms", "concurrent_turns_per_s", "concurrent_turn_p99_ms",
    "text_delta_frames_per_s", "create_pairs_per_s", "rss_bytes_per_container",
}
WITHOUT_BASELINE = {"rss_bytes_per_container"}


def positive(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def test_quick_bench_produces_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "tests.bench.run", "--quick", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
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
