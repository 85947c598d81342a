"""$disconnect: forget the connection with its subscriptions and watches."""

from __future__ import annotations

from typing import Any

from agentvm.cloud.observability import observe
from agentvm.cloud.runtime import run, runtime

obs = observe("ws_disconnect")


async def _disconnect(connection_id: str) -> None:
    rt = await runtime().ready()
    await rt.registry.delete_connection(connection_id)


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, int]:
    run(_disconnect(event["requestContext"]["connectionId"]))
    return {"statusCode": 200}
