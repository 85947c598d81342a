"""The turn host under the bench: `python -m agentvm.turnhost` as it runs in production, plus
counters (tests/bench/turn_host.py starts it as a process of its own).

    python -m tests.bench.host_process OUT.jsonl

It installs `tests.bench.aws_calls.CallCounter` on botocore's default session (every adapter
client of the host comes from it), then runs the real entry point (`agentvm.turnhost.__main__`).
Each SIGUSR1 appends one snapshot line to OUT (cumulative: AWS call counts, the process's CPU
seconds, CPU seconds at the first turn request it received, current and peak RSS, the host's
counts); the drain at exit appends the last one. The bench takes differences of snapshots, so
start-up (interpreter, imports, service models) is never in a per-turn figure.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.bench.aws_calls import CallCounter


def _rss_mb() -> float:
    import os

    with open("/proc/self/statm") as f:
        return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def _peak_rss_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


class BytesOut:
    """Bytes posted to WebSocket connections (the `Data` of PostToConnection), while `enabled`."""

    def __init__(self, counter: CallCounter) -> None:
        self.counter = counter
        self.bytes = 0

    def install(self, session: Any) -> None:
        session.register("before-parameter-build.apigatewaymanagementapi.PostToConnection", self._post)

    def _post(self, **kwargs: Any) -> None:
        if self.counter.enabled:
            self.bytes += len(kwargs["params"]["Data"])


class Probe:
    """What the host process did so far (the AWS calls, its CPU and memory, its TurnHost's counts)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.counter = CallCounter()
        self.bytes_out = BytesOut(self.counter)
        self.sqs = Counter[str]()  # ReceiveMessage calls with messages / empty; the host's registry writes
        self.first_turn_cpu_s: float | None = None
        self.pool = Counter[str]()  # botocore_async's thread pool: calls, queued, max_in_flight, threads
        self.host: Any = None
        self.front: Any = None  # agentvm.turnhost.__main__.Front, with AVM_TURN_HOST_WS_PORT
        self._lock = threading.Lock()

    def install(self) -> None:
        from agentvm.adapters.aws.botocore_async import default_session
        from agentvm.domain.turn_hosts import TurnRequest
        from agentvm.turnhost import __main__ as entry
        from agentvm.turnhost.host import TurnHost

        session = default_session()
        self.counter.install(session)
        self.bytes_out.install(session)
        session.register("after-call.sqs.ReceiveMessage", self._received)
        for op in ("PutItem", "DeleteItem"):
            session.register(f"before-parameter-build.dynamodb.{op}", self._registry)
        self.counter.enabled = True
        build, take = entry.build, TurnHost._take
        probe = self

        def build_and_keep(*args: Any, **kwargs: Any) -> TurnHost:
            host = build(*args, **kwargs)
            probe.host = host
            return host

        def take_and_note(host: TurnHost, request: TurnRequest) -> None:
            if probe.first_turn_cpu_s is None:
                probe.first_turn_cpu_s = time.process_time()
            take(host, request)

        front_init = entry.Front.__init__

        def front_and_keep(front: Any, *args: Any, **kwargs: Any) -> None:
            front_init(front, *args, **kwargs)
            probe.front = front

        entry.Front.__init__ = front_and_keep  # type: ignore[method-assign]
        self._watch_pool()
        entry.build = build_and_keep
        TurnHost._take = take_and_note  # type: ignore[method-assign,assignment]
        signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=self.snapshot, daemon=True).start())

    def _watch_pool(self) -> None:
        """How many AWS calls wait for one of botocore_async's threads (all busy)."""
        from agentvm.adapters.aws import botocore_async

        pool = botocore_async._POOL
        size, submit, pending = pool._max_workers, pool.submit, [0]

        def counted(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                pending[0] += 1
                self.pool["calls"] += 1
                self.pool["queued"] += pending[0] > size
                self.pool["max_in_flight"] = max(self.pool["max_in_flight"], pending[0])
            future = submit(fn, *args, **kwargs)
            future.add_done_callback(lambda _: self._done(pending))
            return future

        self.pool["threads"] = size
        pool.submit = counted  # type: ignore[method-assign]

    def _done(self, pending: list[int]) -> None:
        with self._lock:
            pending[0] -= 1

    def _received(self, **kwargs: Any) -> None:
        parsed = kwargs["parsed"]
        self.sqs["with_messages" if parsed.get("Messages") else "empty"] += 1

    def _registry(self, **kwargs: Any) -> None:
        params = kwargs["params"]
        key = params.get("Item") or params.get("Key") or {}
        if self.counter.enabled and key.get("PK", {}).get("S") == "TURNHOST":
            self.sqs["registry_writes"] += 1  # heartbeats: per host-second, not per turn

    def snapshot(self, final: bool = False) -> None:
        c = self.counter.counts
        with c.lock:
            calls = c.as_json({}, inbound=0)
        calls["bytes_out"] = self.bytes_out.bytes
        host, front = self.host, self.front
        line = {"final": final, "wall_s": time.monotonic(), "cpu_s": time.process_time(),
                "first_turn_cpu_s": self.first_turn_cpu_s, "rss_mb": _rss_mb(), "peak_rss_mb": _peak_rss_mb(),
                "calls": calls, "receives": dict(self.sqs), "pool": dict(self.pool),
                "host": None if host is None else {
                    "received": host.counts.received, "taken": host.counts.taken, "joined": host.counts.joined,
                    "refused": host.counts.refused, "turns": host.counts.turns,
                    "by_reason": dict(host.counts.by_reason), "running": len(host.running),
                    "vcpus": host.cpu.vcpus, "cpu_fraction": round(host.cpu.fraction(), 4),
                    "local": host.counts.local},
                "front": None if front is None else {
                    "frames_out": front.sockets.frames_out, "bytes_out": front.sockets.bytes_out,
                    **front.app.counts, **{f"peer_{k}": v for k, v in front.peers.counts.items()}}}
        with self._lock, self.out.open("a") as f:
            f.write(json.dumps(line) + "\n")


def main(argv: list[str]) -> int:
    probe = Probe(Path(argv[0]))
    probe.install()
    from agentvm.turnhost.__main__ import main as host_main

    try:
        return host_main()
    finally:
        probe.snapshot(final=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
