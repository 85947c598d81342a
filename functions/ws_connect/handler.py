"""$connect: authenticate the API key and record connection → principal. Never posts: API Gateway
accepts no message to a connection before its $connect route has returned.

An upgrade without credentials (a browser cannot set headers) is accepted and recorded as not yet
authenticated: its first frame must be an `auth` frame (ws_default, docs/tenancy.md). A key that is
present but bad is refused here (401). `?frames=batch` asks for batched frames (docs/protocol.md)."""

from __future__ import annotations

import logging
from typing import Any

from agentvm.auth.api_keys import extract_token
from agentvm.cloud.observability import Count, observe
from agentvm.cloud.runtime import run, runtime
from agentvm.domain.models import ConnectionRecord
from agentvm.errors import Unauthorized
from agentvm.ids import now_ms
from agentvm.protocol.frames import wants_batches

log = logging.getLogger("agentvm.ws_connect")
obs = observe("ws_connect")


async def _connect(event: dict[str, Any]) -> dict[str, Any]:
    rt = await runtime().ready()
    connection_id = event["requestContext"]["connectionId"]
    query = event.get("queryStringParameters")
    token = extract_token(event.get("headers"), query)
    batch = wants_batches(query)
    if token is None:  # the first frame authenticates it, within AVM_AUTH_TIMEOUT_S
        await rt.registry.put_connection(ConnectionRecord(connection_id, "", None, now_ms(), authenticated=False,
                                                          batch=batch))
        log.info("websocket accepted", extra={"auth": "frame"})
        obs.metric("ConnectionsAccepted", Count, 1)
        return {"statusCode": 200}
    try:
        principal = await rt.authenticator.authenticate(token)
    except Unauthorized as exc:
        log.info("websocket refused", extra={"reason": "invalid_key", "detail": exc.message})
        obs.metric("ConnectionsRefused", Count, 1)
        return {"statusCode": 401, "body": exc.message}
    await rt.registry.put_connection(ConnectionRecord(connection_id, principal.tenant_id, principal.key_id,
                                                      now_ms(), batch=batch))
    log.info("websocket accepted", extra={"auth": "key"})
    obs.metric("ConnectionsAccepted", Count, 1)
    return {"statusCode": 200}


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return run(_connect(event))
