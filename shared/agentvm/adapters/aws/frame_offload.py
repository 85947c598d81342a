"""Where the API Gateway gateway puts frames too big to send inline: S3, read back by presigned URL.

The gateway names the object (`frames/{yyyy}/{mm}/{dd}/{sha256}.json`, so the same content always
gets the same key) and posts the client a small frame that references the URL instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agentvm.ports import BlobStore

#: How long a client has to fetch an offloaded frame.
FRAME_URL_EXPIRES_S = 15 * 60


class BlobOffload(Protocol):
    async def put_frame(self, key: str, data: bytes) -> str:
        """Store `data` (one frame's JSON) under `key`; return a URL that reads it without credentials."""
        ...


class S3FrameOffload:
    """`BlobOffload` over a `BlobStore` (in the cloud: `S3BlobStore` on the `AVM_BUCKET` bucket)."""

    def __init__(self, blobs: BlobStore, *, expires_s: int = FRAME_URL_EXPIRES_S) -> None:
        self.blobs = blobs
        self.expires_s = expires_s

    async def put_frame(self, key: str, data: bytes) -> str:
        await self.blobs.put(key, data, "application/json")
        return await self.blobs.url(key, self.expires_s)
