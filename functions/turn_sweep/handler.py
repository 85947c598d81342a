"""turn_sweep (EventBridge schedule, every 2 minutes by default): starts `chat_turn` for a session
whose queued turns nobody runs (its runner died, or its dispatch was lost); see
hosting/turn_sweep.py. Idle it reads the unfinished-turns index and nothing else."""

from __future__ import annotations

import gc

gc.disable()  # the init phase: no collection until init_phase.done(), the last line

import dataclasses
from typing import Any

from agentvm.cloud import init_phase
from agentvm.cloud.observability import Count, observe
from agentvm.cloud.runtime import run, runtime
from agentvm.hosting.turn_sweep import sweep
from agentvm.ids import now_ms

obs = observe("turn_sweep")


async def _sweep() -> dict[str, int]:
    rt = await runtime().ready()
    report = await sweep(rt.store, rt.leases, rt.dispatcher, now_ms=now_ms())
    obs.metric("SweepDispatched", Count, report.dispatched)
    if report.failed:
        obs.metric("SweepDispatchFailed", Count, report.failed)
    return dataclasses.asdict(report)


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, int]:
    return run(_sweep())


init_phase.done()  # the collector back on, what init built frozen (agentvm/cloud/init_phase.py)
