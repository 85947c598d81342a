"""chat_turn (async invoke by ws_default): run a session's queued turns under its lease and push the
coalesced events to every subscribed connection. Payload: {"tenantId": …, "sessionId": …}, and from
the `ws_default` that announced the message, "handoff": {"owner": …, "nextSeq": …}: the lease it holds
and passes on (`LeaseHandoff`; a malformed one is ignored: the lease is then taken once it is free)."""

from __future__ import annotations

import gc

gc.disable()  # the init phase: no collection until init_phase.done(), the last line

import logging
from typing import Any

# loaded at init (and in the SnapStart snapshot), not by the first invocation
import agentvm.adapters.aws.cloud_fanout
import agentvm.hosting.session_worker  # noqa: F401
from agentvm.cloud import init_phase, snapstart
from agentvm.cloud.observability import Count, observe, record_turns
from agentvm.cloud.runtime import run, runtime
from agentvm.domain.models import LeaseHandoff

log = logging.getLogger("agentvm.chat_turn")
obs = observe("chat_turn")
snapstart.install()  # restored environments must not share the snapshot's random state


async def _run_turns(tenant_id: str, session_id: str, request_id: str | None,
                     handoff: LeaseHandoff | None) -> int:
    rt = await runtime().ready()
    # the lease is held as chat_turn:<request id>: Lambda's failure record then names it (turn_failed)
    turns = await rt.run_session(tenant_id, session_id, role="chat_turn", request_id=request_id, handoff=handoff)
    record_turns(obs.metric, turns)
    return len(turns)


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    tenant_id, session_id = event.get("tenantId"), event.get("sessionId")
    if not isinstance(tenant_id, str) or not tenant_id or not isinstance(session_id, str) or not session_id:
        # An async invoke that raises is retried; a malformed payload never gets better.
        log.error("chat_turn: payload needs non-empty string tenantId and sessionId",
                  extra={"keys": sorted(event) if isinstance(event, dict) else None})
        obs.metric("InvalidPayloads", Count, 1)
        return {"ran": 0, "error": "invalid_payload"}
    request_id = getattr(context, "aws_request_id", None)
    handoff = LeaseHandoff.from_wire(event.get("handoff"))
    if handoff is None and event.get("handoff") is not None:
        log.error("chat_turn: the handoff is malformed and ignored", extra={"session_id": session_id})
    return {"ran": run(_run_turns(tenant_id, session_id, request_id if isinstance(request_id, str) else None,
                                  handoff))}


init_phase.done()  # the collector back on, what init built frozen (agentvm/cloud/init_phase.py)
