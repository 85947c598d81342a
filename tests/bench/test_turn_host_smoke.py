"""The turn-host bench (tests/bench/turn_host.py) in its small version (time ÷ 10, 5 sessions), so
that it cannot rot: every counted turn runs on the host process (the bench itself fails when one
goes to `chat_turn` or is refused), the per-turn counts do not grow with the conversation, and every
figure the cost model reads is there. Counts are asserted, never timings."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]  # a CPU-heavy benchmark


def test_quick_run_puts_every_turn_on_the_host_with_flat_counts(tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    proc = subprocess.run([sys.executable, "-m", "tests.bench.turn_host", "--quick", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    host = data["host"]
    assert (host["vcpu"], host["memory_mb"], host["sessions"]) == (0.5, 1024, 5)
    assert host["cpu_ms_per_turn"] > 0 and host["peak_rss_mb"] > 0
    assert host["concurrent_turns_at_70pct"] == math.floor(0.7 * 0.5 * 10_000 / host["cpu_ms_per_turn"])
    tiers = data["tiers"]["host"]
    assert sorted(tiers, key=int) == ["1", "2", "3"]
    for counts in tiers.values():
        assert counts["lambda_invocations"] == {"ws_default": 1.0}  # no chat_turn: the host ran it
        assert counts["inbound_frames"] == 1.0
        # ws_default queued the turn once; the host received it and deleted it (batched when several came
        # at once: at most one receive and one delete a turn)
        assert 1.0 < counts["sqs_requests"] <= 3.0
        assert counts["other_calls"] == {}
        assert counts["ddb_metering_requests"] == 2.0  # a priced model, no budget: usage record + spend counter
        assert counts["post_to_connection"] > 0 and counts["bytes_out"] > 0
    # the first turn of a session also registers its agent; from the second on, writes do not grow
    # (read requests follow the turn's wall time, about 4 a second on the host: not compared here)
    second, third = tiers["2"], tiers["3"]
    for key in ("ddb_write_requests", "ddb_metering_requests"):
        assert second[key] == third[key], key
    # units are sizes: the turn's events block holds as many text frames as the coalescing windows made
    # (timing: a loaded machine makes more windows), so each session's block may cross one 1 KB boundary
    # (at most 1 unit a session on average; seen: 3 units in 5 sessions under a parallel `make test`).
    # Growth with the conversation would add to every session's turn; the requests above are exact.
    assert abs(second["ddb_write_units"] - third["ddb_write_units"]) <= 1.0, (second, third)
