"""`python -m agentvm.turnhost`: the turn host's entry point and composition root, over the cloud
one (`CloudRuntime`). The task definition's environment configures it as it does the functions,
plus AVM_TURN_QUEUE_URL and the AVM_TURN_HOST_* settings (docs/configuration.md).

With AVM_TURN_HOST_WS_PORT the host also terminates WebSockets itself (turnhost/front.py, behind a
load balancer) and serves its internal endpoint on AVM_TURN_HOST_PEER_PORT (turnhost/peers.py), with
a random token it registers; on SIGTERM both keep serving while the running turns drain, then the
front's sockets are closed (1001, "Going away": clients reconnect to another host).

Exit codes: 0 after a drain (SIGTERM or SIGINT; turns still running after AVM_TURN_HOST_DRAIN_S are
interrupted, host/drain.py), 2 when a setting is bad or missing (one line on stderr: a task that would
never get better by being restarted), 1 when a session run did not end even after its interruption.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import uvicorn
from pydantic import ValidationError

from agentvm.cloud.observability import Count, InvocationMetrics, record_turns
from agentvm.cloud.runtime import CloudRuntime
from agentvm.config import Settings
from agentvm.domain.models import LeaseHandoff, Turn
from agentvm.domain.turn_hosts import TurnHostRecord, TurnRequest
from agentvm.hosting.drain import Drain
from agentvm.logs import setup_logging
from agentvm.turnhost.cpu import CpuMeter, available_vcpus
from agentvm.turnhost.host import HostOptions, TurnHost

log = logging.getLogger("agentvm.turnhost")

METRICS_FLUSH_S = 60.0
MAX_CLIENT_MESSAGE_BYTES = 128 * 1024
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
        self._maybe_flush()

    def metric(self, name: str, unit: Any, value: float) -> None:
        """A metric of the host's front (the ws_* functions' connection metrics), flushed with the turns'."""
        self.pending.add(name, unit, value)
        self._maybe_flush()

    def _maybe_flush(self) -> None:
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


def build(rt: CloudRuntime, *, metrics: Metrics | None = None, name: str | None = None,
          endpoint: tuple[str, int, str] | None = None) -> TurnHost:
    """The turn host over a runtime's clients (also the tests' in-process host)."""
    s = rt.settings
    drain = Drain()

    async def run_session(tenant_id: str, session_id: str, handoff: LeaseHandoff | None) -> Sequence[Turn]:
        return await rt.run_session(tenant_id, session_id, role="turn_host", handoff=handoff, drain=drain)

    def on_run(request: TurnRequest, turns: Sequence[Turn], seconds: float) -> None:
        log.info("session run", extra={"session_id": request.session_id, "turns": len(turns),
                                       "ms": int(seconds * 1000)})
        if metrics is not None:
            metrics.add(turns)

    vcpus = s.turn_host_vcpu or available_vcpus()
    return TurnHost(name or host_id(), queue=rt.turn_queue, directory=rt.turn_hosts, fallback=rt.lambda_dispatcher,
                    run_session=run_session, cpu=CpuMeter(vcpus), on_run=on_run,
                    on_beat=None if metrics is None else metrics.beat, endpoint=endpoint, drain=drain,
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


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the host's SIGTERM drains the turns first."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def task_address() -> str:
    """The ECS task's private address (task metadata endpoint v4), else the host name's."""
    base = os.environ.get("ECS_CONTAINER_METADATA_URI_V4", "")
    if base:
        import httpx

        try:
            async with httpx.AsyncClient(timeout=2.0) as http:
                task = (await http.get(f"{base}/task")).json()
            for container in task.get("Containers", []):
                for network in container.get("Networks", []):
                    for address in network.get("IPv4Addresses", []):
                        return str(address)
        except Exception:
            log.exception("the task metadata endpoint could not be read")
    return socket.gethostbyname(socket.gethostname())


class Front:
    """The WebSocket front and the internal endpoint of a host (AVM_TURN_HOST_WS_PORT)."""

    def __init__(self, rt: CloudRuntime, name: str, token: str, metrics: Metrics | None = None) -> None:
        from agentvm.turnhost.front import HostFront, HostSockets
        from agentvm.turnhost.peers import PeerEndpoint

        self.sockets = HostSockets(name)
        self.host: TurnHost | None = None
        if metrics is None:
            self.app = HostFront(rt, self.sockets, healthy=self.healthy)
        else:
            self.app = HostFront(rt, self.sockets, healthy=self.healthy, metric=metrics.metric)
        self.peers = PeerEndpoint(self.sockets, token, max_bytes=rt.settings.max_frame_bytes)
        self.servers: list[Any] = []
        self.tasks: list[asyncio.Task[None]] = []

    def healthy(self) -> bool:
        return self.host is not None and self.host.registered and not self.host.draining

    async def start(self, settings: Settings) -> None:
        for app, port in ((self.app, settings.turn_host_ws_port), (self.peers, settings.turn_host_peer_port)):
            # API Gateway's limit on a client's message (above it: close 1009), so both fronts take the same
            server = _Server(uvicorn.Config(app, host="0.0.0.0", port=port, log_config=None, lifespan="off",
                                            access_log=False, ws="websockets-sansio", ws_per_message_deflate=False,
                                            ws_max_size=MAX_CLIENT_MESSAGE_BYTES, timeout_graceful_shutdown=5))
            self.servers.append(server)
            self.tasks.append(asyncio.create_task(server.serve()))
        while not all(s.started for s in self.servers):
            for task in self.tasks:
                if task.done():
                    task.result()  # a port in use: raise
                    raise SystemExit("the turn host's front stopped at start-up")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        from agentvm.protocol.frames import GOING_AWAY

        await self.app.drain()
        self.sockets.close_all(GOING_AWAY, "Going away")
        for server in self.servers:
            server.should_exit = True
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def new_front(rt: CloudRuntime, name: str, metrics: Metrics | None = None) -> tuple[Front, tuple[str, int, str]]:
    """A host's front with its random token, and the endpoint the host registers."""
    s = rt.settings
    token = secrets.token_urlsafe(32)
    return Front(rt, name, token, metrics), (s.turn_host_address or await task_address(), s.turn_host_peer_port,
                                             token)


async def start_front(rt: CloudRuntime, front: Front, host: TurnHost) -> None:
    """Frames to the front's sockets go straight to them, its connections' turns run on the host when
    it has room; listening before the host registers its address."""
    from agentvm.turnhost.local_dispatch import LocalFirstDispatcher

    front.host = host
    rt.use_front(local=front.sockets, dispatcher=LocalFirstDispatcher(host, rt.dispatcher))
    await front.start(rt.settings)


async def serve(settings: Settings) -> bool:
    rt = await CloudRuntime(settings).ready()
    await rt.driver()  # the LLM key is read once, before the first turn
    metrics = Metrics()
    name = host_id()
    front: Front | None = None
    endpoint = None
    if settings.turn_host_ws_port:
        front, endpoint = await new_front(rt, name, metrics)
    host = build(rt, metrics=metrics, name=name, endpoint=endpoint)
    if front is not None:
        await start_front(rt, front, host)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, host.stop)
    log.info("turn host started", extra={"host_id": host.host_id, "capacity": host.options.capacity,
                                         "vcpus": host.cpu.vcpus, "front_port": settings.turn_host_ws_port})
    try:
        finished = await host.serve()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        metrics.flush()
        if front is not None:
            await front.stop()
            await host.deregister()  # its sockets are closed: nobody needs its address any more
    c = host.counts
    fronted = {} if front is None else {
        "front": {**front.app.counts, "frames_out": front.sockets.frames_out, "bytes_out": front.sockets.bytes_out,
                  **{f"peer_{k}": v for k, v in front.peers.counts.items()}}}
    log.info("turn host stopped", extra={"received": c.received, "taken": c.taken, "joined": c.joined,
                                         "refused": c.refused, "local": c.local, "turns": c.turns,
                                         "handed_back": c.handed_back,
                                         "drained": finished, "cpu_ms": round(time.process_time() * 1000),
                                         "peak_rss_mb": _peak_rss_mb(), **fronted})
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
