"""The BlobStore port on S3: one bucket, every key confined under an optional prefix.

The client is created once, on `open()` or the first call, and kept for the life of the process
(in Lambda: of the execution environment); `close()` releases it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError

from agentvm.adapters.aws.botocore_async import AsyncBotocoreClient, new_client, run_blocking
from agentvm.adapters.aws.s3_upload import DEFAULT_PART, S3Upload
from agentvm.errors import InvalidRequest

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

    from agentvm.ports import BlobStore, BlobUploads

_NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound"})
_MAX_KEY_BYTES = 1024  # S3's limit for the full key


class S3BlobStore:
    def __init__(self, bucket: str, *, prefix: str = "", session: botocore.session.Session | None = None,
                 endpoint_url: str | None = None, region_name: str | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            _check_key(self.prefix)
        self._session = session
        self._endpoint_url = endpoint_url
        self._region_name = region_name
        self._client: S3Client | None = None
        self._open_lock = asyncio.Lock()
        self.part_size = DEFAULT_PART

    async def open(self) -> None:
        async with self._open_lock:
            if self._client is not None:
                return
            # Path-style addressing for custom endpoints (moto, MinIO); AWS itself picks virtual-hosted.
            config = Config(connect_timeout=3, read_timeout=30, retries={"mode": "standard", "max_attempts": 5},
                            s3={"addressing_style": "path" if self._endpoint_url else "auto"},
                            signature_version="s3v4")
            # The awaitable botocore client behaves like the aiobotocore client these types describe.
            self._client = cast("S3Client", new_client("s3", session=self._session, endpoint_url=self._endpoint_url,
                                                       region_name=self._region_name, config=config))

    async def close(self) -> None:
        async with self._open_lock:
            client, self._client = self._client, None
            if client is not None:
                await cast(AsyncBotocoreClient, client).close()

    async def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        client = await self._ready()
        await client.put_object(Bucket=self.bucket, Key=self._full(key), Body=data, ContentType=content_type)
        return key

    async def get(self, key: str) -> bytes | None:
        client = await self._ready()
        try:
            resp = await client.get_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as exc:
            if _not_found(exc):
                return None
            raise
        body = resp["Body"]
        try:
            return cast(bytes, await run_blocking(body.read))
        finally:
            body.close()

    async def exists(self, key: str) -> bool:
        client = await self._ready()
        try:
            await client.head_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as exc:
            if _not_found(exc):
                return False
            raise
        return True

    async def delete(self, key: str) -> bool:
        """HEAD then DELETE: S3's DELETE succeeds whether or not the object existed."""
        full = self._full(key)
        if not await self.exists(key):
            return False
        client = await self._ready()
        await client.delete_object(Bucket=self.bucket, Key=full)
        return True

    async def url(self, key: str, expires_s: int = 3600) -> str:
        if not 1 <= expires_s <= 7 * 24 * 3600:  # SigV4 presigned URLs live at most 7 days
            raise InvalidRequest("expires_s must be between 1 second and 7 days", field="expires_s")
        client = await self._ready()
        return await client.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": self._full(key)},
                                                   ExpiresIn=expires_s)

    def upload(self, key: str, content_type: str = "application/octet-stream") -> S3Upload:
        """A blob written in parts (a multipart upload past one part; s3_upload.py)."""
        return S3Upload(self.s3, self.bucket, self._full(key), content_type, self.part_size, source_key=self._full)

    async def sizes(self, prefix: str) -> dict[str, int]:
        """ListObjectsV2 under the store's prefix + `prefix` (s3:ListBucket), every page."""
        client = await self._ready()
        base = f"{self.prefix}/" if self.prefix else ""
        out: dict[str, int] = {}
        token: str | None = None
        while True:
            page = await (client.list_objects_v2(Bucket=self.bucket, Prefix=base + prefix, ContinuationToken=token)
                          if token else client.list_objects_v2(Bucket=self.bucket, Prefix=base + prefix))
            for obj in page.get("Contents", []):
                out[obj["Key"][len(base):]] = obj["Size"]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return out

    def _full(self, key: str) -> str:
        _check_key(key)
        full = f"{self.prefix}/{key}" if self.prefix else key
        if len(full.encode()) > _MAX_KEY_BYTES:
            raise InvalidRequest("Blob key is too long", field="key")
        return full

    async def s3(self) -> S3Client:
        """The S3 client (for adapters that share it: the container's workspace sync)."""
        return await self._ready()

    async def _ready(self) -> S3Client:
        if self._client is None:
            await self.open()
        client = self._client
        if client is None:  # closed concurrently
            raise RuntimeError("blob store is closed")
        return client


def _check_key(key: str) -> None:
    """Relative, normalised keys only: nothing can address outside the prefix."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise InvalidRequest(f"Invalid blob key: {key!r}", field="key")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidRequest(f"Invalid blob key: {key!r}", field="key")


def _not_found(exc: ClientError) -> bool:
    return str(exc.response.get("Error", {}).get("Code", "")) in _NOT_FOUND


if TYPE_CHECKING:
    def _implements_blob_store(store: S3BlobStore) -> BlobStore:  # mypy checks the port's signatures
        return store

    def _implements_blob_uploads(store: S3BlobStore) -> BlobUploads:
        return store
