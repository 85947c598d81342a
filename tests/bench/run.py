"""`make bench`: AgentVM's performance figures, each against a baseline measured in the same run.

    .venv/bin/python -m tests.bench.run [--quick] [--json FILE] [--wait-idle SECONDS]

AgentVM (`avm serve`, scripted offline driver) and the baseline (a bare `websockets` server
replaying frames captured from AgentVM at the start of the run, see baseline_server.py) each run as
their own process; this load client runs on uvloop in a third. Then the Lambda handlers' cold-import
times against `import boto3` (tests/bench/cold_imports.py, also runnable alone). See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
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

from tests.bench import cold_imports
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
    latency_blocks: int  # alternated with the baseline's
    latency_warmup: int
    concurrent_conns: int
    concurrent_rounds: int
    stream_chunks: int
    stream_rounds: int
    create_pairs: int
    create_blocks: int  # alternated with the baseline's
    create_inflight: int
    memory_containers: int
    memory_conns: int
    phase_timeout_s: float
    total_timeout_s: float


FULL = Sizes("full", latency_turns=500, latency_blocks=5, latency_warmup=20, concurrent_conns=100,
             concurrent_rounds=5, stream_chunks=300, stream_rounds=5, create_pairs=5000, create_blocks=5,
             create_inflight=50, memory_containers=10_000, memory_conns=4, phase_timeout_s=180, total_timeout_s=400)
QUICK = Sizes("quick", latency_turns=30, latency_blocks=1, latency_warmup=5, concurrent_conns=100,
              concurrent_rounds=1, stream_chunks=300, stream_rounds=1, create_pairs=200, create_blocks=1,
              create_inflight=50, memory_containers=1000, memory_conns=4, phase_timeout_s=30, total_timeout_s=50)


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
    OWN_PIDS.add(sp.proc.pid)
    try:
        yield sp
    finally:
        stop_serve(sp)


@contextlib.contextmanager
def baseline(plan: dict[str, Any], workdir: Path) -> Iterator[Baseline]:
    b = start_baseline(plan, workdir)
    OWN_PIDS.add(b.proc.pid)
    try:
        yield b
    finally:
        stop_baseline(b)


def process_cpu() -> dict[int, float]:
    """CPU seconds (utime + stime) of every process, by pid."""
    out: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
                out[int(name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def steal_seconds() -> float:
    """CPU time the hypervisor gave to other guests (all cores), from /proc/stat."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


@dataclass
class Measured:
    """Wall time and the CPU seconds spent by the server under test, this client, every other
    process of the machine, and other guests of the hypervisor (steal). A busy machine or host
    makes the figures unreliable."""

    wall_s: float = 0.0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    foreign_cpu_s: float = 0.0
    steal_s: float = 0.0

    def __add__(self, o: Measured) -> Measured:
        return Measured(self.wall_s + o.wall_s, self.server_cpu_s + o.server_cpu_s,
                        self.client_cpu_s + o.client_cpu_s, self.foreign_cpu_s + o.foreign_cpu_s,
                        self.steal_s + o.steal_s)

    def details(self, prefix: str = "") -> dict[str, float]:
        w = self.wall_s or 1.0
        return {f"{prefix}wall_s": round(self.wall_s, 3), f"{prefix}server_cpu_share": round(self.server_cpu_s / w, 3),
                f"{prefix}client_cpu_share": round(self.client_cpu_s / w, 3),
                f"{prefix}foreign_cpu_share": round(self.foreign_cpu_s / w, 3),
                f"{prefix}steal_share": round(self.steal_s / w, 3)}


# Processes of this run (servers under test, baselines): never counted as foreign.
OWN_PIDS: set[int] = {os.getpid()}


async def measured(pid: int, fn: Callable[[], Awaitable[T]], timeout: float) -> tuple[T, Measured]:
    before, steal0 = process_cpu(), steal_seconds()
    c0, w0 = time.process_time(), time.perf_counter()
    async with asyncio.timeout(timeout):
        result = await fn()
    wall, client = time.perf_counter() - w0, time.process_time() - c0
    after, steal = process_cpu(), steal_seconds() - steal0
    foreign = sum(v - before.get(p, 0.0) for p, v in after.items() if p not in OWN_PIDS)
    server = after.get(pid, 0.0) - before.get(pid, 0.0)
    return result, Measured(wall, server, client, max(0.0, foreign), steal)


@dataclass
class Side:
    """One server under test: AgentVM or its baseline."""

    name: str
    url: str
    pid: int


async def alternate(sides: tuple[Side, Side], rounds: int, fn: Callable[[Side, int], Awaitable[T]],
                    timeout: float) -> tuple[list[T], list[T], Measured, Measured]:
    """Run fn round by round, alternating between AgentVM and the baseline so that a slow moment of
    the machine hurts both alike."""
    results: tuple[list[T], list[T]] = ([], [])
    cpu = [Measured(), Measured()]
    for r in range(rounds):
        for i, side in enumerate(sides):
            res, m = await measured(side.pid, functools.partial(fn, side, r), timeout)
            results[i].append(res)
            cpu[i] += m
    return results[0], results[1], cpu[0], cpu[1]


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


async def latency_block(conn: RawConn, image: str, turns: int) -> list[float]:
    """Sequential turns on one connection and one image: send → first text_delta, in seconds."""
    return [(await conn.turn(image, TURN_CONTENT)).first_delta_s for _ in range(turns)]


async def concurrent_round(conns: list[RawConn], tag: str, content: str) -> tuple[float, list[TurnResult]]:
    """Set up one fresh image per connection, then release all turns together; returns the release
    time and the turns."""
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


async def memory_per_container(url: str, pid: int, n: int, conns_n: int, inflight: int
                               ) -> tuple[float, dict[str, Any]]:
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
        t0 = time.perf_counter()
        await asyncio.gather(*(create_pairs(c, k, inflight=inflight, prefix=f"bench-mem{i}")
                               for i, (c, k) in enumerate(zip(conns, share, strict=True))))
        wall = time.perf_counter() - t0
    finally:
        await close_all(conns)
    await asyncio.sleep(1.0)
    after = rss_bytes(pid)
    return (after - before) / n, {"rss_before_bytes": before, "rss_after_bytes": after, "containers": n,
                                  "connections": conns_n, "pairs_per_s": round(n / wall)}


def stream_script(chunks: int) -> str:
    words = ", ".join(f'"w{i:04d} "' for i in range(chunks))
    return f'rules:\n  - match: "^stream"\n    responses:\n      - text: [{words}]\n        delay_ms: 0\n'


def med(values: list[float]) -> float:
    return float(statistics.median(values))


async def turn_figures(sizes: Sizes, sides: tuple[Side, Side]) -> list[Figure]:
    t_out = sizes.phase_timeout_s
    figures: list[Figure] = []

    log(f"first-delta latency: {sizes.latency_turns} sequential turns in {sizes.latency_blocks} blocks")
    per_block = sizes.latency_turns // sizes.latency_blocks
    lat_conns = {s.name: await RawConn.open(s.url) for s in sides}
    try:
        lat_images = {s.name: await lat_conns[s.name].setup_image("bench-latency") for s in sides}
        for s in sides:
            async with asyncio.timeout(t_out):
                await latency_block(lat_conns[s.name], lat_images[s.name], sizes.latency_warmup)
        lat, lat_b, m_lat, m_lat_b = await alternate(
            sides, sizes.latency_blocks, lambda s, _r: latency_block(lat_conns[s.name], lat_images[s.name], per_block),
            t_out)
    finally:
        await close_all(list(lat_conns.values()))
    flat, flat_b = [x for b in lat for x in b], [x for b in lat_b for x in b]
    for q, target in ((50, 3.0), (99, 15.0)):
        figures.append(Figure(f"first_delta_p{q}_ms", f"first-delta latency p{q}", "ms",
                              percentile(flat, q) * 1000, percentile(flat_b, q) * 1000, target, "<=",
                              details={"turns": len(flat), "max_ms": round(max(flat) * 1000, 2),
                                       # The image's history grows by two messages a turn.
                                       f"p{q}_by_block_ms": [round(percentile(b, q) * 1000, 2) for b in lat],
                                       f"baseline_p{q}_by_block_ms": [round(percentile(b, q) * 1000, 2)
                                                                      for b in lat_b],
                                       **m_lat.details(), **m_lat_b.details("baseline_")}))

    n = sizes.concurrent_conns
    log(f"concurrent turns: {n} connections × {sizes.concurrent_rounds} rounds")
    conns = {s.name: await open_many(s.url, n) for s in sides}
    try:
        rounds, rounds_b, m_cc, m_cc_b = await alternate(
            sides, sizes.concurrent_rounds, lambda s, r: concurrent_round(conns[s.name], f"cc{r}", TURN_CONTENT),
            t_out)
    finally:
        for cs in conns.values():
            await close_all(cs)

    def tps(rs: list[tuple[float, list[TurnResult]]]) -> list[float]:
        return [n / (max(x.end_at for x in res) - t0) for t0, res in rs]

    def p99(rs: list[tuple[float, list[TurnResult]]]) -> list[float]:
        return [percentile([x.total_s for x in res], 99) * 1000 for _t0, res in rs]

    common = {"rounds": sizes.concurrent_rounds, "connections": n}
    figures.append(Figure("concurrent_turns_per_s", f"concurrent turns ({n} connections)", "turns/s",
                          med(tps(rounds)), med(tps(rounds_b)), 400, ">=",
                          details={**common, "per_round": [round(x) for x in tps(rounds)],
                                   "baseline_per_round": [round(x) for x in tps(rounds_b)],
                                   "p50_ms": round(med([percentile([x.total_s for x in res], 50) * 1000
                                                        for _t, res in rounds]), 1),
                                   **m_cc.details(), **m_cc_b.details("baseline_")}))
    figures.append(Figure("concurrent_turn_p99_ms", "concurrent turn time p99", "ms", med(p99(rounds)),
                          med(p99(rounds_b)), 250, "<=",
                          details={**common, "per_round": [round(x, 1) for x in p99(rounds)],
                                   "baseline_per_round": [round(x, 1) for x in p99(rounds_b)]}))

    pairs = sizes.create_pairs // sizes.create_blocks
    log(f"container + image creation: {sizes.create_pairs} pairs in {sizes.create_blocks} blocks, "
        f"{sizes.create_inflight} in flight")
    cr_conns = {s.name: await RawConn.open(s.url) for s in sides}
    try:
        for s in sides:
            async with asyncio.timeout(t_out):
                await create_pairs(cr_conns[s.name], min(100, pairs), inflight=sizes.create_inflight,
                                   prefix="bench-cr-warm")
        walls, walls_b, m_cr, m_cr_b = await alternate(
            sides, sizes.create_blocks,
            lambda s, r: create_pairs(cr_conns[s.name], pairs, inflight=sizes.create_inflight, prefix=f"bench-cr{r}"),
            t_out)
    finally:
        await close_all(list(cr_conns.values()))
    figures.append(Figure("create_pairs_per_s", "container + image creation", "pairs/s",
                          pairs * len(walls) / sum(walls), pairs * len(walls_b) / sum(walls_b), 1500, ">=",
                          details={"pairs": pairs * len(walls), "inflight": sizes.create_inflight,
                                   **m_cr.details(), **m_cr_b.details("baseline_")}))
    return figures


async def stream_figure(sizes: Sizes, sides: tuple[Side, Side]) -> Figure:
    n, chunks = sizes.concurrent_conns, sizes.stream_chunks
    log(f"text_delta frames/s: {n} connections × {chunks} chunks × {sizes.stream_rounds} rounds")
    conns = {s.name: await open_many(s.url, n) for s in sides}
    try:
        rounds, rounds_b, m, m_b = await alternate(
            sides, sizes.stream_rounds, lambda s, r: concurrent_round(conns[s.name], f"st{r}", STREAM_CONTENT),
            sizes.phase_timeout_s)
    finally:
        for cs in conns.values():
            await close_all(cs)

    def rates(rs: list[tuple[float, list[TurnResult]]]) -> list[float]:
        out = []
        for _t0, res in rs:
            total = sum(x.deltas for x in res)
            if total != n * chunks:
                raise RuntimeError(f"expected {n * chunks} text_delta frames, got {total}")
            out.append(total / (max(x.end_at for x in res) - min(x.first_delta_at for x in res)))
        return out

    frames = n * chunks * sizes.stream_rounds
    return Figure("text_delta_frames_per_s", f"text_delta frames/s to {n} connections", "frames/s",
                  med(rates(rounds)), med(rates(rounds_b)), 0.4, ">=", "ratio",
                  details={"rounds": sizes.stream_rounds, "chunks_per_turn": chunks,
                           "per_round": [round(x) for x in rates(rounds)],
                           "baseline_per_round": [round(x) for x in rates(rounds_b)],
                           # Server CPU per delivered text_delta (the round's other frames included).
                           "server_cpu_us_per_delta": round(m.server_cpu_s / frames * 1e6, 1),
                           "baseline_server_cpu_us_per_delta": round(m_b.server_cpu_s / frames * 1e6, 1),
                           **m.details(), **m_b.details("baseline_")})


async def run(sizes: Sizes, workdir: Path) -> list[Figure]:
    t_out = sizes.phase_timeout_s
    figures: list[Figure] = []
    with ours(workdir, "turns") as sp:
        async with asyncio.timeout(t_out):
            plan = await capture(sp.url, TURN_CONTENT)
        with baseline(plan, workdir) as base:
            figures += await turn_figures(sizes, (Side("agentvm", sp.url, sp.proc.pid),
                                                  Side("baseline", base.url, base.proc.pid)))

    script = workdir / "stream.yaml"
    script.write_text(stream_script(sizes.stream_chunks))
    with ours(workdir, "stream", "--script", str(script)) as sp:
        async with asyncio.timeout(t_out):
            plan = await capture(sp.url, STREAM_CONTENT)
        with baseline(plan, workdir) as base:
            figures.append(await stream_figure(sizes, (Side("agentvm", sp.url, sp.proc.pid),
                                                       Side("baseline", base.url, base.proc.pid))))

    with ours(workdir, "memory") as sp:
        log(f"memory per container: {sizes.memory_containers} containers with one image each")
        async with asyncio.timeout(t_out):
            per, extra = await memory_per_container(sp.url, sp.proc.pid, sizes.memory_containers,
                                                    sizes.memory_conns, sizes.create_inflight)
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
            "python": platform.python_version(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}


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


def wait_until_idle(limit_s: float) -> float:
    """Wait (at most limit_s) until the rest of the machine uses under 15% of a core; returns that share."""
    deadline = time.monotonic() + limit_s
    share = 0.0
    for _ in range(int(limit_s) + 2):
        before = process_cpu()
        time.sleep(1.0)
        after = process_cpu()
        share = sum(v - before.get(p, 0.0) for p, v in after.items() if p not in OWN_PIDS)
        if share < 0.15 or time.monotonic() >= deadline:
            break
        log(f"waiting for an idle machine: other processes use {share:.0%} of a core")
    return share


def bench_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """The options every load benchmark takes: --quick, --json, --wait-idle."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the small version run by the smoke test")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--wait-idle", type=float, metavar="SECONDS",
                        help="first wait up to this long (at most 180) for other processes to go quiet "
                             "(default: 120, quick: 0)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = bench_parser("python -m tests.bench.run", __doc__).parse_args(argv)
    sizes = QUICK if args.quick else FULL
    wait = args.wait_idle if args.wait_idle is not None else (0.0 if args.quick else 120.0)
    info = machine()
    if wait > 0:
        info["foreign_cpu_share_at_start"] = round(wait_until_idle(min(wait, 180.0)), 3)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="avm-bench-") as tmp:

        async def bounded() -> list[Figure]:
            async with asyncio.timeout(sizes.total_timeout_s):
                return await run(sizes, Path(tmp))

        figures = uvloop.run(bounded())
    result = {"mode": sizes.mode, "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": info, "duration_s": round(time.monotonic() - started, 1),
              "figures": [f.as_dict() for f in figures]}
    print(f"AgentVM benchmarks ({sizes.mode}) — {result['date']} — {info['cores']} cores, {info['cpu']} — "
          f"Python {info['python']} — {info['platform']} — {result['duration_s']} s")
    print(table(figures))
    busy = max((v for f in figures for k, v in f.details.items() if k.endswith("foreign_cpu_share")), default=0.0)
    steal = max((v for f in figures for k, v in f.details.items() if k.endswith("steal_share")), default=0.0)
    result["max_foreign_cpu_share"], result["max_steal_share"] = busy, steal
    if busy > 0.05:
        print(f"WARNING: other processes used up to {busy:.0%} of a core during a measurement; "
              "the figures are unreliable. Run again on an idle machine.")
    if steal > 0.1:
        print(f"WARNING: the hypervisor gave up to {steal:.0%} of a core to other guests (steal) during a "
              "measurement; the figures are noisy.")
    cold, cold_text, cold_failed = cold_imports.report(args.quick)
    result["cold_imports"] = cold
    print()
    print(cold_text)
    for failure in cold_failed:
        print(f"FAILED: {failure}")
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 1 if cold_failed else 0


if __name__ == "__main__":
    sys.exit(main())
