"""`make bench`: AgentVM's performance figures, each against a baseline measured in the same run.

    .venv/bin/python -m tests.bench.run [--quick] [--json FILE]

AgentVM (`avm serve`, scripted offline driver) and the baseline (a bare `websockets` server
replaying frames captured from AgentVM at the start of the run, see baseline_server.py) each run as
their own process; this load client runs on uvloop in a third. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson
import uvloop

from tests.bench.load import (
    CAPTURE_RID,
    RawConn,
    TurnResult,
    close_all,
    create_pairs,
    open_many,
    percentile,
)
from tests.support.servers import REPO, ServeProcess, free_port, start_serve, stop_serve

T = TypeVar("T")

TURN_CONTENT = "hi there"
STREAM_CONTENT = "stream please"


@dataclass(frozen=True)
class Sizes:
    mode: str
    latency_turns: int
    latency_warmup: int
    concurrent_conns: int
    concurrent_rounds: int
    stream_chunks: int
    stream_rounds: int
    create_pairs: int
    create_inflight: int
    memory_containers: int
    memory_conns: int
    phase_timeout_s: float
    total_timeout_s: float


FULL = Sizes("full", latency_turns=500, latency_warmup=20, concurrent_conns=100, concurrent_rounds=5,
             stream_chunks=300, stream_rounds=3, create_pairs=5000, create_inflight=50, memory_containers=10_000,
             memory_conns=4, phase_timeout_s=180, total_timeout_s=540)
QUICK = Sizes("quick", latency_turns=30, latency_warmup=5, concurrent_conns=100, concurrent_rounds=1,
              stream_chunks=300, stream_rounds=1, create_pairs=200, create_inflight=50, memory_containers=1000,
              memory_conns=4, phase_timeout_s=30, total_timeout_s=50)


@dataclass
class Figure:
    key: str
    label: str
    unit: str
    value: float
    baseline: float | None
    target: float
    target_op: Literal["<=", ">="]
    target_on: Literal["value", "ratio"] = "value"
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return None if self.baseline is None or self.baseline == 0 else self.value / self.baseline

    @property
    def met(self) -> bool:
        subject = self.ratio if self.target_on == "ratio" else self.value
        if subject is None:
            return False
        return subject <= self.target if self.target_op == "<=" else subject >= self.target

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "met": self.met}


# ---- processes -----------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("VmRSS not found")


@dataclass
class Baseline:
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"


def start_baseline(plan: dict[str, Any], workdir: Path, timeout: float = 20.0) -> Baseline:
    plan_path = workdir / f"plan-{time.monotonic_ns()}.json"
    plan_path.write_bytes(orjson.dumps(plan))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.bench.baseline_server", "--port", str(port),
                             "--plan", str(plan_path)], cwd=REPO, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"baseline server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return Baseline(proc, port)
        time.sleep(0.05)
    stop_baseline(Baseline(proc, port))
    raise RuntimeError("baseline server did not start")


def stop_baseline(b: Baseline) -> None:
    if b.proc.poll() is None:
        b.proc.terminate()
        try:
            b.proc.wait(10)
        except subprocess.TimeoutExpired:
            b.proc.kill()
            b.proc.wait(5)


@contextlib.contextmanager
def ours(workdir: Path, name: str, *args: str) -> Iterator[ServeProcess]:
    data = workdir / name
    data.mkdir()
    sp = start_serve(data / "data", "--log-level", "WARNING", "--flush-ms", "0", *args)
    try:
        yield sp
    finally:
        stop_serve(sp)


@contextlib.contextmanager
def baseline(plan: dict[str, Any], workdir: Path) -> Iterator[Baseline]:
    b = start_baseline(plan, workdir)
    try:
        yield b
    finally:
        stop_baseline(b)


@dataclass
class Measured:
    """A measurement and the CPU seconds the server and this client spent on it."""

    server_cpu_s: float
    client_cpu_s: float
    wall_s: float


async def measured(pid: int, fn: Callable[[], Awaitable[T]], timeout: float) -> tuple[T, Measured]:
    s0, c0, w0 = cpu_seconds(pid), time.process_time(), time.perf_counter()
    async with asyncio.timeout(timeout):
        result = await fn()
    return result, Measured(cpu_seconds(pid) - s0, time.process_time() - c0, time.perf_counter() - w0)


def cpu_details(m: Measured) -> dict[str, Any]:
    return {"server_cpu_share": round(m.server_cpu_s / m.wall_s, 3),
            "client_cpu_share": round(m.client_cpu_s / m.wall_s, 3), "wall_s": round(m.wall_s, 3)}


# ---- capture -------------------------------------------------------------------------------------


async def capture(url: str, content: str) -> dict[str, Any]:
    """One real container, image and turn from AgentVM, as the exact frames it sent."""
    conn = await RawConn.open(url)
    try:
        created: list[str] = []
        imaged: list[str] = []
        await conn.request("container_create_request", {"containerId": "bench-capture"}, CAPTURE_RID, created)
        res = await conn.request("image_create_request", {"containerId": "bench-capture", "config": {}},
                                 CAPTURE_RID, imaged)
        turn = await conn.turn(res["data"]["record"]["imageId"], content, request_id=CAPTURE_RID, record=True)
    finally:
        await conn.close()
    return {"placeholder": CAPTURE_RID, "replies": {"container_create_request": created,
                                                    "image_create_request": imaged,
                                                    "message_send_request": turn.frames}}


# ---- the figures ---------------------------------------------------------------------------------


async def latency_run(url: str, turns: int, warmup: int) -> list[float]:
    conn = await RawConn.open(url)
    try:
        image = await conn.setup_image("bench-latency")
        firsts: list[float] = []
        for i in range(warmup + turns):
            r = await conn.turn(image, TURN_CONTENT)
            if i >= warmup:
                firsts.append(r.first_delta_s)
        return firsts
    finally:
        await conn.close()


async def concurrent_round(conns: list[RawConn], tag: str, content: str) -> tuple[float, list[TurnResult]]:
    """Set up one fresh image per connection, release all turns together; returns (release time, results)."""
    images = await asyncio.gather(*(c.setup_image(f"bench-{tag}-{i:04d}") for i, c in enumerate(conns)))
    release = asyncio.Event()

    async def one(conn: RawConn, image: str) -> TurnResult:
        await release.wait()
        return await conn.turn(image, content)

    tasks = [asyncio.create_task(one(c, img)) for c, img in zip(conns, images, strict=True)]
    await asyncio.sleep(0.1)  # every task is parked on the event
    t0 = time.perf_counter()
    release.set()
    return t0, await asyncio.gather(*tasks)


async def concurrent_turns(url: str, pid: int, n: int, rounds: int, tag: str, timeout: float
                           ) -> tuple[list[float], list[float], Measured]:
    """turns/s and p99 turn time (ms) of each round."""
    conns = await open_many(url, n)
    try:
        tps: list[float] = []
        p99: list[float] = []
        cpu = Measured(0, 0, 0)
        for r in range(rounds):
            (t0, results), m = await measured(pid, lambda r=r: concurrent_round(conns, f"{tag}{r}", TURN_CONTENT),
                                              timeout)
            wall = max(x.end_at for x in results) - t0
            tps.append(n / wall)
            p99.append(percentile([x.total_s for x in results], 99) * 1000)
            cpu = Measured(cpu.server_cpu_s + m.server_cpu_s, cpu.client_cpu_s + m.client_cpu_s, cpu.wall_s + m.wall_s)
        return tps, p99, cpu
    finally:
        await close_all(conns)


async def delta_rate(url: str, pid: int, n: int, rounds: int, chunks: int, tag: str, timeout: float
                     ) -> tuple[list[float], Measured]:
    """text_delta frames/s across n connections, one round per entry."""
    conns = await open_many(url, n)
    try:
        rates: list[float] = []
        cpu = Measured(0, 0, 0)
        for r in range(rounds):
            (_t0, results), m = await measured(
                pid, lambda r=r: concurrent_round(conns, f"{tag}{r}", STREAM_CONTENT), timeout)
            total = sum(x.deltas for x in results)
            if total != n * chunks:
                raise RuntimeError(f"expected {n * chunks} text_delta frames, got {total}")
            span = max(x.end_at for x in results) - min(x.first_delta_at for x in results)
            rates.append(total / span)
            cpu = Measured(cpu.server_cpu_s + m.server_cpu_s, cpu.client_cpu_s + m.client_cpu_s, cpu.wall_s + m.wall_s)
        return rates, cpu
    finally:
        await close_all(conns)


async def pair_rate(url: str, pairs: int, inflight: int, tag: str) -> float:
    conn = await RawConn.open(url)
    try:
        await create_pairs(conn, min(100, pairs), inflight=inflight, prefix=f"{tag}-warm")
        wall = await create_pairs(conn, pairs, inflight=inflight, prefix=tag)
        return pairs / wall
    finally:
        await conn.close()


async def memory_per_container(url: str, pid: int, n: int, conns_n: int, inflight: int) -> tuple[float, dict[str, Any]]:
    warm = await RawConn.open(url)
    try:
        await create_pairs(warm, 100, inflight=inflight, prefix="bench-mem-warm")
    finally:
        await warm.close()
    await asyncio.sleep(0.5)
    before = rss_bytes(pid)
    conns = await open_many(url, conns_n)
    try:
        share = [n // conns_n + (1 if i < n % conns_n else 0) for i in range(conns_n)]
        await asyncio.gather(*(create_pairs(c, k, inflight=inflight, prefix=f"bench-mem{i}")
                               for i, (c, k) in enumerate(zip(conns, share, strict=True))))
    finally:
        await close_all(conns)
    await asyncio.sleep(1.0)
    after = rss_bytes(pid)
    return (after - before) / n, {"rss_before_bytes": before, "rss_after_bytes": after, "containers": n}


def stream_script(chunks: int) -> str:
    words = ", ".join(f'"w{i:04d} "' for i in range(chunks))
    return f'rules:\n  - match: "^stream"\n    responses:\n      - text: [{words}]\n        delay_ms: 0\n'


def med(values: list[float]) -> float:
    return float(statistics.median(values))


async def run(sizes: Sizes, workdir: Path) -> list[Figure]:
    figures: list[Figure] = []
    t_out = sizes.phase_timeout_s

    with ours(workdir, "turns") as sp:
        async with asyncio.timeout(t_out):
            plan = await capture(sp.url, TURN_CONTENT)
        with baseline(plan, workdir) as base:
            log(f"first-delta latency: {sizes.latency_turns} sequential turns")
            lat, m_lat = await measured(sp.proc.pid, lambda: latency_run(sp.url, sizes.latency_turns,
                                                                         sizes.latency_warmup), t_out)
            async with asyncio.timeout(t_out):
                lat_b = await latency_run(base.url, sizes.latency_turns, sizes.latency_warmup)
            for q, target in ((50, 3.0), (99, 15.0)):
                figures.append(Figure(f"first_delta_p{q}_ms", f"first-delta latency p{q}", "ms",
                                      percentile(lat, q) * 1000, percentile(lat_b, q) * 1000, target, "<=",
                                      details={"turns": sizes.latency_turns, **cpu_details(m_lat)}))

            log(f"concurrent turns: {sizes.concurrent_conns} connections × {sizes.concurrent_rounds} rounds")
            tps, p99, m_cc = await concurrent_turns(sp.url, sp.proc.pid, sizes.concurrent_conns,
                                                    sizes.concurrent_rounds, "cc", t_out)
            tps_b, p99_b, _ = await concurrent_turns(base.url, base.proc.pid, sizes.concurrent_conns,
                                                     sizes.concurrent_rounds, "cc", t_out)
            rounds = {"rounds": sizes.concurrent_rounds, "connections": sizes.concurrent_conns}
            figures.append(Figure("concurrent_turns_per_s", "concurrent turns (100 connections)", "turns/s",
                                  med(tps), med(tps_b), 400, ">=",
                                  details={**rounds, "per_round": [round(x, 1) for x in tps],
                                           **cpu_details(m_cc)}))
            figures.append(Figure("concurrent_turn_p99_ms", "concurrent turn time p99", "ms", med(p99), med(p99_b),
                                  250, "<=", details={**rounds, "per_round": [round(x, 1) for x in p99]}))

            log(f"container + image creation: {sizes.create_pairs} pairs, {sizes.create_inflight} in flight")
            rate, m_cr = await measured(sp.proc.pid, lambda: pair_rate(sp.url, sizes.create_pairs,
                                                                       sizes.create_inflight, "bench-cr"), t_out)
            async with asyncio.timeout(t_out):
                rate_b = await pair_rate(base.url, sizes.create_pairs, sizes.create_inflight, "bench-cr")
            figures.append(Figure("create_pairs_per_s", "container + image creation", "pairs/s", rate, rate_b,
                                  1500, ">=", details={"pairs": sizes.create_pairs,
                                                       "inflight": sizes.create_inflight, **cpu_details(m_cr)}))

    script = workdir / "stream.yaml"
    script.write_text(stream_script(sizes.stream_chunks))
    with ours(workdir, "stream", "--script", str(script)) as sp:
        async with asyncio.timeout(t_out):
            plan = await capture(sp.url, STREAM_CONTENT)
        with baseline(plan, workdir) as base:
            log(f"text_delta frames/s: {sizes.concurrent_conns} connections × {sizes.stream_chunks} chunks")
            rates, m_st = await delta_rate(sp.url, sp.proc.pid, sizes.concurrent_conns, sizes.stream_rounds,
                                           sizes.stream_chunks, "st", t_out)
            rates_b, m_st_b = await delta_rate(base.url, base.proc.pid, sizes.concurrent_conns, sizes.stream_rounds,
                                               sizes.stream_chunks, "st", t_out)
            figures.append(Figure("text_delta_frames_per_s", "text_delta frames/s to 100 connections", "frames/s",
                                  med(rates), med(rates_b), 0.4, ">=", "ratio",
                                  details={"rounds": sizes.stream_rounds, "chunks_per_turn": sizes.stream_chunks,
                                           "per_round": [round(x) for x in rates], **cpu_details(m_st),
                                           "baseline_cpu": cpu_details(m_st_b)}))

    with ours(workdir, "memory") as sp:
        log(f"memory per container: {sizes.memory_containers} containers with one image each")
        per, extra = await asyncio.wait_for(
            memory_per_container(sp.url, sp.proc.pid, sizes.memory_containers, sizes.memory_conns,
                                 sizes.create_inflight), t_out)
        figures.append(Figure("rss_bytes_per_container", "resident memory per container + image", "bytes",
                              per, None, 5 * 1024, "<=", details=extra))
    return figures


# ---- report --------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cores": os.cpu_count(), "cpu": model, "platform": platform.platform(),
            "python": platform.python_version()}


def fmt(v: float | None) -> str:
    if v is None:
        return "—"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def table(figures: list[Figure]) -> str:
    rows = [("figure", "value", "baseline", "ours/baseline", "target", "status")]
    for f in figures:
        target = f"{f.target_op} {fmt(f.target)}" + (f" {f.unit}" if f.target_on == "value" else " (ratio)")
        rows.append((f"{f.label} ({f.unit})", fmt(f.value), fmt(f.baseline),
                     "—" if f.ratio is None else f"{f.ratio:.2f}", target, "met" if f.met else "MISSED"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the small version run by the smoke test")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="avm-bench-") as tmp:

        async def bounded() -> list[Figure]:
            async with asyncio.timeout(sizes.total_timeout_s):
                return await run(sizes, Path(tmp))

        figures = uvloop.run(bounded())
    info = machine()
    result = {"mode": sizes.mode, "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": info, "duration_s": round(time.monotonic() - started, 1),
              "figures": [f.as_dict() for f in figures]}
    print(f"AgentVM benchmarks ({sizes.mode}) — {result['date']} — {info['cores']} cores, {info['cpu']} — "
          f"Python {info['python']} — {info['platform']} — {result['duration_s']} s")
    print(table(figures))
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
