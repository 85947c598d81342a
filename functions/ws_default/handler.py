"""$default: every client frame goes through the AgentX command router (agentvm/cloud/ws_routes.py,
shared with the turn host's own front). Answers and events are posted to connections; turns are
handed to `chat_turn` or a turn host (never run inside the 29 s integration).

A connection `$connect` accepted without credentials authenticates with a first `auth` frame within
AVM_AUTH_TIMEOUT_S of its connect, as on `avm serve`: the handshake is api/ws_auth.py
(docs/tenancy.md)."""

from __future__ import annotations

import gc

gc.disable()  # the init phase: no collection until init_phase.done(), the last line

import base64
from typing import Any

# loaded at init (and in a SnapStart snapshot), not by the first request
import agentvm.adapters.aws.cloud_fanout
import agentvm.api.ws_auth
import agentvm.api.ws_router  # noqa: F401
from agentvm.cloud import init_phase, ws_routes
from agentvm.cloud.observability import observe
from agentvm.cloud.runtime import run, runtime

obs = observe("ws_default")


async def _frame(connection_id: str, body: str | bytes, received_ms: int | None) -> None:
    rt = await runtime().ready()
    await ws_routes.frame(rt, connection_id, body, obs.metric, received_ms=received_ms)


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, int]:
    body: str | bytes = event.get("body") or ""
    if event.get("isBase64Encoded") and isinstance(body, str):
        body = base64.b64decode(body)
    ctx = event["requestContext"]
    received = ctx.get("requestTimeEpoch")
    run(_frame(ctx["connectionId"], body, received if isinstance(received, int) else None))
    return {"statusCode": 200}


init_phase.done()  # the collector back on, what init built frozen (agentvm/cloud/init_phase.py)
