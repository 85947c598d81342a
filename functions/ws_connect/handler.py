"""$connect: authenticate the API key and record connection → principal (agentvm/cloud/ws_routes.py,
shared with the turn host's own front). Never posts: API Gateway accepts no message to a connection
before its $connect route has returned.

An upgrade without credentials (a browser cannot set headers) is accepted and recorded as not yet
authenticated: its first frame must be an `auth` frame (ws_default, docs/tenancy.md). A key that is
present but bad is refused here (401). `?frames=batch` asks for batched frames (docs/protocol.md)."""

from __future__ import annotations

import gc

gc.disable()  # the init phase: no collection until init_phase.done(), the last line

from typing import Any

from agentvm.cloud import init_phase, ws_routes
from agentvm.cloud.observability import observe
from agentvm.cloud.runtime import run, runtime

obs = observe("ws_connect")


async def _connect(event: dict[str, Any]) -> dict[str, Any]:
    rt = await runtime().ready()
    done = await ws_routes.connect(rt, event["requestContext"]["connectionId"], event.get("headers"),
                                   event.get("queryStringParameters"), obs.metric)
    return {"statusCode": 200} if done.status == 200 else {"statusCode": done.status, "body": done.reason}


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return run(_connect(event))


init_phase.done()  # the collector back on, what init built frozen (agentvm/cloud/init_phase.py)
