"""The table's DynamoDB Stream to the history archive: what `functions/history_archive` runs.

The event source mapping delivers batches of stream records (StreamViewType OLD_IMAGE), filtered to
REMOVE records made by TTL (`userIdentity` `{"type": "Service", "principalId":
"dynamodb.amazonaws.com"}`). Only history items are archived: messages (`MSG#…`) and turns
(`TURN#…`) of a session's partition; the other items TTL removes (event blocks, connections,
search items, whose text is in their message) are dropped here too, in case the filter lets them
through. Per tenant and session, each batch's items become one object
(`s3_history_archive.object_key`): one PUT per session per batch, none per item.

Before its PUT, each session's item is marked `archived_at` (one UpdateItem, conditional on the
session existing): reads of a session without the mark never call S3. A session deleted
meanwhile is not archived. Any failure raises after every session of the batch was tried, so the
event source mapping retries the batch (it bisects a failing one); a retried batch writes the same
keys again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote

from agentvm.adapters.aws.s3_history_archive import object_key

if TYPE_CHECKING:
    from agentvm.adapters.aws.dynamodb_session_log import DynamoSessionLog
    from agentvm.adapters.aws.s3_history_archive import S3HistoryArchive

Item = dict[str, Any]

TTL_PRINCIPAL: Final = "dynamodb.amazonaws.com"
HISTORY_SORT_KEYS: Final = ("MSG#", "TURN#")
_SESSIONS_AT_ONCE: Final = 16


@dataclass(slots=True)
class SessionBatch:
    """One session's history items of a batch, with the ids of the records that removed them."""

    tenant_id: str
    session_id: str
    items: list[Item] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        first = min((int(i["created_at"]["N"]) for i in self.items if "created_at" in i), default=0)
        return object_key(self.tenant_id, self.session_id, first, self.event_ids)


def removed_by_ttl(record: Mapping[str, Any]) -> bool:
    identity = record.get("userIdentity") or {}
    return (record.get("eventName") == "REMOVE" and identity.get("type") == "Service"
            and identity.get("principalId") == TTL_PRINCIPAL)


def _session_ids(pk: str) -> tuple[str, str] | None:
    """(tenant, session) of a session partition key `SESS#{t}#{sid}` (ids escaped: no "#" inside)."""
    parts = pk.split("#")
    if len(parts) != 3 or parts[0] != "SESS":
        return None
    return unquote(parts[1]), unquote(parts[2])


def session_batches(records: Iterable[Mapping[str, Any]]) -> list[SessionBatch]:
    """The batch's history items removed by TTL, per session, in the records' order."""
    batches: dict[tuple[str, str], SessionBatch] = {}
    for record in records:
        if not removed_by_ttl(record):
            continue
        image: Item | None = (record.get("dynamodb") or {}).get("OldImage")
        if not image or not str(image.get("SK", {}).get("S", "")).startswith(HISTORY_SORT_KEYS):
            continue
        ids = _session_ids(str(image.get("PK", {}).get("S", "")))
        if ids is None:
            continue
        batch = batches.setdefault(ids, SessionBatch(*ids))
        batch.items.append(image)
        batch.event_ids.append(str(record["eventID"]))
    return list(batches.values())


async def archive_records(records: Iterable[Mapping[str, Any]], table: DynamoSessionLog,
                          archive: S3HistoryArchive) -> dict[str, Any]:
    """Archive a stream batch; raises (after trying every session) when any session failed.
    Returns what was written: {"sessions", "items", "objects": [keys], "skipped": deleted sessions}."""
    batches = session_batches(records)
    sem = asyncio.Semaphore(_SESSIONS_AT_ONCE)

    async def one(batch: SessionBatch) -> str | None:
        async with sem:
            if not await table.mark_archived(batch.tenant_id, batch.session_id):
                return None  # the session was deleted: its history goes with it
            await archive.write(batch.key, batch.items)
            return batch.key

    results = await asyncio.gather(*(one(b) for b in batches), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise failed[0]
    written = [r for r in results if isinstance(r, str)]
    return {"sessions": len(batches), "items": sum(len(b.items) for b, r in zip(batches, results, strict=True)
                                                   if isinstance(r, str)),
            "objects": written, "skipped": len(batches) - len(written)}
