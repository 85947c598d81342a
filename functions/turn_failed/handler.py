"""turn_failed (chat_turn's OnFailure destination, async invoke by Lambda): a chat_turn invocation
failed (crash, out of memory, timeout, an unhandled error). If it still holds its session, the turn
it was running is failed at once (`worker_lost` to the session's subscribers, the budget hold given
back) and the turns behind it go to a new runner; see hosting/turn_failure.py."""

from __future__ import annotations

import gc

gc.disable()  # the init phase: no collection until init_phase.done(), the last line

import dataclasses
import logging
from typing import Any

from agentvm.cloud import init_phase
from agentvm.cloud.observability import observe
from agentvm.cloud.runtime import run, runtime
from agentvm.errors import InvalidRequest
from agentvm.hosting.turn_failure import FailedInvocation, handle_failed_invocation, parse_failure

log = logging.getLogger("agentvm.turn_failed")
obs = observe("turn_failed")


async def _handle(failure: FailedInvocation) -> dict[str, Any]:
    rt = await runtime().ready()
    report = await handle_failed_invocation(failure, rt.leases, rt.fail_dead_runner, rt.dispatcher)
    return dataclasses.asdict(report)


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    try:
        failure = parse_failure(event)
    except InvalidRequest as exc:
        # not retried: a record without its session never gets better
        log.error("turn_failed: not a chat_turn invocation record", extra={"field": exc.field, "error": exc.message})
        return {"outcome": "invalid_record", "error": exc.message}
    return run(_handle(failure))


init_phase.done()  # the collector back on, what init built frozen (agentvm/cloud/init_phase.py)
