"""The Gateway port on API Gateway's management API (`post_to_connection`)."""

from __future__ import annotations

import asyncio
import logging
import random

import botocore.session
from botocore.exceptions import ClientError

from agentvm.adapters.aws.clients import LazyClient

log = logging.getLogger(__name__)

# API Gateway refuses WebSocket messages above 128 KB; frames above 32 KB are billed as several.
MAX_FRAME_BYTES = 128 * 1024
_THROTTLED = frozenset({"ThrottlingException", "LimitExceededException", "TooManyRequestsException"})
_GONE = frozenset({"GoneException", "ForbiddenException"})


class ApiGatewayGateway:
    def __init__(self, endpoint_url: str, *, session: botocore.session.Session | None = None,
                 region_name: str | None = None, max_retries: int = 3) -> None:
        self._client = LazyClient("apigatewaymanagementapi", session=session, endpoint_url=endpoint_url,
                                  region_name=region_name)
        self.max_retries = max_retries

    async def close(self) -> None:
        await self._client.close()

    async def post(self, connection_id: str, frame: str) -> bool:
        """Send one frame. False when the connection is gone; throttling is retried with backoff."""
        data = frame.encode()
        if len(data) > MAX_FRAME_BYTES:
            log.error("frame too large for API Gateway", extra={"connection_id": connection_id,
                                                                "bytes": len(data)})
            return False
        client = await self._client.get()
        for attempt in range(self.max_retries + 1):
            try:
                await client.post_to_connection(ConnectionId=connection_id, Data=data)
                return True
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if code in _GONE or status == 410:
                    return False
                if (code in _THROTTLED or status == 429) and attempt < self.max_retries:
                    await asyncio.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
                    continue
                if code == "PayloadTooLargeException" or status == 413:
                    log.error("frame refused as too large", extra={"connection_id": connection_id,
                                                                   "bytes": len(data)})
                    return False
                raise
        return False  # pragma: no cover - the loop always returns or raises
