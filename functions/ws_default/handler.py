"""$default: every client frame goes through the AgentX command router. Answers and events are
posted to connections; turns are handed to `chat_turn` (never run inside the 29 s integration)."""

from __future__ import annotations

import base64
import logging
from typing import Any

# loaded at init (and in a SnapStart snapshot), not by the first request
import agentvm.adapters.aws.cloud_fanout
import agentvm.api.ws_router  # noqa: F401
from agentvm.cloud.runtime import run, runtime
from agentvm.domain.models import Principal
from agentvm.errors import Unauthorized, public_message
from agentvm.protocol.envelope import encode, event
from agentvm.protocol.events import SystemError

log = logging.getLogger("agentvm.ws_default")

NOT_CONNECTED = "This connection is not authenticated any more: reconnect with your API key."


async def _frame(connection_id: str, body: str | bytes) -> None:
    rt = await runtime().ready()
    record = await rt.registry.get_connection(connection_id)
    if record is None:  # its record expired or $connect never completed
        err = SystemError(message=public_message(Unauthorized(NOT_CONNECTED)), severity="error",
                          code="unauthorized")
        await rt.gateway.post(connection_id, encode(event("system_error", err, None)))
        return
    inv = rt.invocation(record.tenant_id, role="ws_default")
    inv.fanout.known(record)
    try:
        await rt.router(inv).handle_frame(Principal(record.tenant_id, record.key_id), connection_id, body)
    finally:
        await inv.fanout.close()


def handler(event: dict[str, Any], context: Any) -> dict[str, int]:
    body: str | bytes = event.get("body") or ""
    if event.get("isBase64Encoded") and isinstance(body, str):
        body = base64.b64decode(body)
    run(_frame(event["requestContext"]["connectionId"], body))
    return {"statusCode": 200}
