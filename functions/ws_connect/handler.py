"""$connect: authenticate the API key and record connection → principal. Never posts: API Gateway
accepts no message to a connection before its $connect route has returned."""

from __future__ import annotations

import logging
from typing import Any

from agentvm.auth.api_keys import extract_token
from agentvm.cloud.runtime import run, runtime
from agentvm.domain.models import ConnectionRecord
from agentvm.errors import Unauthorized
from agentvm.ids import now_ms

log = logging.getLogger("agentvm.ws_connect")


async def _connect(event: dict[str, Any]) -> dict[str, Any]:
    rt = await runtime().ready()
    connection_id = event["requestContext"]["connectionId"]
    token = extract_token(event.get("headers"), event.get("queryStringParameters"))
    try:
        principal = await rt.authenticator.authenticate(token)
    except Unauthorized as exc:
        return {"statusCode": 401, "body": exc.message}
    await rt.registry.put_connection(ConnectionRecord(connection_id, principal.tenant_id, principal.key_id,
                                                      now_ms()))
    return {"statusCode": 200}


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return run(_connect(event))
