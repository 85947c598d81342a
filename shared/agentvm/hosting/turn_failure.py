"""A failed `chat_turn` invocation, as Lambda reports it to its OnFailure destination (cloud).

`chat_turn` is invoked asynchronously with no retry. When an invocation fails (the process crashed,
ran out of memory or time, or the handler raised) Lambda at once invokes the destination,
`functions/turn_failed`, with an invocation record:

    {"requestContext": {"requestId", "functionArn", "condition", "approximateInvokeCount"},
     "requestPayload": {"tenantId", "sessionId"},
     "responseContext": {"statusCode", "executedVersion", "functionError"},
     "responsePayload": {"errorType", "errorMessage"}}

A `chat_turn` holds a session's lease as `chat_turn:<its request id>` (`agentvm.ids.lease_owner`), so the record
names the lease the dead invocation held. If the lease still carries that invocation's runner mark,
it is taken over at once instead of after it expires (`SessionLeases.take_over`): the turn it was
running is failed as the next runner would fail it (`worker_lost` to every subscriber, its budget
hold given back, the turn and an error message stored; hosting/session_worker.py), and the turns
queued behind it go to a new runner. A lease held by anyone else, a live runner included, is never
touched. Without the destination the client waited for the lease (60 s) and the next sweep (up to
`TurnSweepSchedule`, 2 minutes); with it, about the time Lambda takes to report (a second or two).

An invocation that never ran (`EventAgeExceeded`: throttled past `MaximumEventAgeInSeconds`) left its
session's queue without a runner: one is started now rather than at the next sweep. One that failed
without holding the lease (before taking it, or after releasing it) is left to the sweep: starting
another runner at once would loop as fast as Lambda reports a failure that repeats (a missing
permission, a bad setting), each invocation billed; the sweep retries at its schedule.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentvm.errors import InvalidRequest
from agentvm.hosting.session_worker import DeadRunner
from agentvm.ids import lease_owner
from agentvm.ports import Dispatcher, SessionLeases

log = logging.getLogger(__name__)

#: The role (lease owner prefix) of the function whose failures are reported here.
RUNNER_ROLE = "chat_turn"
#: Lambda's condition for an event it dropped unrun (throttled longer than its maximum age).
NEVER_RAN = "EventAgeExceeded"

FailDeadRunner = Callable[[str, str, str], Awaitable[DeadRunner | None]]


@dataclass(frozen=True, slots=True)
class FailedInvocation:
    request_id: str
    tenant_id: str
    session_id: str
    condition: str  # RetriesExhausted | EventAgeExceeded
    error: str  # the function's errorType (Runtime.ExitError, Sandbox.Timedout, ...), or ""


@dataclass(frozen=True, slots=True)
class FailureReport:
    outcome: str  # failed_turn | released | dispatched | left
    turn_id: str | None = None


def parse_failure(record: Any) -> FailedInvocation:
    """The invocation record Lambda sends to an OnFailure destination; InvalidRequest names the field."""
    if not isinstance(record, dict):
        raise InvalidRequest("the invocation record must be a JSON object", field="record")
    context, payload = record.get("requestContext"), record.get("requestPayload")
    if not isinstance(context, dict) or not _text(context.get("requestId")):
        raise InvalidRequest("requestContext.requestId must be a non-empty string", field="requestContext.requestId")
    if not isinstance(payload, dict):
        raise InvalidRequest("requestPayload must be the failed invocation's JSON object", field="requestPayload")
    for name in ("tenantId", "sessionId"):
        if not _text(payload.get(name)):
            raise InvalidRequest(f"requestPayload.{name} must be a non-empty string", field=f"requestPayload.{name}")
    response = record.get("responsePayload")
    error = response.get("errorType") if isinstance(response, dict) else None
    return FailedInvocation(request_id=context["requestId"], tenant_id=payload["tenantId"],
                            session_id=payload["sessionId"], condition=str(context.get("condition") or ""),
                            error=error if isinstance(error, str) else "")


async def handle_failed_invocation(failure: FailedInvocation, leases: SessionLeases, fail_dead_runner: FailDeadRunner,
                                   dispatcher: Dispatcher) -> FailureReport:
    t, s = failure.tenant_id, failure.session_id
    extra = {"session_id": s, "request_id": failure.request_id, "condition": failure.condition,
             "error_type": failure.error}
    dead = await fail_dead_runner(t, s, lease_owner(RUNNER_ROLE, failure.request_id))
    if dead is not None:
        if dead.more:
            await dispatcher.start_turns(t, s)
        turn_id = dead.lost.turn_id if dead.lost is not None else None
        log.error("a chat_turn invocation failed holding the session: its turn is failed",
                  extra={**extra, "turn_id": turn_id, "more": dead.more})
        return FailureReport("failed_turn" if turn_id else "released", turn_id)
    if failure.condition == NEVER_RAN:
        state = await leases.poll(t, s, consistent=True)
        if not state.held and state.queued:
            await dispatcher.start_turns(t, s)
            log.error("a chat_turn invocation expired unrun: a runner is started", extra=extra)
            return FailureReport("dispatched")
    log.error("a chat_turn invocation failed without holding its session: the sweep runs what it left",
              extra=extra)
    return FailureReport("left")


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)
