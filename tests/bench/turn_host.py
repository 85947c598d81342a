"""The turn-host tier measured: AWS calls, CPU and memory per pure-chat turn on one host.

    .venv/bin/python -m tests.bench.turn_host [--quick] [--sessions K] [--lengths 1,20,100] [--json FILE]

One turn host runs as a real process (`tests.bench.host_process`: `python -m agentvm.turnhost` with
counters) against the emulated API Gateway edge and an in-process moto (DynamoDB, SQS, the
management API); `ws_default` runs in the edge with the tiered dispatcher. For each conversation
length L, K sessions (stock clients) first run L-1 instant turns, then all K send at once the
counted turn: a reply of 100 text deltas over 10 s (quick: 1 s), priced model. K is 20 (quick 5)
at length 1, where the host's CPU, memory and concurrency figures come from, and 3 (`--long-sessions`)
at the longer lengths, whose earlier turns are run one by one through the edge. Every turn must run
on the host (no `chat_turn` invocation, nothing refused): the bench fails otherwise.

Per counted turn it reports the COUNTS of tests/bench/aws_calls.py (both sides: `ws_default` in
this process, the host in its own), the host's CPU ms per turn (process CPU time over the counted
window, start-up excluded: a warm-up turn runs before anything is counted), its peak RSS, the CPU
fraction it used at K concurrent turns, and how many concurrent turns a host of `--vcpu` (0.5)
holds at 70 % CPU: floor(0.7 × vcpu × turn_seconds × 1000 / cpu_ms_per_turn).

The host's registry heartbeats and its idle queue receives are per host-second, not per turn: they
are reported apart (`host.background`) and left out of the per-turn counts. moto serves one
request at a time, so the host short-polls (AVM_TURN_HOST_POLL_S=0; production long-polls 20 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.bench.aws_calls import (  # the same script, model and coalescing as the Lambda tier's counts
    DELTA_GAP_MS,
    DELTAS,
    FLUSH_MS,
    LONG,
    MAX_FLUSH_MS,
    MODEL,
    SHORT,
    CallCounter,
    _environment,
    _script,
)
from tests.bench.host_process import BytesOut

REPO = Path(__file__).resolve().parents[2]
VCPU = 0.5
MEMORY_MB = 1024
MAX_CPU = 0.7
IDLE_S = 2.0


def _sub(a: Any, b: Any) -> Any:
    """a - b for the counts' numbers and nested dicts (lists: what `a` has beyond `b`)."""
    if isinstance(a, list):
        return a[len(b or []):]
    if isinstance(a, Mapping):
        keys = set(a) | set(b or {})
        return {k: _sub(a.get(k, 0), (b or {}).get(k, 0)) for k in sorted(keys)}
    return a - (b or 0)


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, list) or isinstance(b, list):
        return [*(a or []), *(b or [])]
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        a, b = a or {}, b or {}
        return {k: _add(a.get(k, 0), b.get(k, 0)) for k in sorted(set(a) | set(b))}
    return a + b


def _per(value: Any, n: int) -> Any:
    """Per turn: numbers divided, request lists (the aws_calls --detail lines) left out."""
    if isinstance(value, Mapping):
        return {k: _per(v, n) for k, v in value.items() if not isinstance(v, list)}
    return round(value / n, 2)


class HostProcess:
    """tests.bench.host_process in a process of its own; `snapshot()` asks it for its counts."""

    def __init__(self, env: Mapping[str, str], tmp: Path) -> None:
        self.out = tmp / f"host-{uuid.uuid4().hex[:6]}.jsonl"
        self.log = open(tmp / "host.log", "wb+")  # noqa: SIM115 - closed in stop()
        full = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(
            str(REPO / p) for p in ("shared", "local", "client", "."))}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.bench.host_process", str(self.out)], cwd=REPO,
                                     env=full, stdout=self.log, stderr=subprocess.STDOUT)

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.read_text().splitlines()] if self.out.exists() else []

    async def snapshot(self) -> dict[str, Any]:
        before = len(self.lines())
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while len(self.lines()) <= before:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the host gave no snapshot:\n{self.text()}")
            await asyncio.sleep(0.02)
        return self.lines()[-1]

    def text(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    async def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.to_thread(self.proc.wait, 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.log.close()
        return code


async def _registered(store: Any, host: HostProcess, cache_s: float) -> None:
    from agentvm.adapters.aws.dynamodb_turn_hosts import DynamoDBTurnHosts
    from agentvm.ids import now_ms

    hosts = DynamoDBTurnHosts(store)
    deadline = time.monotonic() + 60
    while not any(h.takes_turns(now_ms()) for h in await hosts.list_hosts()):
        if host.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the turn host did not register:\n{host.text()}")
        await asyncio.sleep(0.05)
    await asyncio.sleep(cache_s + 0.1)  # every ws_default environment's directory cache has lapsed


async def _conversation(url: str, length: int, timeout: float) -> tuple[Any, dict[str, Any]]:
    """A client with a session that has had `length - 1` instant turns."""
    from tests.support.stock_client import StockClient

    client = await StockClient(url, ack=False).__aenter__()
    image = await client.new_image(f"c-{uuid.uuid4().hex[:6]}", model=MODEL)
    for _ in range(length - 1):
        await client.turn(image["imageId"], SHORT, timeout=timeout)  # instant
    return client, image


async def measure(length: int, sessions: int, *, edge: Any, store: Any, host: HostProcess, counter: CallCounter,
                  bytes_out: BytesOut, scale: float, idle_cpu_per_s: float, url: str | None = None) -> dict[str, Any]:
    """K sessions of `length - 1` earlier turns, then their counted turns all at once. `url`: the
    host's own WebSocket front (`--front`) instead of the emulated API Gateway edge."""
    turn_s = DELTAS * DELTA_GAP_MS * scale / 1000
    timeout = 60 + 6 * turn_s
    made = await asyncio.gather(*(_conversation(url or edge.url, length, timeout) for _ in range(sessions)))
    try:
        await edge.settle(include_invokes=True, timeout=60)
        invocations = len(edge.invocations)
        before = await host.snapshot()
        counter.reset()
        bytes_out.bytes = 0
        counter.enabled = True
        started = time.monotonic()
        await asyncio.gather(*(c.turn(image["imageId"], f"{LONG}: a long answer please", timeout=timeout)
                               for c, image in made))
        await edge.settle(include_invokes=True, timeout=60)
        wall_s = time.monotonic() - started
        if wall_s < 0.9 * turn_s:  # the script's long reply streams DELTAS deltas over turn_s
            raise AssertionError(f"the counted turns took {wall_s:.2f} s, not the {turn_s:.2f} s of a long reply")
        counter.enabled = False
        after = await host.snapshot()
        invoked = Counter(label for label, _ in edge.invocations[invocations:])
    finally:
        for c, _ in made:
            await c.close()
    bench_side = counter.reset().as_json(dict(invoked), inbound=invoked.get("ws_default", 0))
    bench_side["bytes_out"] = bytes_out.bytes
    host_side = _sub(after["calls"], before["calls"])
    receives = _sub(after["receives"], before["receives"])
    ran = _sub(after["host"], before["host"])
    for _, image in made:
        turns = await store.list_turns("bench", image["sessionId"])
        assert [t.status for t in turns] == ["completed"] * length, turns
    if invoked.get("chat_turn") or ran["refused"] or ran["taken"] != sessions:
        raise AssertionError(f"not every counted turn ran on the host: chat_turn {invoked.get('chat_turn', 0)}, "
                             f"host took {ran['taken']} of {sessions}, refused {ran['refused']}")
    total = _add(bench_side, host_side)
    # the host's registry heartbeats and idle receives are per host-second (host.background)
    total["sqs_requests"] -= receives.get("empty", 0)  # SQS calls are counted apart (aws_calls.Counts.sqs)
    other = dict(total["other_calls"])
    registry = receives.get("registry_writes", 0)
    total["ddb_write_requests"] -= registry
    total["ddb_write_units"] -= registry
    total["other_calls"] = {k: v for k, v in other.items() if v}
    if after.get("front") is not None:  # the frames went over the host's own sockets, not API Gateway
        front = _sub(after["front"], before["front"])
        total["bytes_out"] = total.get("bytes_out", 0) + front["bytes_out"]
    per = _per({k: v for k, v in total.items() if k not in ("lambda_invocations", "inbound_frames")}, sessions)
    if after.get("front") is not None:
        per["front"] = _per(front, sessions)
        per["local_runs"] = round((after["host"]["local"] - before["host"]["local"]) / sessions, 2)
    host_wall_s = after["wall_s"] - before["wall_s"]
    # the host's idle cost (moto's short polls every 50 ms, heartbeats, the CPU sampler) is per second
    gross_s = after["cpu_s"] - before["cpu_s"]
    cpu_s = max(0.0, gross_s - idle_cpu_per_s * host_wall_s)
    return {**per, "lambda_invocations": _per(dict(invoked), sessions),
            "inbound_frames": round(invoked.get("ws_default", 0) / sessions, 2),
            "turn_seconds": round(wall_s, 2), "sessions": sessions,
            "cpu_ms_per_turn": round(cpu_s * 1000 / sessions, 1),
            "cpu_ms_per_turn_gross": round(gross_s * 1000 / sessions, 1),
            "host_cpu_fraction_of_one_core": round(gross_s / host_wall_s, 3),
            "host_side": {k: _per(host_side[k], sessions) for k in (
                "ddb_write_requests", "ddb_write_units", "ddb_read_requests", "ddb_read_units", "post_to_connection")},
            "host_rss_mb": after["rss_mb"], "host_peak_rss_mb": after["peak_rss_mb"],
            "aws_pool": {"calls": after["pool"].get("calls", 0) - before["pool"].get("calls", 0),
                         "queued": after["pool"].get("queued", 0) - before["pool"].get("queued", 0),
                         "max_in_flight": after["pool"].get("max_in_flight", 0),
                         "threads": after["pool"].get("threads", 0)},
            "background": {"registry_writes": registry, "empty_receives": receives.get("empty", 0),
                           "window_s": round(host_wall_s, 2)}}


async def bench(quick: bool, sessions: int, lengths: list[int], *, endpoint: str, tmp: Path,
                heartbeat_s: float, long_sessions: int, front: bool = False) -> dict[str, Any]:
    from agentvm.adapters.aws.botocore_async import default_session
    from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
    from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
    from agentvm.auth.api_keys import new_key
    from agentvm.hosting.turn_tiers import DIRECTORY_CACHE_S
    from tests.support.cloud_edge import cloud_edge
    from tests.support.turn_hosts import create_queue

    scale = 0.1 if quick else 1.0
    script = tmp / "script.json"
    _script(script, DELTA_GAP_MS * scale)
    table = f"bench-{uuid.uuid4().hex[:12]}"
    store = DynamoDBStore(table, endpoint_url=endpoint, region_name="us-east-1")
    await store.open()
    await store.create_table()
    key, token = new_key("bench")
    await DynamoDBKeys(store).put_key(key)
    env = {"AVM_CHAT_TURN_FUNCTION": "agentvm-chat-turn:live", "AVM_RELIABLE_WRAPPER": "false",
           "AVM_SCRIPT_PATH": str(script), "AVM_STREAM_FLUSH_MS": str(round(FLUSH_MS * scale)),
           "AVM_STREAM_MAX_FLUSH_MS": str(round(MAX_FLUSH_MS * scale)),
           "AVM_TURN_QUEUE_URL": create_queue(endpoint), "AVM_TURN_HOST_POLL_S": "0",
           "AVM_TURN_HOST_HEARTBEAT_S": str(heartbeat_s), "AVM_TURN_HOST_VCPU": str(VCPU),
           "AVM_LOG_LEVEL": "WARNING"}
    url = None
    if front:
        from urllib.parse import quote

        from tests.support.servers import free_port

        ws_port = free_port()
        env.update(AVM_TURN_HOST_WS_PORT=str(ws_port), AVM_TURN_HOST_PEER_PORT=str(free_port()),
                   AVM_TURN_HOST_ADDRESS="127.0.0.1")
        url = f"ws://127.0.0.1:{ws_port}/?token={quote(token, safe='')}"
    counter = CallCounter()
    counter.install(default_session())
    bytes_out = BytesOut(counter)
    bytes_out.install(default_session())
    results: dict[str, Any] = {}
    try:
        async with cloud_edge(moto_endpoint=endpoint, token=token, table_name=table) as edge:
            env.update(edge.handler_env())
            with _environment(**env):
                host = HostProcess(env, tmp)
                try:
                    await _registered(store, host, DIRECTORY_CACHE_S)
                    started = await host.snapshot()
                    await measure(1, 1, edge=edge, store=store, host=host, counter=counter,  # a warm-up turn
                                  bytes_out=bytes_out, scale=scale, idle_cpu_per_s=0.0, url=url)
                    idle = await host.snapshot()
                    await asyncio.sleep(IDLE_S)
                    idle_cpu_per_s = ((await host.snapshot())["cpu_s"] - idle["cpu_s"]) / IDLE_S
                    for length in lengths:
                        k = sessions if length == 1 else min(sessions, long_sessions)
                        results[str(length)] = await measure(length, k, edge=edge, store=store, host=host,
                                                             counter=counter, bytes_out=bytes_out, scale=scale,
                                                             idle_cpu_per_s=idle_cpu_per_s, url=url)
                finally:
                    code = await host.stop()
                if code != 0:
                    raise RuntimeError(f"the turn host exited {code}:\n{host.text()}")
                final = host.lines()[-1]
    finally:
        await store.close()
    return summarise(quick, sessions, results, final, started, idle_cpu_per_s)


def summarise(quick: bool, sessions: int, results: Mapping[str, Any], final: Mapping[str, Any],
              started: Mapping[str, Any], idle_cpu_per_s: float) -> dict[str, Any]:
    main = max(results.values(), key=lambda r: r["sessions"])  # the most concurrent turns: the host's figures
    cpu_ms = main["cpu_ms_per_turn"]
    turn_s = DELTAS * DELTA_GAP_MS / 1000  # production's turn: the quick run's CPU is per turn too
    host_keys = ("cpu_ms_per_turn", "cpu_ms_per_turn_gross", "host_side", "host_cpu_fraction_of_one_core",
                 "host_rss_mb", "host_peak_rss_mb", "aws_pool", "background", "sessions")
    scale = 0.1 if quick else 1.0
    return {"mode": "quick" if quick else "full", "deltas": DELTAS, "delta_gap_ms": DELTA_GAP_MS * scale,
            "time_scale": scale, "model": MODEL,
            "host": {"vcpu": VCPU, "memory_mb": MEMORY_MB, "cpu_ms_per_turn": cpu_ms,
                     "concurrent_turns_at_70pct": math.floor(MAX_CPU * VCPU * turn_s * 1000 / cpu_ms),
                     "peak_rss_mb": final["peak_rss_mb"], "sessions": main["sessions"],
                     "cpu_fraction_at_k": round(main["host_cpu_fraction_of_one_core"] / VCPU, 3),
                     # start-up (interpreter, imports, runtime) until registered, and the CPU meter then
                     "startup_cpu_ms": round(started["cpu_s"] * 1000),
                     "cpu_meter_after_start": started["host"]["cpu_fraction"],
                     "idle_cpu_ms_per_s": round(idle_cpu_per_s * 1000, 1),
                     "by_length": {k: {h: r[h] for h in host_keys} for k, r in results.items()}},
            "tiers": {"host": {k: {c: v for c, v in r.items() if c not in host_keys} for k, r in results.items()}}}


def run(quick: bool, sessions: int, lengths: list[int], heartbeat_s: float, long_sessions: int,
        front: bool = False) -> dict[str, Any]:
    from moto.server import ThreadedMotoServer

    from tests.aws_fixtures import _OneAtATime, exact_moto_numbers

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    exact_moto_numbers()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    assert server._server is not None
    server._server.app = _OneAtATime(server._server.app)  # DynamoDB's atomic updates (the spend counter)
    host, port = server.get_host_and_port()
    try:
        with tempfile.TemporaryDirectory() as tmp, _environment(
                AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true"):
            return asyncio.run(bench(quick, sessions, lengths, endpoint=f"http://{host}:{port}", tmp=Path(tmp),
                                     heartbeat_s=heartbeat_s, long_sessions=long_sessions, front=front))
    finally:
        server.stop()


def report(data: Mapping[str, Any]) -> str:
    h = data["host"]
    rows = [("length", "posts", "WCU", "write req", "RCU", "read req", "sqs", "bytes out", "cpu ms", "turn s")]
    for length, c in data["tiers"]["host"].items():
        rows.append((length, str(c["post_to_connection"]), str(c["ddb_write_units"]), str(c["ddb_write_requests"]),
                     str(c["ddb_read_units"]), str(c["ddb_read_requests"]), str(c["sqs_requests"]),
                     str(c.get("bytes_out", "-")), str(h["by_length"][length]["cpu_ms_per_turn"]),
                     str(c["turn_seconds"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(col.rjust(w) for col, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([
        f"Per turn on one turn host ({h['sessions']} sessions at once, {data['deltas']} deltas "
        f"{data['delta_gap_ms']} ms apart, {data['model']}):", *lines,
        f"CPU {h['cpu_ms_per_turn']} ms per turn; peak RSS {h['peak_rss_mb']} MB; at {h['sessions']} concurrent "
        f"turns the host used {h['cpu_fraction_at_k']:.1%} of {h['vcpu']} vCPU; a {h['vcpu']} vCPU host holds "
        f"{h['concurrent_turns_at_70pct']} concurrent turns at {MAX_CPU:.0%} CPU"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="time ÷ 10, fewer sessions (make test)")
    parser.add_argument("--sessions", type=int, help="concurrent sessions (default 20; quick 5)")
    parser.add_argument("--lengths", help="conversation lengths (default 1,20,100; quick 1,2,3)")
    parser.add_argument("--long-sessions", type=int, default=3,
                        help="sessions at conversation lengths above 1 (their earlier turns take a while)")
    parser.add_argument("--heartbeat-s", type=float, default=10.0, help="AVM_TURN_HOST_HEARTBEAT_S")
    parser.add_argument("--front", action="store_true",
                        help="clients on the host's own WebSocket front (AVM_TURN_HOST_WS_PORT), not API Gateway")
    parser.add_argument("--json", type=Path, help="write the figures here (the host tier's part of aws-calls.json)")
    parser.add_argument("--into", type=Path, help="add them to this counts file of tests.bench.aws_calls "
                                                  "(its `host` and `tiers.host`), the cost model's input")
    args = parser.parse_args(argv)
    sessions = args.sessions or (5 if args.quick else 20)
    lengths = [int(x) for x in (args.lengths or ("1,2,3" if args.quick else "1,20,100")).split(",")]
    long_sessions = sessions if args.quick else args.long_sessions
    data = run(args.quick, sessions, lengths, args.heartbeat_s, long_sessions, front=args.front)
    print(report(data))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    if args.into is not None:
        counts = json.loads(args.into.read_text())
        counts["host"] = data["host"]
        counts.setdefault("tiers", {})["host"] = data["tiers"]["host"]
        # a batched client's frames come from the same fan-out code on both tiers: the Lambda tier's count
        batched = {m["frames_per_client"].get("batched") for m in counts["tiers"].get("lambda", {}).values()}
        for m in data["tiers"]["host"].values():
            if len(batched) == 1 and None not in batched:
                m["frames_per_client"]["batched"] = next(iter(batched))
        args.into.write_text(json.dumps(counts, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
