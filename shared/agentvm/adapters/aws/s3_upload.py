"""A blob written in pieces to S3 (the `BlobUpload` port): parts of `part_size` bytes as a multipart
upload, so that memory holds one part whatever the object's size.

Nothing is sent until a part is full: a blob smaller than one part is a single PutObject at `finish`;
a larger one is CreateMultipartUpload, an UploadPart per `part_size` bytes (S3: at least 5 MiB each
but the last, at most 10,000 parts: 80 GB at the default 8 MiB) and CompleteMultipartUpload. A failed
upload is aborted (AbortMultipartUpload; the bucket's lifecycle rule also aborts any left after a day).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from agentvm.errors import InvalidRequest

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client
    from types_aiobotocore_s3.type_defs import CompletedPartTypeDef

    from agentvm.ports import BlobUpload

MIN_PART: Final = 5 * 1024 * 1024  # S3's minimum for every part but the last
DEFAULT_PART: Final = 8 * 1024 * 1024
MAX_PARTS: Final = 10_000


class S3Upload:
    """`key`: the object's full key in `bucket`; `client`: the S3 client (the blob store's, opened on demand)."""

    def __init__(self, client: Callable[[], Awaitable[S3Client]], bucket: str, key: str, content_type: str,
                 part_size: int = DEFAULT_PART) -> None:
        if part_size < MIN_PART:
            raise InvalidRequest(f"part_size: S3 parts are at least {MIN_PART} bytes", field="part_size")
        self.key = key
        self.bucket = bucket
        self._client = client
        self._content_type = content_type
        self._part_size = part_size
        self._buf = bytearray()
        self._upload_id: str | None = None
        self._parts: list[CompletedPartTypeDef] = []
        self.size = 0
        self._done = False

    async def write(self, data: bytes) -> None:
        if self._done:
            raise RuntimeError(f"upload of {self.key} is finished")
        self._buf += data
        self.size += len(data)
        if len(self._buf) >= self._part_size:
            await self._send_part()

    async def finish(self) -> int:
        if self._done:
            raise RuntimeError(f"upload of {self.key} is finished or aborted")
        client = await self._client()
        bucket = self.bucket
        try:
            if self._upload_id is None:
                await client.put_object(Bucket=bucket, Key=self.key, Body=bytes(self._buf),
                                        ContentType=self._content_type)
            else:
                if self._buf or not self._parts:
                    await self._send_part()
                await client.complete_multipart_upload(Bucket=bucket, Key=self.key, UploadId=self._upload_id,
                                                       MultipartUpload={"Parts": self._parts})
        except BaseException:
            with contextlib.suppress(Exception):  # the failure to report is the one above
                await self.abort()
            raise
        self._done, self._buf, self._upload_id = True, bytearray(), None
        return self.size

    async def abort(self) -> None:
        self._done, self._buf = True, bytearray()
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is not None:
            client = await self._client()
            await client.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=upload_id)

    async def _send_part(self) -> None:
        client = await self._client()
        bucket = self.bucket
        if self._upload_id is None:
            resp = await client.create_multipart_upload(Bucket=bucket, Key=self.key, ContentType=self._content_type)
            self._upload_id = resp["UploadId"]
        number = len(self._parts) + 1
        if number > MAX_PARTS:
            raise InvalidRequest(f"{self.key}: more than {MAX_PARTS} parts of {self._part_size} bytes",
                                 field="part_size")
        body, self._buf = bytes(self._buf), bytearray()
        sent = await client.upload_part(Bucket=bucket, Key=self.key, UploadId=self._upload_id, PartNumber=number,
                                        Body=body)
        self._parts.append({"PartNumber": number, "ETag": sent["ETag"]})


if TYPE_CHECKING:
    def _implements_blob_upload(upload: S3Upload) -> BlobUpload:  # mypy checks the port's signatures
        return upload
