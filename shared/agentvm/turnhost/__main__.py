"""`python -m agentvm.turnhost`: the turn host's entry point and composition root, over the cloud
one (`CloudRuntime`). The task definition's environment configures it as it does the functions,
plus AVM_TURN_QUEUE_URL and the AVM_TURN_HOST_* settings (docs/configuration.md).

Exit codes: 0 after a drain (SIGTERM or SIGINT), 2 when a setting is bad or missing (one line on
stderr: a task that would never get better by being restarted), 1 when the drain ran out of time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Sequence

from pydantic import ValidationError

from agentvm.cloud.observability import Count, InvocationMetrics, record_turns
from agentvm.cloud.runtime import CloudRuntime
from agentvm.config import Settings
from agentvm.domain.models import Turn
from agentvm.domain.turn_hosts import TurnHostRecord, TurnRequest
from agentvm.logs import setup_logging
from agentvm.turnhost.cpu import CpuMeter, available_vcpus
from agentvm.turnhost.host import HostOptions, TurnHost

log = logging.getLogger("agentvm.turnhost")

METRICS_FLUSH_S = 60.0
METRICS_FLUSH_RUNS = 50


#: The sessions one host runs, written once per heartbeat. Its only dimensions are fixed
#: (function=turn_host, service): every host writes the same metric (a host id would make each task
#: its own billed metric), so CloudWatch's Maximum over a period is the busiest host's count and
#: Sum / SampleCount the mean per host. The service scales in on it, not on CPU (a host running 30
#: turns uses a few % of its CPU: a CPU alarm would stop it and cycle its turns onto new tasks).
RUNNING_METRIC = "HostRunningTurns"


class Metrics:
    """The turn metrics of many session runs, written as EMF every minute (or 50 runs), not per run;
    the host's running sessions at every heartbeat."""

    def __init__(self) -> None:
        self.pending = InvocationMetrics("turn_host")
        self.runs = 0
        self.flushed_at = asyncio.get_running_loop().time()

    def add(self, turns: Sequence[Turn]) -> None:
        record_turns(self.pending.add, turns)
        self.runs += 1
        if self.runs >= METRICS_FLUSH_RUNS or asyncio.get_running_loop().time() - self.flushed_at >= METRICS_FLUSH_S:
            self.flush()

    def beat(self, record: TurnHostRecord) -> None:
        running = InvocationMetrics("turn_host")
        running.add(RUNNING_METRIC, Count, record.running)
        try:
            running.flush()
        except Exception:  # metrics never stop the host
            log.exception("metrics flush failed")

    def flush(self) -> None:
        try:
            if self.pending:
                self.pending.flush()
        except Exception:  # metrics never stop the host
            log.exception("metrics flush failed")
        self.runs, self.flushed_at = 0, asyncio.get_running_loop().time()


def _peak_rss_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def host_id() -> str:
    """The ECS task id when there is one (the last part of the metadata URI), else a random id."""
    base = os.environ.get("ECS_CONTAINER_METADATA_URI_V4", "")
    task = base.rstrip("/").rsplit("/", 1)[-1][:40] if base else ""
    return f"host-{task or uuid.uuid4().hex}"


def build(rt: CloudRuntime, *, metrics: Metrics | None = None, name: str | None = None) -> TurnHost:
    """The turn host over a runtime's clients (also the tests' in-process host)."""
    s = rt.settings

    async def run_session(tenant_id: str, session_id: str) -> Sequence[Turn]:
        return await rt.run_session(tenant_id, session_id, role="turn_host")

    def on_run(request: TurnRequest, turns: Sequence[Turn], seconds: float) -> None:
        log.info("session run", extra={"session_id": request.session_id, "turns": len(turns),
                                       "ms": int(seconds * 1000)})
        if metrics is not None:
            metrics.add(turns)

    vcpus = s.turn_host_vcpu or available_vcpus()
    return TurnHost(name or host_id(), queue=rt.turn_queue, directory=rt.turn_hosts, fallback=rt.lambda_dispatcher,
                    run_session=run_session, cpu=CpuMeter(vcpus), on_run=on_run,
                    on_beat=None if metrics is None else metrics.beat,
                    options=HostOptions(capacity=s.turn_host_capacity, max_cpu=s.turn_host_max_cpu,
                                        heartbeat_s=s.turn_host_heartbeat_s, poll_s=s.turn_host_poll_s,
                                        drain_s=s.turn_host_drain_s))


def check(settings: Settings) -> None:
    missing = [name for name, value in (("AVM_TABLE_NAME", settings.table_name),
                                        ("AVM_TURN_QUEUE_URL", settings.turn_queue_url),
                                        ("AVM_CHAT_TURN_FUNCTION", settings.chat_turn_function),
                                        ("AVM_WS_ENDPOINT", settings.ws_endpoint)) if not value]
    if missing:
        raise SystemExit(f"{', '.join(missing)} must be set: the turn host needs its table, queue, "
                         "fallback function and WebSocket endpoint")


async def serve(settings: Settings) -> bool:
    rt = await CloudRuntime(settings).ready()
    await rt.driver()  # the LLM key is read once, before the first turn
    metrics = Metrics()
    host = build(rt, metrics=metrics)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, host.stop)
    log.info("turn host started", extra={"host_id": host.host_id, "capacity": host.options.capacity,
                                         "vcpus": host.cpu.vcpus})
    try:
        finished = await host.serve()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        metrics.flush()
    c = host.counts
    log.info("turn host stopped", extra={"received": c.received, "taken": c.taken, "joined": c.joined,
                                         "refused": c.refused, "turns": c.turns, "drained": finished,
                                         "cpu_ms": round(time.process_time() * 1000), "peak_rss_mb": _peak_rss_mb()})
    return finished


def main() -> int:
    try:
        settings = Settings()
        check(settings)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else ""
        print(f"invalid setting {name} (AVM_{name.upper()}): {err['msg']}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        print(str(exc), file=sys.stderr)
        return 2
    setup_logging(settings.log_level)
    finished = asyncio.run(serve(settings))
    if not finished:
        logging.shutdown()
        os._exit(1)  # leave the unfinished runs' leases to expire (no cancellation half-way through a turn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
