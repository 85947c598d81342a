"""The TurnQueue port on SQS: `ws_default` sends a turn request, a turn host receives it.

A message is `{"tenantId": …, "sessionId": …}`. The host deletes what it received at once (one
batch request): a request is a hint to run the session's queue, whose truth is the lease record, so
a lost message costs nothing that the turn sweep does not recover, and a message is never run twice.
Costs: one SendMessage per dispatched session run, one ReceiveMessage per batch (long polling: an
idle host makes one request per `wait_s`), one DeleteMessageBatch per batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import botocore.session
import orjson
from botocore.config import Config

from agentvm.adapters.aws.clients import LazyClient
from agentvm.domain.models import LeaseHandoff
from agentvm.domain.turn_hosts import TurnRequest

log = logging.getLogger(__name__)

_BATCH_MAX = 10  # SQS: at most 10 messages per receive and per delete batch
_LONG_POLL_MAX_S = 20


class SqsTurnQueue:
    def __init__(self, queue_url: str, *, session: botocore.session.Session | None = None,
                 endpoint_url: str | None = None, region_name: str | None = None) -> None:
        self.queue_url = queue_url
        # a long poll holds the read for up to 20 s
        config = Config(connect_timeout=3, read_timeout=_LONG_POLL_MAX_S + 10, retries={"max_attempts": 3})
        self._client = LazyClient("sqs", session=session, endpoint_url=endpoint_url, region_name=region_name,
                                  config=config)

    async def close(self) -> None:
        await self._client.close()

    async def send(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None:
        client = await self._client.get()
        fields: dict[str, object] = {"tenantId": tenant_id, "sessionId": session_id}
        if handoff is not None:
            fields["handoff"] = handoff.to_wire()
        body = orjson.dumps(fields).decode()
        await client.send_message(QueueUrl=self.queue_url, MessageBody=body)

    async def receive(self, max_count: int, wait_s: float) -> list[TurnRequest]:
        client = await self._client.get()
        resp = await client.receive_message(QueueUrl=self.queue_url,
                                            MaxNumberOfMessages=max(1, min(_BATCH_MAX, max_count)),
                                            WaitTimeSeconds=max(0, min(_LONG_POLL_MAX_S, int(wait_s))))
        out: list[TurnRequest] = []
        bad: list[TurnRequest] = []
        for message in resp.get("Messages", []):
            request = _parse(message)
            if request.tenant_id and request.session_id:
                out.append(request)
            else:
                log.error("a malformed turn request is dropped", extra={"body": str(message.get("Body"))[:200]})
                bad.append(request)
        if bad:
            await self.delete(bad)
        return out

    async def delete(self, requests: Sequence[TurnRequest]) -> None:
        client = await self._client.get()
        receipts = [r.receipt for r in requests if r.receipt]
        for start in range(0, len(receipts), _BATCH_MAX):
            chunk = receipts[start:start + _BATCH_MAX]
            resp = await client.delete_message_batch(QueueUrl=self.queue_url, Entries=[
                {"Id": str(i), "ReceiptHandle": receipt} for i, receipt in enumerate(chunk)])
            for failed in resp.get("Failed", []):  # redelivered after the visibility timeout: a no-op run
                log.warning("a turn request was not deleted", extra={"code": failed.get("Code")})


def _parse(message: dict[str, Any]) -> TurnRequest:
    receipt = str(message.get("ReceiptHandle", ""))
    try:
        body = orjson.loads(message.get("Body", ""))
    except orjson.JSONDecodeError:
        return TurnRequest("", "", receipt)
    if not isinstance(body, dict):
        return TurnRequest("", "", receipt)
    tenant, session = body.get("tenantId"), body.get("sessionId")
    if not isinstance(tenant, str) or not isinstance(session, str):
        return TurnRequest("", "", receipt)
    return TurnRequest(tenant, session, receipt, LeaseHandoff.from_wire(body.get("handoff")))


if TYPE_CHECKING:
    from agentvm.ports import TurnQueue

    def _implements_port(queue: SqsTurnQueue) -> TurnQueue:  # mypy checks the port's signatures
        return queue
