"""The token API's overhead: what a call through `avm serve` adds over calling the provider directly.

    .venv/bin/python -m tests.bench.token_gateway [--quick] [--calls N] [--json FILE] [--wait-idle S]

The fake Anthropic API (tests/fakes/fake_anthropic.py) runs as its own process, and a real `avm serve`
(an Anthropic key, its base URL the fake's, no retries) as another. From this process one keep-alive
httpx client makes, in the same run, N calls of each kind (interleaved call by call, so that a change
of the machine's load touches every kind alike), streaming and not:

- `direct`: `POST /v1/messages` to the fake itself, the baseline;
- `messages`: `POST /v1/messages` on `avm serve` (the Anthropic-compatible route);
- `chat`: `POST /v1/chat/completions` on `avm serve` (the OpenAI-compatible route, translated).

Every call is metered as in production (the open mode's tenant: admitted, held, one usage record
settled). Per kind: time to first byte (request sent → first body byte; for a stream, its first event)
and total (→ last byte), p50 and p95 in ms. The added latency of a route is its p50 minus the direct
p50 of the same streaming mode, also as a ratio. The target (issue 20): at most 2 ms p50 added.

Exit status 1 when a route misses the target (never with `--quick`: the small version, run by the
smoke test tests/bench/test_token_gateway_smoke.py, checks that every figure is produced, not how
fast anything is).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.bench.load import percentile
from tests.bench.run import bench_parser, fmt, log, machine, wait_until_idle
from tests.support.servers import REPO, ServeProcess, start_serve, stop_serve

TARGET_ADDED_P50_MS = 2.0
MODEL = "claude-haiku-4-5"
MESSAGES = [{"role": "user", "content": "Say hello."}]
FULL_CALLS, QUICK_CALLS = 1000, 20
FULL_WARMUP, QUICK_WARMUP = 100, 5
KINDS = ("direct", "messages", "chat")
ROUTES = ("messages", "chat")
UPSTREAM_HEADERS = {"x-api-key": "bench-key", "anthropic-version": "2023-06-01"}


@dataclass(frozen=True, slots=True)
class Call:
    kind: str
    url: str
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(slots=True)
class Timings:
    ttfb_ms: list[float]
    total_ms: list[float]

    def summary(self) -> dict[str, float]:
        return {"ttfb_p50_ms": percentile(self.ttfb_ms, 50), "ttfb_p95_ms": percentile(self.ttfb_ms, 95),
                "total_p50_ms": percentile(self.total_ms, 50), "total_p95_ms": percentile(self.total_ms, 95)}


@contextlib.contextmanager
def fake_upstream() -> Iterator[str]:
    """The fake Anthropic API as its own process; its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.fake_anthropic", "--port", "0",
                             "--api-key", UPSTREAM_HEADERS["x-api-key"]],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "listening":
            raise RuntimeError(f"the fake Anthropic API did not start: {line}")
        yield line[1]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def calls(fake: str, serve: str, stream: bool) -> list[Call]:
    anthropic = {"model": MODEL, "max_tokens": 100, "messages": MESSAGES, "stream": stream}
    chat: dict[str, Any] = {"model": MODEL, "max_tokens": 100, "messages": MESSAGES, "stream": stream}
    if stream:
        chat["stream_options"] = {"include_usage": True}
    return [Call("direct", f"{fake}/v1/messages", anthropic, UPSTREAM_HEADERS),
            Call("messages", f"{serve}/v1/messages", anthropic, {"anthropic-version": "2023-06-01"}),
            Call("chat", f"{serve}/v1/chat/completions", chat, {})]


def timed(client: httpx.Client, call: Call, clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """One call: (ms to the first body byte, ms to the last)."""
    content = json.dumps(call.body).encode()
    headers = {**call.headers, "content-type": "application/json"}
    first: float | None = None
    started = clock()
    with client.stream("POST", call.url, content=content, headers=headers) as response:
        for _ in response.iter_raw():
            if first is None:
                first = clock()
        if response.status_code != 200:
            raise RuntimeError(f"{call.kind} ({call.url}) answered {response.status_code}: {response.read()[:500]!r}")
    ended = clock()
    return ((first if first is not None else ended) - started) * 1000, (ended - started) * 1000


def measure(client: httpx.Client, batch: list[Call], n: int, warmup: int) -> dict[str, Timings]:
    """`warmup` untimed rounds, then `n` timed: each round makes one call of every kind, the order
    rotated from round to round."""
    out = {c.kind: Timings([], []) for c in batch}
    for i in range(warmup + n):
        shift = i % len(batch)
        for call in batch[shift:] + batch[:shift]:
            ttfb, total = timed(client, call)
            if i >= warmup:
                out[call.kind].ttfb_ms.append(ttfb)
                out[call.kind].total_ms.append(total)
    return out


def added(summary: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per route: its p50s minus the direct p50s (ms), and its p50s over them."""
    base = summary["direct"]
    return {route: {"ttfb_p50_added_ms": summary[route]["ttfb_p50_ms"] - base["ttfb_p50_ms"],
                    "total_p50_added_ms": summary[route]["total_p50_ms"] - base["total_p50_ms"],
                    "ttfb_p50_ratio": summary[route]["ttfb_p50_ms"] / base["ttfb_p50_ms"],
                    "total_p50_ratio": summary[route]["total_p50_ms"] / base["total_p50_ms"]}
            for route in ROUTES}


def run(n: int, warmup: int, workdir: Path, serve_env: dict[str, str] | None = None) -> dict[str, Any]:
    modes: dict[str, Any] = {}
    with fake_upstream() as fake:
        env = {"LLM_API_KEY": UPSTREAM_HEADERS["x-api-key"], "AVM_LLM_BASE_URL": fake, "AVM_LLM_MAX_RETRIES": "0",
               **(serve_env or {})}
        sp: ServeProcess = start_serve(workdir / "data", env=env)
        try:
            with httpx.Client(timeout=30) as client:
                for stream in (False, True):
                    mode = "stream" if stream else "json"
                    log(f"{mode}: {warmup} + {n} calls of each of {', '.join(KINDS)}")
                    timings = measure(client, calls(fake, sp.http, stream), n, warmup)
                    summary = {kind: t.summary() for kind, t in timings.items()}
                    modes[mode] = {"kinds": summary, "added": added(summary)}
            billed = httpx.get(f"{sp.http}/v1/usage", timeout=10).json()["total"]
        finally:
            stop_serve(sp)
    worst = max(a["total_p50_added_ms"] for m in modes.values() for a in m["added"].values())
    worst_ttfb = max(a["ttfb_p50_added_ms"] for m in modes.values() for a in m["added"].values())
    return {"calls_per_kind": n, "warmup_per_kind": warmup, "modes": modes, "billed": billed,
            "worst_added_p50_ms": max(worst, worst_ttfb), "target_added_p50_ms": TARGET_ADDED_P50_MS}


def report(result: dict[str, Any]) -> str:
    rows = ["| mode | kind | TTFB p50 | TTFB p95 | total p50 | total p95 | added p50 (TTFB / total) "
            "| × direct (TTFB / total) |", "|---|---|---|---|---|---|---|---|"]
    for mode, m in result["modes"].items():
        for kind, s in m["kinds"].items():
            a = m["added"].get(kind)
            plus = f"+{fmt(a['ttfb_p50_added_ms'])} / +{fmt(a['total_p50_added_ms'])}" if a else "(baseline)"
            ratio = f"{a['ttfb_p50_ratio']:.2f} / {a['total_p50_ratio']:.2f}" if a else "1"
            rows.append(f"| {mode} | {kind} | {fmt(s['ttfb_p50_ms'])} | {fmt(s['ttfb_p95_ms'])} | "
                        f"{fmt(s['total_p50_ms'])} | {fmt(s['total_p95_ms'])} | {plus} | {ratio} |")
    worst, target = result["worst_added_p50_ms"], result["target_added_p50_ms"]
    rows.append(f"\nworst added p50: {fmt(worst)} ms (target ≤ {fmt(target)} ms: "
                f"{'met' if worst <= target else 'MISSED'}); ms, {result['calls_per_kind']} calls of each kind")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("python -m tests.bench.token_gateway", __doc__)
    parser.add_argument("--calls", type=int,
                        help=f"timed calls of each kind (default {FULL_CALLS}, quick {QUICK_CALLS})")
    parser.add_argument("--serve-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the server under test, e.g. AVM_LLM_HTTP_CLIENT=httpx (A/B runs)")
    args = parser.parse_args(argv)
    serve_env = dict(item.partition("=")[::2] for item in args.serve_env)
    n = args.calls or (QUICK_CALLS if args.quick else FULL_CALLS)
    warmup = QUICK_WARMUP if args.quick else FULL_WARMUP
    wait = args.wait_idle if args.wait_idle is not None else (0.0 if args.quick else 120.0)
    info = machine()
    if wait > 0:
        info["foreign_cpu_share_at_start"] = round(wait_until_idle(min(wait, 180.0)), 3)
    with tempfile.TemporaryDirectory(prefix="avm-bench-") as tmp:
        result = run(n, warmup, Path(tmp), serve_env)
    result = {"mode": "quick" if args.quick else "full", "machine": info, "serve_env": serve_env, **result}
    print(report(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if args.quick or result["worst_added_p50_ms"] <= TARGET_ADDED_P50_MS else 1


if __name__ == "__main__":
    sys.exit(main())
