"""$disconnect: forget the connection with its subscriptions and watches (agentvm/cloud/ws_routes.py)."""

from __future__ import annotations

import gc

gc.disable()  # the init phase: no collection until init_phase.done(), the last line

from typing import Any

from agentvm.cloud import init_phase, ws_routes
from agentvm.cloud.observability import observe
from agentvm.cloud.runtime import run, runtime

obs = observe("ws_disconnect")


async def _disconnect(connection_id: str) -> None:
    rt = await runtime().ready()
    await ws_routes.disconnect(rt, connection_id)


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, int]:
    run(_disconnect(event["requestContext"]["connectionId"]))
    return {"statusCode": 200}


init_phase.done()  # the collector back on, what init built frozen (agentvm/cloud/init_phase.py)
