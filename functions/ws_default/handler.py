"""$default: every client frame goes through the AgentX command router. Answers and events are
posted to connections; turns are handed to `chat_turn` (never run inside the 29 s integration).

A connection `$connect` accepted without credentials authenticates with a first `auth` frame within
AVM_AUTH_TIMEOUT_S of its connect, as on `avm serve`: the handshake is api/ws_auth.py
(docs/tenancy.md)."""

from __future__ import annotations

import base64
from typing import Any

# loaded at init (and in a SnapStart snapshot), not by the first request
import agentvm.adapters.aws.cloud_fanout
import agentvm.api.ws_router  # noqa: F401
from agentvm.api.ws_auth import ConnectionHandshake
from agentvm.cloud.observability import Count, observe
from agentvm.cloud.runtime import run, runtime
from agentvm.domain.models import Principal

obs = observe("ws_default")


async def _frame(connection_id: str, body: str | bytes) -> None:
    rt = await runtime().ready()
    handshake = ConnectionHandshake(
        rt.registry, rt.gateway, rt.authenticator, rt.settings.auth_timeout_s,
        on_refused=lambda why: obs.metric("ConnectionsRefused", Count, 1))  # the reason is in its log line
    record = await handshake.admit(connection_id, body)
    if record is None:
        return
    inv = rt.invocation(record.tenant_id, role="ws_default")
    inv.fanout.known(record)
    try:
        await rt.router(inv).handle_frame(Principal(record.tenant_id, record.key_id), connection_id, body)
    finally:
        await inv.fanout.close()


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, int]:
    body: str | bytes = event.get("body") or ""
    if event.get("isBase64Encoded") and isinstance(body, str):
        body = base64.b64decode(body)
    run(_frame(event["requestContext"]["connectionId"], body))
    return {"statusCode": 200}
