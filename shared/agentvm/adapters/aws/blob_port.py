"""The BlobStore port: large payloads (attachments, big tool output, exports) kept out of the Store.

Defined here until it moves into `agentvm.ports`; the S3 adapter implements it, a filesystem
adapter will implement it for the local emulator.
"""

from __future__ import annotations

from typing import Protocol


class BlobStore(Protocol):
    """Bytes by key. Keys are relative paths (`a/b.txt`): no leading `/`, no `.` or `..` segment."""

    async def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """Store (or replace) the blob; returns the key."""
        ...

    async def get(self, key: str) -> bytes | None:
        """The blob, or None when there is none."""
        ...

    async def delete(self, key: str) -> bool:
        """True when a blob was deleted."""
        ...

    async def exists(self, key: str) -> bool: ...

    async def url(self, key: str, expires_s: int = 3600) -> str:
        """A time-limited URL that reads the blob without credentials (presigned GET)."""
        ...
