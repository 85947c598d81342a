"""The history archive on S3: the history items (messages and turns) DynamoDB's TTL removed from the
table, kept per tenant and session as gzip JSON Lines (docs/cloud-design.md, "History retention").

    archive/<tenant>/<session>/<first-created>-<hash>.jsonl.gz

`<tenant>` and `<session>` are the ids percent-escaped (`quote(id, safe="")`: ids never hold "/"
after it); `<first-created>` is the smallest `created_at` of the object's items (epoch ms, 16
digits), so a session's objects list oldest first; `<hash>` is 16 hex digits of the sha256 of the
sorted stream event ids of its items, so a batch the event source mapping retries writes the same
key again (never a second object). Each line is one item in DynamoDB JSON, exactly the stream's
`OldImage` (`{"PK": {"S": …}, "SK": {"S": …}, "body": {"S": …}, "created_at": {"N": "…"}, …}`): the
table's own codecs read it back, nothing is lost in a translation, and Athena reads it with the
JSON SerDe (docs/sessions.md). A bisected batch may archive an item in two objects; readers keep one
per sort key.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import zlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import quote

import botocore.session
import orjson

from agentvm.adapters.aws.s3_blobs import S3BlobStore

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

Item = dict[str, Any]

ARCHIVE_PREFIX: Final = "archive"
_SUFFIX: Final = ".jsonl.gz"
_DELETE_MAX: Final = 1000  # keys per DeleteObjects request
_GETS_AT_ONCE: Final = 8


class HistoryArchiveReader(Protocol):
    """What the table's reads and deletes need of the archive."""

    async def read_session(self, tenant_id: str, session_id: str) -> list[Item]: ...
    async def delete_session(self, tenant_id: str, session_id: str) -> int: ...


def session_prefix(tenant_id: str, session_id: str) -> str:
    """The key prefix of a session's objects (with the trailing "/")."""
    return f"{ARCHIVE_PREFIX}/{quote(tenant_id, safe='')}/{quote(session_id, safe='')}/"


def object_key(tenant_id: str, session_id: str, first_created_ms: int, event_ids: Iterable[str]) -> str:
    """The deterministic key of one batch's items of one session."""
    digest = hashlib.sha256("\n".join(sorted(event_ids)).encode()).hexdigest()[:16]
    return f"{session_prefix(tenant_id, session_id)}{max(first_created_ms, 0):016d}-{digest}{_SUFFIX}"


def encode_items(items: Sequence[Item]) -> bytes:
    """gzip JSON Lines; `mtime=0` so the same items give the same bytes (a retried PUT is identical)."""
    return gzip.compress(b"".join(orjson.dumps(_plain(i)) + b"\n" for i in items), mtime=0)


def _plain(item: Item) -> Item:
    """A message whose body the table keeps compressed (`bz`, base64 in a stream record) is archived
    with its body as JSON text (`body`): the object is gzipped as a whole anyway, and Athena reads it."""
    if "bz" not in item:
        return item
    packed = item["bz"]["B"]
    data = zlib.decompress(base64.b64decode(packed) if isinstance(packed, str) else packed)
    out = {k: v for k, v in item.items() if k != "bz"}
    out["body"] = {"S": data.decode()}
    return out


def decode_items(data: bytes) -> list[Item]:
    return [orjson.loads(line) for line in gzip.decompress(data).splitlines() if line]


class S3HistoryArchive:
    """`HistoryArchiveReader` and the writer of the archive function, on the deployment's bucket."""

    def __init__(self, bucket: str, *, session: botocore.session.Session | None = None,
                 endpoint_url: str | None = None, region_name: str | None = None) -> None:
        self.bucket = bucket
        self._blobs = S3BlobStore(bucket, session=session, endpoint_url=endpoint_url, region_name=region_name)

    async def open(self) -> None:
        await self._blobs.open()

    async def close(self) -> None:
        await self._blobs.close()

    async def write(self, key: str, items: Sequence[Item]) -> None:
        """One PUT of the items under `key` (an `object_key`)."""
        await self._blobs.put(key, encode_items(items), "application/x-ndjson")

    async def keys(self, tenant_id: str, session_id: str) -> list[str]:
        """The session's object keys, oldest first (one LIST request per 1,000 objects)."""
        s3 = await self._blobs.s3()
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": session_prefix(tenant_id, session_id)}
        keys: list[str] = []
        while True:
            resp = await s3.list_objects_v2(**params)
            keys += [o["Key"] for o in resp.get("Contents", [])]
            if not resp.get("IsTruncated"):
                return sorted(keys)
            params["ContinuationToken"] = resp["NextContinuationToken"]

    async def read_session(self, tenant_id: str, session_id: str) -> list[Item]:
        """Every archived item of the session, oldest object first: 1 LIST + 1 GET per object."""
        keys = await self.keys(tenant_id, session_id)
        sem = asyncio.Semaphore(_GETS_AT_ONCE)

        async def one(key: str) -> list[Item]:
            async with sem:
                data = await self._blobs.get(key)
            return decode_items(data) if data is not None else []  # deleted since the LIST

        pages = await asyncio.gather(*(one(k) for k in keys))
        return [item for page in pages for item in page]

    async def delete_session(self, tenant_id: str, session_id: str) -> int:
        """Delete the session's objects (deleting a session deletes its archive): the count."""
        keys = await self.keys(tenant_id, session_id)
        s3: S3Client = await self._blobs.s3()
        for start in range(0, len(keys), _DELETE_MAX):
            chunk = keys[start:start + _DELETE_MAX]
            resp = await s3.delete_objects(Bucket=self.bucket, Delete={
                "Objects": [{"Key": k} for k in chunk], "Quiet": True})
            errors = resp.get("Errors") or []
            if errors:
                raise RuntimeError(f"S3 DeleteObjects failed for {len(errors)} archive objects: "
                                   f"{errors[0].get('Code')} {errors[0].get('Message')}")
        return len(keys)
