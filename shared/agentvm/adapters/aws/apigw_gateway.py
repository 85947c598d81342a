"""The Gateway port on API Gateway's management API (`post_to_connection`).

API Gateway refuses WebSocket messages above 128 KB and bills each message per 32 KB unit. A frame
above `inline_limit` (32 KB) is offloaded: its JSON is stored through `BlobOffload` (S3) and the
client gets the envelope with `data` replaced by a reference (docs/protocol.md, "Large frames in the
cloud"). Without an offload, or when it fails, the frame is sent whole if API Gateway takes it
(128 KB); above that, or when API Gateway still answers 413, the client gets the envelope with
`data.__truncated` instead. Only GoneException/410/ForbiddenException mean the connection is gone:
a big frame never costs a client its subscriptions. Frame content is never logged.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from datetime import UTC, datetime
from typing import Any

import botocore.session
import orjson
from botocore.exceptions import ClientError

from agentvm.adapters.aws.clients import LazyClient
from agentvm.adapters.aws.frame_offload import BlobOffload

log = logging.getLogger(__name__)

# API Gateway refuses WebSocket messages above 128 KB; frames above 32 KB are billed as several.
MAX_FRAME_BYTES = 128 * 1024
INLINE_LIMIT = 32 * 1024
_THROTTLED = frozenset({"ThrottlingException", "LimitExceededException", "TooManyRequestsException"})
_GONE = frozenset({"GoneException", "ForbiddenException"})
# What a reference or truncated frame keeps of the original envelope.
_ENVELOPE = frozenset({"type", "timestamp", "source", "category", "intent", "context", "seq"})
# A URL is reused for the same content (one upload for every subscriber of a big event) while it
# still has most of its 15 minutes to live.
_REUSE_URL_S = 5 * 60
_MAX_CACHED_URLS = 64


class _TooLarge(Exception):
    """API Gateway answered 413 PayloadTooLarge."""


class ApiGatewayGateway:
    def __init__(self, endpoint_url: str, *, blobs: BlobOffload | None = None, inline_limit: int = INLINE_LIMIT,
                 session: botocore.session.Session | None = None, region_name: str | None = None,
                 max_retries: int = 3) -> None:
        if not 1024 <= inline_limit <= MAX_FRAME_BYTES:
            raise ValueError(f"inline_limit must be between 1024 and {MAX_FRAME_BYTES} bytes")
        self._client = LazyClient("apigatewaymanagementapi", session=session, endpoint_url=endpoint_url,
                                  region_name=region_name)
        self.blobs = blobs
        self.inline_limit = inline_limit
        self.max_retries = max_retries
        # object key → (monotonic time of the upload, the upload); an upload in flight is shared
        self._uploads: dict[str, tuple[float, asyncio.Task[str]]] = {}

    async def close(self) -> None:
        await self._client.close()

    async def post(self, connection_id: str, frame: str) -> bool:
        """Send one frame. False only when the connection is gone; throttling is retried with backoff.

        A frame above `inline_limit` is sent as a reference to its offloaded copy; if it cannot be
        offloaded it is sent whole when API Gateway takes it (up to 128 KB), else truncated. The
        connection is kept either way."""
        original = frame.encode()
        data = original
        if len(original) > self.inline_limit:
            data = await self._shrink(connection_id, original)
        try:
            return await self._post(connection_id, data)
        except _TooLarge:
            parsed = _loads(original)
            log.error("frame refused by API Gateway as too large; sent truncated",
                      extra={"connection_id": connection_id, "bytes": len(original), **_describe(parsed)})
        try:
            return await self._post(connection_id, _truncated(parsed, len(original)))
        except _TooLarge:  # pragma: no cover - a truncated frame is a few hundred bytes
            return True

    async def delete_connection(self, connection_id: str) -> bool:
        """Close a connection (`DeleteConnection`; API Gateway then runs `$disconnect`). The client
        sees a plain close: API Gateway sends no close code or reason of ours, so say why in a frame
        first. False when the connection was gone already."""
        client = await self._client.get()
        try:
            await client.delete_connection(ConnectionId=connection_id)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in _GONE or status == 410:
                return False
            raise
        return True

    async def _post(self, connection_id: str, data: bytes) -> bool:
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
                    raise _TooLarge from exc
                raise
        return False  # pragma: no cover - the loop always returns or raises

    async def _shrink(self, connection_id: str, data: bytes) -> bytes:
        """What to send for a frame above the inline limit: a reference to its offloaded copy; failing
        that the frame itself if API Gateway accepts its size, else the truncated envelope."""
        size = len(data)
        parsed = _loads(data)
        about = {"connection_id": connection_id, "bytes": size, **_describe(parsed)}
        if self.blobs is not None and isinstance(parsed, dict):
            digest = hashlib.sha256(data).hexdigest()
            key = f"frames/{datetime.now(UTC):%Y/%m/%d}/{digest}.json"
            try:
                url = await self._upload(key, data)
            except Exception:
                log.exception("frame offload failed", extra={**about, "key": key})
            else:
                ref = _small(parsed, {"__ref": {"url": url, "bytes": size, "sha256": digest}})
                if len(ref) <= self.inline_limit:
                    return ref
                log.error("reference frame above the inline limit", extra=about)  # a huge `context`
        elif self.blobs is None:
            log.error("frame above the inline limit and no offload configured", extra=about)
        else:
            log.error("frame above the inline limit is not a JSON object", extra=about)
        if size <= MAX_FRAME_BYTES:
            return data  # more billing units, but the client gets its data
        log.error("frame above API Gateway's limit; sent truncated", extra=about)
        return _truncated(parsed, size)

    async def _upload(self, key: str, data: bytes) -> str:
        """Store the frame once per content: concurrent and later posts of it share the URL."""
        assert self.blobs is not None
        now = time.monotonic()
        cached = self._uploads.get(key)
        if (cached is not None and now - cached[0] < _REUSE_URL_S
                and cached[1].get_loop() is asyncio.get_running_loop()):
            upload = cached[1]
        else:
            upload = asyncio.ensure_future(self.blobs.put_frame(key, data))
            self._uploads[key] = (now, upload)
            self._forget_old(now)
        try:
            return await asyncio.shield(upload)
        except Exception:
            if self._uploads.get(key, (0.0, None))[1] is upload:
                del self._uploads[key]
            raise

    def _forget_old(self, now: float) -> None:
        stale = [k for k, (t, task) in self._uploads.items() if now - t >= _REUSE_URL_S and task.done()]
        for k in stale:
            del self._uploads[k]
        while len(self._uploads) > _MAX_CACHED_URLS:
            oldest = next(iter(self._uploads))
            del self._uploads[oldest]


_NOT_JSON = object()


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _describe(parsed: Any) -> dict[str, Any]:
    """Log keys for a frame: its event type, never its content."""
    value = parsed.get("type") if isinstance(parsed, dict) else None
    return {"event_type": value} if isinstance(value, str) else {}


def _small(original: Any, data: dict[str, Any]) -> bytes:
    """`original`'s envelope with `data` replaced (its `requestId` kept, for request correlation)."""
    if not isinstance(original, dict):
        return orjson.dumps({"data": data})
    old = original.get("data")
    if isinstance(old, dict) and isinstance(old.get("requestId"), str):
        data["requestId"] = old["requestId"]
    out = {k: (data if k == "data" else v) for k, v in original.items() if k in _ENVELOPE or k == "data"}
    out.setdefault("data", data)
    return orjson.dumps(out)


def _truncated(original: Any, size: int) -> bytes:
    return _small(original, {"__truncated": True, "bytes": size})
