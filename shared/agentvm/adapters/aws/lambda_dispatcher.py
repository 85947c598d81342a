"""The Dispatcher port on Lambda: start a session's turns by invoking `chat_turn` asynchronously."""

from __future__ import annotations

import botocore.session
import orjson

from agentvm.adapters.aws.clients import LazyClient
from agentvm.domain.models import LeaseHandoff
from agentvm.observability import tracing


class LambdaDispatcher:
    def __init__(self, function_name: str, *, session: botocore.session.Session | None = None,
                 endpoint_url: str | None = None, region_name: str | None = None) -> None:
        self.function_name = function_name
        self._client = LazyClient("lambda", session=session, endpoint_url=endpoint_url, region_name=region_name)

    async def close(self) -> None:
        await self._client.close()

    async def start_turns(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None:
        client = await self._client.get()
        body: dict[str, object] = {"tenantId": tenant_id, "sessionId": session_id}
        if handoff is not None:
            body["handoff"] = handoff.to_wire()
        tracing.inject(body)  # with traces on: chat_turn's invocation continues the trace that queued the turns
        payload = orjson.dumps(body)
        await client.invoke(FunctionName=self.function_name, InvocationType="Event", Payload=payload)
