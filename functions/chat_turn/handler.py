"""chat_turn (async invoke by ws_default): run a session's queued turns under its lease and push the
coalesced events to every subscribed connection. Payload: {"tenantId": …, "sessionId": …}."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

# loaded at init (and in the SnapStart snapshot), not by the first invocation
import agentvm.adapters.aws.cloud_fanout
import agentvm.hosting.session_worker  # noqa: F401
from agentvm.cloud.observability import Count, Milliseconds, observe
from agentvm.cloud.runtime import run, runtime
from agentvm.domain.models import Turn, TurnStatus
from agentvm.domain.usage import model_family

log = logging.getLogger("agentvm.chat_turn")
obs = observe("chat_turn")


def _record(turns: Sequence[Turn]) -> None:
    """Business metrics of the turns this invocation ran (dimensions: never an id)."""
    for turn in turns:
        tier, family = turn.tier or "function", model_family(turn.model)
        obs.metric("TurnsRun", Count, 1, status=str(turn.status), tier=tier)
        if turn.duration_ms is not None:
            obs.metric("TurnDuration", Milliseconds, turn.duration_ms, status=str(turn.status), tier=tier)
        if turn.status == TurnStatus.FAILED:
            obs.metric("TurnErrors", Count, 1, tier=tier)
        usage = turn.usage
        for name, value in (("InputTokens", usage.input_tokens), ("OutputTokens", usage.output_tokens),
                            ("CacheReadTokens", usage.cache_read_tokens),
                            ("CacheWriteTokens", usage.cache_write_tokens)):
            obs.metric(name, Count, value, tier=tier, model_family=family)


async def _run_turns(tenant_id: str, session_id: str) -> int:
    rt = await runtime().ready()
    inv = rt.invocation(tenant_id, role="chat_turn", driver=await rt.driver())
    try:
        turns = await rt.worker(inv).run(tenant_id, session_id)
    finally:
        await inv.fanout.close()
    _record(turns)
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
    return {"ran": run(_run_turns(tenant_id, session_id))}
