"""Load: 1,000 concurrent WebSocket clients × 10 turns each, and one slow client that stops reading.

    .venv/bin/python -m tests.bench.many_clients [--quick] [--clients N] [--turns N] [--json FILE]

A real `avm serve` (scripted driver, `--flush-ms 0`) and its baseline (tests/bench/baseline_server.py
replaying the frames AgentVM sent for one turn, captured at the start of the run) run as their own
processes; the clients (tests/bench/load.py, like the stock AgentX client: every wrapper unwrapped
and ACKed) run on uvloop in this one. Every client has its own connection, container and image,
and one untimed warm-up turn; then all clients are released together, each running its turns one
after another. Reported, AgentVM next to the baseline: errors (must be 0), first-delta latency p50
and p99 (send → first `text_delta`), turns/s (all turns / release → last `turn_response`), and
the server's peak resident memory (VmRSS sampled every 50 ms during the round, and VmHWM).

Then the same load on AgentVM again, with one more client that subscribes to every client's session
and never reads (a raw socket with a 4 KB receive buffer): the server must close it once its
bounded send queue (`send_queue_max`, 10,000 frames by default) overflows, with close code 1013 and
the reason, while the other clients' p99 and the server's memory stay close to the round without it.

The file-descriptor limit is raised to the hard limit first (both servers inherit it). The small
version (`--quick`: 50 clients × 3 turns, send_queue_max 200 so that the slow client overflows)
runs in `make test` (tests/bench/test_many_clients_smoke.py); it checks that everything is produced
and correct, never how fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import resource
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import uvloop

from agentvm.api.ws_hub import OVERFLOW_REASON
from tests.bench.load import RawConn, close_all, open_many, percentile
from tests.bench.run import (
    OWN_PIDS,
    TURN_CONTENT,
    Measured,
    baseline,
    bench_parser,
    capture,
    fmt,
    log,
    machine,
    measured,
    rss_bytes,
    wait_until_idle,
)
from tests.support.raw_ws import client_frame, open_raw, read_until_close
from tests.support.servers import ServeProcess, start_serve, stop_serve

TRY_AGAIN_LATER = 1013


@dataclass(frozen=True)
class LoadSizes:
    mode: str
    clients: int
    turns: int  # per client
    send_queue_max: int | None  # None: the server's default
    phase_timeout_s: float
    total_timeout_s: float


FULL = LoadSizes("full", clients=1000, turns=10, send_queue_max=None, phase_timeout_s=300, total_timeout_s=900)
QUICK = LoadSizes("quick", clients=50, turns=3, send_queue_max=200, phase_timeout_s=30, total_timeout_s=60)


# ---- resources -----------------------------------------------------------------------------------


def raise_nofile(needed: int) -> tuple[int, int]:
    """Raise this process's open-file limit (inherited by the servers it starts) to at least `needed`,
    up to the hard limit; returns (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        raise RuntimeError(f"the open-file limit is {soft} (hard {hard}); {needed} are needed")
    return soft, hard


def hwm_bytes(pid: int) -> int:
    """Peak resident memory of a process since it started (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("VmHWM not found")


class RssSampler:
    """VmRSS of a process every `interval` seconds while running; its peak."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid, self.interval = pid, interval
        self.before = rss_bytes(pid)
        self.peak = self.before
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss_bytes(self.pid))
            await asyncio.sleep(self.interval)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(OSError):
            self.peak = max(self.peak, rss_bytes(self.pid))


# ---- the load ------------------------------------------------------------------------------------


@dataclass
class Client:
    conn: RawConn
    image_id: str
    session_id: str


@dataclass
class Round:
    first_delta_s: list[float]
    turns: int
    errors: list[str]
    wall_s: float
    rss_before: int
    rss_peak: int
    hwm_after: int
    cpu: Measured = field(default_factory=Measured)

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.wall_s

    def p(self, q: float) -> float:
        return percentile(self.first_delta_s, q) * 1000


async def setup_clients(url: str, n: int, tag: str) -> list[Client]:
    conns = await open_many(url, n)

    async def one(i: int, conn: RawConn) -> Client:
        cid = f"load-{tag}-{i:05d}"
        res = await conn.request("container_create_request", {"containerId": cid})
        if res["data"].get("error"):
            raise RuntimeError(f"container_create failed: {res['data']}")
        res = await conn.request("image_create_request", {"containerId": cid, "config": {}})
        record = res["data"].get("record")
        if not record:
            raise RuntimeError(f"image_create failed: {res['data']}")
        return Client(conn, str(record["imageId"]), str(record["sessionId"]))

    try:
        return list(await asyncio.gather(*(one(i, c) for i, c in enumerate(conns))))
    except BaseException:
        await close_all(conns)
        raise


async def load_round(clients: list[Client], turns: int, pid: int) -> Round:
    """Release every client at once; each runs `turns` turns one after another."""
    release = asyncio.Event()
    first: list[float] = []
    errors: list[str] = []
    done = 0

    async def one(i: int, c: Client) -> None:
        nonlocal done
        await release.wait()
        for t in range(turns):
            try:
                res = await c.conn.turn(c.image_id, TURN_CONTENT)
            except Exception as exc:  # counted, never hidden: the round fails on any error
                errors.append(f"client {i} turn {t}: {type(exc).__name__}: {exc}")
                return
            first.append(res.first_delta_s)
            done += 1

    tasks = [asyncio.create_task(one(i, c)) for i, c in enumerate(clients)]
    await asyncio.sleep(0.1)  # every task is parked on the event
    with RssSampler(pid) as rss:
        t0 = time.perf_counter()
        release.set()
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    return Round(first, done, errors, wall, rss.before, rss.peak, hwm_bytes(pid))


async def warm_up(clients: list[Client]) -> None:
    await asyncio.gather(*(c.conn.turn(c.image_id, TURN_CONTENT) for c in clients))


# ---- the slow client -----------------------------------------------------------------------------


@dataclass
class SlowResult:
    subscribed: int
    frames_read: int  # data frames it found once it read again (what the kernel and transport held)
    close_code: int | None
    close_reason: str | None
    closed_after_s: float | None  # release → the server's "closed a connection that stopped reading"


class SlowClient:
    """A WebSocket client on a raw socket with a 4 KB receive buffer: it completes the handshake,
    subscribes, and reads nothing more until told to."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @classmethod
    async def open(cls, port: int) -> SlowClient:
        return cls(await open_raw(port, rcvbuf=4096))

    async def subscribe(self, session_ids: list[str]) -> None:
        loop = asyncio.get_running_loop()
        for sid in session_ids:
            await loop.sock_sendall(self.sock, client_frame(orjson.dumps({"type": "subscribe",
                                                                          "sessionId": sid}).decode()))

    async def read_to_close(self, timeout: float) -> tuple[int, int | None, str | None]:
        """Read again: (data frames, close code, close reason) up to the close frame or EOF."""
        return await read_until_close(self.sock, timeout)

    def close(self) -> None:
        self.sock.close()


def overflow_closes(log_text: str) -> list[float]:
    """Times (epoch s) of the server's "closed a connection that stopped reading" lines."""
    out = []
    for line in log_text.splitlines():
        if line.startswith("{") and "stopped reading" in line:
            entry = orjson.loads(line)
            if entry.get("msg") == "closed a connection that stopped reading":
                ts = dt.datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
                out.append(ts.timestamp())
    return out


# ---- the run -------------------------------------------------------------------------------------


@contextlib.contextmanager
def agentvm(workdir: Path, sizes: LoadSizes) -> Iterator[ServeProcess]:
    (workdir / "load").mkdir()
    env = {} if sizes.send_queue_max is None else {"AVM_SEND_QUEUE_MAX": str(sizes.send_queue_max)}
    sp = start_serve(workdir / "load" / "data", "--log-level", "WARNING", "--flush-ms", "0", env=env)
    OWN_PIDS.add(sp.proc.pid)
    try:
        yield sp
    finally:
        stop_serve(sp)


def round_details(r: Round) -> dict[str, Any]:
    return {"turns": r.turns, "errors": len(r.errors), "first_errors": r.errors[:5], "wall_s": round(r.wall_s, 2),
            "turns_per_s": round(r.turns_per_s, 1), "first_delta_p50_ms": round(r.p(50), 2) if r.turns else None,
            "first_delta_p99_ms": round(r.p(99), 2) if r.turns else None,
            "first_delta_max_ms": round(max(r.first_delta_s) * 1000, 2) if r.turns else None,
            "rss_before_bytes": r.rss_before, "rss_peak_bytes": r.rss_peak, "vmhwm_after_bytes": r.hwm_after,
            **r.cpu.details()}


async def run(sizes: LoadSizes, workdir: Path) -> dict[str, Any]:
    n, turns, t_out = sizes.clients, sizes.turns, sizes.phase_timeout_s
    out: dict[str, Any] = {}
    with agentvm(workdir, sizes) as sp:
        async with asyncio.timeout(t_out):
            plan = await capture(sp.url, TURN_CONTENT)
        with baseline(plan, workdir) as base:
            rounds: dict[str, Round] = {}
            for name, url, pid in (("agentvm", sp.url, sp.proc.pid), ("baseline", base.url, base.proc.pid)):
                log(f"{name}: {n} clients connect, create a container and an image each, one warm-up turn")
                idle = rss_bytes(pid)
                async with asyncio.timeout(t_out):
                    clients = await setup_clients(url, n, name)
                try:
                    async with asyncio.timeout(t_out):
                        await warm_up(clients)
                    out[f"{name}_rss_idle_bytes"], out[f"{name}_rss_connected_bytes"] = idle, rss_bytes(pid)
                    log(f"{name}: {n} clients × {turns} turns")
                    res, cpu = await measured(pid, lambda c=clients, p=pid: load_round(c, turns, p), t_out)
                    res.cpu = cpu
                    rounds[name] = res
                    if name == "agentvm":
                        log(f"agentvm again, with a slow client subscribed to all {n} sessions that never reads")
                        slow = await SlowClient.open(sp.port)
                        try:
                            await slow.subscribe([c.session_id for c in clients])
                            await asyncio.sleep(0.2)  # the subscriptions are in
                            released = time.time()
                            res, cpu = await measured(pid, lambda c=clients, p=pid: load_round(c, turns, p), t_out)
                            res.cpu = cpu
                            rounds["agentvm_slow"] = res
                            frames, code, reason = await slow.read_to_close(10.0)
                        finally:
                            slow.close()
                        closes = overflow_closes(sp.log())
                        out["slow"] = asdict(SlowResult(n, frames, code, reason,
                                                        round(closes[0] - released, 3) if closes else None))
                finally:
                    await close_all([c.conn for c in clients])
            out["baseline_vmhwm_bytes"] = hwm_bytes(base.proc.pid)
        out["agentvm_vmhwm_bytes"] = hwm_bytes(sp.proc.pid)
    out["rounds"] = {k: round_details(v) for k, v in rounds.items()}
    out["errors"] = sum(len(v.errors) for v in rounds.values())
    return out


# ---- report --------------------------------------------------------------------------------------


def mb(v: float) -> str:
    return f"{v / 1048576:.1f}"


def report(result: dict[str, Any]) -> tuple[str, list[str]]:
    """The table, and the failed checks (errors, the slow client not closed with the reason)."""
    r = result["rounds"]
    a, b, s = r["agentvm"], r["baseline"], r["agentvm_slow"]
    slow = result["slow"]
    n, turns = result["sizes"]["clients"], result["sizes"]["turns"]

    def ratio(x: float | None, y: float | None) -> str:
        return "—" if x is None or not y else f"{x / y:.2f}"

    rows = [("figure", "agentvm", "baseline", "ours/baseline", "with slow client", "slow/without")]
    for label, key, conv in (("errors", "errors", float), ("first-delta p50 (ms)", "first_delta_p50_ms", float),
                             ("first-delta p99 (ms)", "first_delta_p99_ms", float),
                             ("turns/s", "turns_per_s", float)):
        av, bv, sv = conv(a[key] or 0), conv(b[key] or 0), conv(s[key] or 0)
        rows.append((label, fmt(av) if key != "errors" else str(int(av)), fmt(bv) if key != "errors" else str(int(bv)),
                     "—" if key == "errors" else ratio(av, bv), fmt(sv) if key != "errors" else str(int(sv)),
                     "—" if key == "errors" else ratio(sv, av)))
    rows.append(("server peak RSS during the round (MB)", mb(a["rss_peak_bytes"]), mb(b["rss_peak_bytes"]),
                 ratio(a["rss_peak_bytes"], b["rss_peak_bytes"]), mb(s["rss_peak_bytes"]),
                 ratio(s["rss_peak_bytes"], a["rss_peak_bytes"])))
    rows.append(("server RSS growth in the round (MB)", mb(a["rss_peak_bytes"] - a["rss_before_bytes"]),
                 mb(b["rss_peak_bytes"] - b["rss_before_bytes"]), "—",
                 mb(s["rss_peak_bytes"] - s["rss_before_bytes"]), "—"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"server VmHWM (peak since start): agentvm {mb(result['agentvm_vmhwm_bytes'])} MB, "
                 f"baseline {mb(result['baseline_vmhwm_bytes'])} MB")
    per = {k: (result[f"{k}_rss_connected_bytes"] - result[f"{k}_rss_idle_bytes"]) / n for k in ("agentvm", "baseline")}
    lines.append(f"server VmRSS before the clients connected → with {n} clients connected, each with a container, an "
                 f"image and one turn: agentvm {mb(result['agentvm_rss_idle_bytes'])} → "
                 f"{mb(result['agentvm_rss_connected_bytes'])} MB ({per['agentvm'] / 1024:.0f} KB per client), "
                 f"baseline {mb(result['baseline_rss_idle_bytes'])} → {mb(result['baseline_rss_connected_bytes'])} MB "
                 f"({per['baseline'] / 1024:.0f} KB per client)")
    closed = f"{slow['closed_after_s']:.2f} s after the release" if slow["closed_after_s"] is not None else "never"
    lines.append(f"slow client (subscribed to all {slow['subscribed']} sessions, never reading): close code "
                 f"{slow['close_code']} {slow['close_reason']!r}, {closed}; {slow['frames_read']} frames were "
                 f"still in the socket buffers; send_queue_max "
                 f"{result['sizes']['send_queue_max'] or 'default (10,000)'}")
    lines.append(f"{n} clients × {turns} turns; client CPU share agentvm {a['client_cpu_share']:.0%}, baseline "
                 f"{b['client_cpu_share']:.0%}; server CPU share agentvm {a['server_cpu_share']:.0%}, "
                 f"baseline {b['server_cpu_share']:.0%}")
    failed = []
    if result["errors"]:
        first = [e for v in r.values() for e in v["first_errors"]][:3]
        failed.append(f"{result['errors']} errors: {first}")
    for name, v in r.items():
        if v["turns"] != n * turns:
            failed.append(f"{name}: {v['turns']} of {n * turns} turns completed")
    if slow["close_code"] != TRY_AGAIN_LATER or slow["close_reason"] != OVERFLOW_REASON:
        failed.append(f"the slow client was not closed with {TRY_AGAIN_LATER} {OVERFLOW_REASON!r}: {slow}")
    if slow["closed_after_s"] is None:
        failed.append("the server did not log closing the slow client")
    return "\n".join(lines), failed


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("python -m tests.bench.many_clients", __doc__)
    parser.add_argument("--clients", type=int, help="concurrent clients (default 1000, quick 50)")
    parser.add_argument("--turns", type=int, help="turns per client (default 10, quick 3)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    sizes = LoadSizes(**{**asdict(sizes), **({"clients": args.clients} if args.clients else {}),
                         **({"turns": args.turns} if args.turns else {})})
    soft, hard = raise_nofile(2 * sizes.clients + 512)
    info = {**machine(), "nofile": [soft, hard]}
    wait = args.wait_idle if args.wait_idle is not None else (0.0 if args.quick else 120.0)
    if wait > 0:
        info["foreign_cpu_share_at_start"] = round(wait_until_idle(min(wait, 180.0)), 3)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="avm-load-") as tmp:

        async def bounded() -> dict[str, Any]:
            async with asyncio.timeout(sizes.total_timeout_s):
                return await run(sizes, Path(tmp))

        result = uvloop.run(bounded())
    result = {"mode": sizes.mode, "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": info, "sizes": asdict(sizes), "duration_s": round(time.monotonic() - started, 1), **result}
    text, failed = report(result)
    result["failed"] = failed
    print(f"AgentVM load ({sizes.mode}): {sizes.clients} concurrent WebSocket clients × {sizes.turns} turns — "
          f"{result['date']} — {info['cores']} cores, {info['cpu']} — {result['duration_s']} s")
    print(text)
    busy = max(v["foreign_cpu_share"] for v in result["rounds"].values())
    steal = max(v["steal_share"] for v in result["rounds"].values())
    result["max_foreign_cpu_share"], result["max_steal_share"] = busy, steal
    if busy > 0.05:
        print(f"WARNING: other processes used up to {busy:.0%} of a core during a round; the figures are "
              "unreliable. Run again on an idle machine.")
    if steal > 0.1:
        print(f"WARNING: the hypervisor gave up to {steal:.0%} of a core to other guests (steal) during a round; "
              "the figures are noisy.")
    for f in failed:
        print(f"FAILED: {f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
