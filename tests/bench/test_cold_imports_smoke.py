"""The handler cold-import benchmark in its small version, so that it cannot rot.

Timing is only checked to be produced and positive (the 2.5 × boto3 budget is judged by `make bench`,
see docs/benchmarks.md). What a handler loads is deterministic, so that is asserted here for every
handler: none loads the anthropic SDK, aioboto3, aiohttp or uvicorn, and only `http_api` loads FastAPI.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest

from tests.bench.cold_imports import EXPECTED, discover
from tests.support.servers import REPO

NEVER = {"anthropic", "aioboto3", "aiobotocore", "aiohttp", "uvicorn"}


def positive(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path_factory.mktemp("cold-imports") / "cold_imports.json"
    proc = subprocess.run([sys.executable, "-m", "tests.bench.cold_imports", "--quick", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.exists(), proc.stderr[-4000:]
    return proc, json.loads(out.read_text())


def rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in result["handlers"]}


def test_quick_run_has_a_measured_row_per_handler(quick_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
                                                  ) -> None:
    proc, result = quick_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert result["mode"] == "quick" and result["runs"] == 3 and result["passed"] is True
    by_name = rows(result)
    existing = set(discover())
    # Every expected handler has a row; the ones written so far are measured.
    assert set(EXPECTED) <= set(by_name)
    assert {n for n, r in by_name.items() if r["status"] != "missing"} == existing
    assert set(result["missing"]) == set(EXPECTED) - existing
    for name in existing:
        r = by_name[name]
        assert r["status"] == "ok", r
        assert len(r["samples_ms"]) == len(r["boto3_samples_ms"]) == 3, r
        assert all(positive(v) for v in r["samples_ms"] + r["boto3_samples_ms"]), r
        assert positive(r["median_ms"]) and positive(r["boto3_median_ms"]) and positive(r["ratio"]), r
        assert isinstance(r["within_limit"], bool), r
        assert r["modules"] > 0, r
        assert name in proc.stdout  # the table shows every row
    for name in set(EXPECTED) - existing:
        assert by_name[name]["median_ms"] is None


@pytest.mark.parametrize("name", EXPECTED)
def test_handler_loads_nothing_heavy(quick_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
                                     name: str) -> None:
    row = rows(quick_run[1])[name]
    if row["status"] == "missing":
        pytest.skip(f"functions/{name}/handler.py is not written yet")
    assert row["status"] == "ok", row
    loaded = set(row["heavy"])
    assert not loaded & NEVER, loaded
    assert ("fastapi" in loaded) == (name == "http_api"), loaded
    assert row["loads_anthropic"] is False
