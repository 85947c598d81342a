"""A blob written in pieces to S3 (the `BlobUpload` port): parts of `part_size` bytes as a multipart
upload, so that memory holds one part whatever the object's size.

Nothing is sent until a part is full: a blob smaller than one part is a single PutObject at `finish`;
a larger one is CreateMultipartUpload, an UploadPart per `part_size` bytes (S3: at least 5 MiB each
but the last, at most 10,000 parts: 80 GB at the default 8 MiB) and CompleteMultipartUpload. A failed
upload is aborted (AbortMultipartUpload; the bucket's lifecycle rule also aborts any left after a day).

`copy` appends a byte range of another object of the bucket. A range of at least 5 MiB that starts a
part is copied server-side (UploadPartCopy with CopySourceRange, in parts of at most `COPY_PART`,
`COPY_CONCURRENCY` at a time); smaller ranges, and the bytes needed to bring a started part up to
5 MiB, are read (a ranged GetObject, under 5 MiB each) and sent with the written bytes. So memory
holds at most one part, and an object that stays under 5 MiB is still a single PutObject.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from agentvm.adapters.aws.botocore_async import run_blocking
from agentvm.errors import InvalidRequest

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client
    from types_aiobotocore_s3.type_defs import CompletedPartTypeDef

    from agentvm.ports import BlobUpload

MIN_PART: Final = 5 * 1024 * 1024  # S3's minimum for every part but the last
DEFAULT_PART: Final = 8 * 1024 * 1024
MAX_PARTS: Final = 10_000
#: Server-side copies are split into parts of at most this (S3 allows 5 GiB; smaller parts copy in parallel).
COPY_PART: Final = 512 * 1024 * 1024
COPY_CONCURRENCY: Final = 8


class S3Upload:
    """`key`: the object's full key in `bucket`; `client`: the S3 client (the blob store's, opened on demand)."""

    def __init__(self, client: Callable[[], Awaitable[S3Client]], bucket: str, key: str, content_type: str,
                 part_size: int = DEFAULT_PART, source_key: Callable[[str], str] = str) -> None:
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
        self._source_key = source_key  # a `copy` source's key as the store names it -> its full key
        self._copies: set[asyncio.Task[None]] = set()
        self._numbers = 0  # part numbers given out (copies finish out of order)
        self.size = 0
        self._done = False

    async def write(self, data: bytes) -> None:
        if self._done:
            raise RuntimeError(f"upload of {self.key} is finished")
        self._buf += data
        self.size += len(data)
        if len(self._buf) >= self._part_size:
            await self._send_part()

    async def copy(self, key: str, start: int, end: int) -> None:
        """Append bytes [start, end) of the object `key` (named as the store names it)."""
        if self._done:
            raise RuntimeError(f"upload of {self.key} is finished")
        if not 0 <= start <= end:
            raise InvalidRequest(f"copy of {key}: bad byte range {start}-{end}", field="range")
        source = self._source_key(key)
        self.size += end - start
        while start < end:
            if len(self._buf) >= MIN_PART:
                await self._send_part()
            elif not self._buf and end - start >= MIN_PART:
                n = min(end - start, COPY_PART)
                if end - start - n < MIN_PART:  # no short part in the middle of the object
                    n = end - start
                await self._copy_part(source, start, start + n)
                start += n
            else:
                n = min(end - start, MIN_PART - len(self._buf))
                self._buf += await self._read(source, start, start + n)
                start += n
        if len(self._buf) >= self._part_size:
            await self._send_part()

    async def finish(self) -> int:
        if self._done:
            raise RuntimeError(f"upload of {self.key} is finished or aborted")
        client = await self._client()
        bucket = self.bucket
        try:
            if self._copies:
                await asyncio.gather(*self._copies)  # on a failure, abort() cancels the others
                self._copies.clear()
            if self._upload_id is None:
                await client.put_object(Bucket=bucket, Key=self.key, Body=bytes(self._buf),
                                        ContentType=self._content_type)
            else:
                if self._buf or not self._parts:
                    await self._send_part()
                parts = sorted(self._parts, key=lambda p: p["PartNumber"])
                await client.complete_multipart_upload(Bucket=bucket, Key=self.key, UploadId=self._upload_id,
                                                       MultipartUpload={"Parts": parts})
        except BaseException:
            with contextlib.suppress(Exception):  # the failure to report is the one above
                await self.abort()
            raise
        self._done, self._buf, self._upload_id = True, bytearray(), None
        return self.size

    async def abort(self) -> None:
        self._done, self._buf = True, bytearray()
        copies, self._copies = self._copies, set()
        for task in copies:
            task.cancel()
        await asyncio.gather(*copies, return_exceptions=True)
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is not None:
            client = await self._client()
            await client.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=upload_id)

    async def _next_part(self) -> tuple[S3Client, str, int]:
        client = await self._client()
        if self._upload_id is None:
            resp = await client.create_multipart_upload(Bucket=self.bucket, Key=self.key,
                                                        ContentType=self._content_type)
            self._upload_id = resp["UploadId"]
        self._numbers += 1
        if self._numbers > MAX_PARTS:
            raise InvalidRequest(f"{self.key}: more than {MAX_PARTS} parts of {self._part_size} bytes",
                                 field="part_size")
        return client, self._upload_id, self._numbers

    async def _send_part(self) -> None:
        client, upload_id, number = await self._next_part()
        body, self._buf = bytes(self._buf), bytearray()
        sent = await client.upload_part(Bucket=self.bucket, Key=self.key, UploadId=upload_id, PartNumber=number,
                                        Body=body)
        self._parts.append({"PartNumber": number, "ETag": sent["ETag"]})

    async def _copy_part(self, source: str, start: int, end: int) -> None:
        """Start a server-side copy of [start, end) of `source` as the next part (at most
        COPY_CONCURRENCY run at once; a failed one fails the next `copy`/`finish`)."""
        while len(self._copies) >= COPY_CONCURRENCY:
            done, _ = await asyncio.wait(self._copies, return_when=asyncio.FIRST_COMPLETED)
            self._copies -= done
            for task in done:
                task.result()
        client, upload_id, number = await self._next_part()

        async def run() -> None:
            sent = await client.upload_part_copy(Bucket=self.bucket, Key=self.key, UploadId=upload_id,
                                                 PartNumber=number, CopySource={"Bucket": self.bucket, "Key": source},
                                                 CopySourceRange=f"bytes={start}-{end - 1}")
            self._parts.append({"PartNumber": number, "ETag": sent["CopyPartResult"]["ETag"]})

        self._copies.add(asyncio.ensure_future(run()))

    async def _read(self, source: str, start: int, end: int) -> bytes:
        client = await self._client()
        resp = await client.get_object(Bucket=self.bucket, Key=source, Range=f"bytes={start}-{end - 1}")
        body = resp["Body"]
        try:
            data = await run_blocking(body.read)
        finally:
            body.close()
        if len(data) != end - start:  # the source changed under us: never assemble a wrong object
            raise RuntimeError(f"copy of {source}: read {len(data)} bytes of range {start}-{end - 1}")
        return bytes(data)


if TYPE_CHECKING:
    def _implements_blob_upload(upload: S3Upload) -> BlobUpload:  # mypy checks the port's signatures
        return upload
