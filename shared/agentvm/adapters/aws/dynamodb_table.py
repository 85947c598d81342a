"""The one DynamoDB table (on-demand) of the Store, through botocore (`botocore_async`): its layout, and
the client and request helpers its repositories (`dynamodb_images`, `dynamodb_session_log`, …) share.

Single-table design. Every id in a key is escaped (`%` → `%25`, `#` → `%23`), so a client-chosen id
can never forge another tenant's key. `{created}` is epoch ms zero-padded to 16 digits, `{seq}` is
zero-padded to 20 digits, so string order is numeric order.

| Entity    | PK               | SK                | Index keys: GSI partition / sort                   | TTL        |
|-----------|------------------|-------------------|----------------------------------------------------|------------|
| Container | CONT#{t}#{cid}   | CONT              | 1: TENANT#{t}#CONT / {created}#{cid}               | –          |
| Image     | IMG#{t}#{iid}    | IMG               | 1: TENANT#{t}#IMG / {created}#{iid}                | –          |
|           |                  |                   | 2: CONT#{t}#{cid} / IMG#{created}#{iid}            |            |
| Agent     | IMG#{t}#{iid}    | AGENT             | 1: TENANT#{t}#AGENT / {created}#{aid}              | –          |
|           |                  |                   | 2: CONT#{t}#{cid} / AGENT#{created}#{aid}          |            |
|           |                  |                   | 3: AGENT#{t}#{aid}                                 |            |
| Session   | SESS#{t}#{sid}   | SESS              | 4: EVLOG#{shard} / {t}#{sid}                       | –          |
| (entry)   | IMG#{t}#{iid}    | SESS#{created}#{sid} | – (the image's sessions, for `list_sessions`)   | –          |
|           |                  |                   | 1: TENANT#{t}#SESS / {created}#{sid} (`list_tenant_sessions`) | – |
| Message   | SESS#{t}#{sid}   | MSG#~{created}#{mid} | –                                               | –          |
| Events    | SESS#{t}#{sid}   | EVB#{last}        | –                                                  | expires_at |
| (parts)   | SESS#{t}#{sid}   | EVB#{last}#{part} | – (only for one event above 300 KB compressed)     | expires_at |
| (search)  | SRCH#{t}#{yyyymm} | {created}#{sid}#{mid} | – (a message's searchable text, by month)      | –          |
| Turn      | SESS#{t}#{sid}   | TURN#{turn_id}    | 3: TURN#{t}#{turn_id}                              | –          |
|           |                  |                   | 4: TURN#{status}#{shard} / {created}#{t}#{turn_id} |            |
|           |                  |                   |    (only while queued or running)                  |            |
| Resource  | RES#{t}#{rid}    | RES               | 1: TENANT#{t}#RES / {kn}#{t} (order-preserving)    | –          |
|           |                  |                   | 3: PUBRES#{rid} (only while published)             |            |
| (version) | RES#{t}#{rid}    | V#{vkey}#{ver}    | –                                                  | –          |
| (name)    | RESNAME#{t}#{kn} | RESNAME           | –                                                  | –          |
| (public)  | PUBNAME#{kn}     | PUBNAME           | 1: PUBLIC#RES / {kn}#{t} (order-preserving)        | –          |

`{kn}` is `{kind}#{name}`.

A message item holds the AgentX message as JSON text (`body`), or zlib-compressed (`bz`) when it is
above 512 bytes and that is smaller: write units are per KB, and prose compresses about 2.5x.

An event block, keyed by `{last}` (the last seq in it), holds events of one checkpoint:
`first_seq`, `last_seq`, `n`, `created_at` and `oldest_created_at` (the newest and oldest event
time, for pruning), and `data`, the zlib-compressed orjson of `[[seq, type, payload, created_at],
...]` in seq order (payloads are the encoded JSON envelopes, byte for byte). Above `_BLOCK_BYTES`
(300 KB) compressed, a checkpoint's events are halved into several blocks; a single event above it
(a 1 MB tool result) keeps one block whose `data` continues in part items `#0001`…, `parts` on the
block counting all its items. "#" sorts below every digit, so a block's parts come right after it
and before the next block.

GSI1 (G1PK/G1SK, projection ALL): tenant-wide lists. GSI2 (G2PK/G2SK, ALL): container-wide lists.
GSI3 (G3PK, KEYS_ONLY): lookup by id. GSI4 (SPK/SSK, KEYS_ONLY): sparse maintenance index.

(`{shard}` = crc32 of the tenant and id modulo 8: the sparse keys are global, so they are spread
over 8 partitions each; only maintenance reads them, with one Query per shard.)

Why this shape:

* Per-user data is keyed by session (messages, events, turns: one item collection per
  conversation) or by image (image + its agent), never by tenant, so a big tenant has no hot
  partition on the write path (search items are the exception, by tenant and month: see Search
  below). Tenant-wide lists (containers, images, agents: written rarely) go
  through GSI1; container-wide lists through GSI2, newest first with `ScanIndexForward=False`.
* `put_agent` is a conditional put of the image-keyed AGENT item: one agent per image by
  construction, and a lost race answers with the winner in the same response
  (`ReturnValuesOnConditionCheckFailure=ALL_OLD`).
* GSI3 (by id) and GSI4 (sparse) are KEYS_ONLY: turns are rewritten at every state change, and
  with KEYS_ONLY those rewrites cost no index write unless a key changes. Lookups through them
  read the base item afterwards with a strongly consistent GetItem/BatchGetItem.
* GSI4 holds only turns that are queued or running (the attribute is absent otherwise), keyed on
  the status, for `list_unfinished_turns`; and sessions that may hold events, for `prune_events`.
  No Scan anywhere.
* Events are written as one compressed block per checkpoint, not one item per event, because
  on-demand bills a write unit per item per started KB. Measured on the events of real turns
  (`avm serve`, scripted driver): with every delta sent, a 20-delta turn is 29 events, 9.0 KB of
  envelopes: as items of their own 13.2 KB in 29 items = 29 WCU, as one block 1.1 KB of zlib data
  in a 1.3 KB item = 2 WCU; a 100-delta turn is 109 events, 32.5 KB: 110 WCU before, one 2.6 KB
  item = 3 WCU after. With the cloud's coalescing (`stream_max_flush_ms` 1000) a 100-delta turn
  is 11 events, 5.5 KB: 13 WCU before, one 1.4 KB item = 2 WCU after. zlib level 6 is 10-12 %
  smaller than level 1 for 0.02-0.2 ms more CPU per checkpoint: worth it when a KB costs a unit.
* Blocks are keyed by their last seq, so `read_events(after)` is one Query from `EVB#{after}~` on
  (the block holding `after + 1` is the first key above it), dropping the events up to `after` of
  that first block. `last_seq` reads the key of the last item (one Query, descending, Limit 1).
* Event blocks carry `expires_at` (epoch seconds, write time + `event_ttl_s`, default 48 h):
  DynamoDB deletes them for free, lazily, so reads drop blocks whose `expires_at` has passed. TTL
  also ends the newest event of a session (which the SQLite prune keeps); seqs still never go back
  because they come from `seq_reserved` on the session item, not from the log.
* Messages are keyed by id and event blocks by their last seq, so a replayed checkpoint rewrites
  the same items (same content) instead of adding any. Blocks are never updated in place (only
  `prune_events` rewrites one without its pruned events). Messages carry `pos` (the writer's
  clock in ns, strictly increasing per process): `list_messages` sorts by it, which is insertion
  order like SQLite's `pos` (a replayed message takes the position of the replay).
* Strings stay strings (money, config/body as JSON text); numbers are read back as `int`.
* Resources (the resource center): a head item `RES` holds the identity, the visibility, a
  `revision` counter and the latest version's `version`, `version_key`, `description` and `tags`;
  each immutable version is an item of the same partition (content, dependencies and tags as JSON
  text). Names are claimed by conditional puts in the same transaction as the head: `RESNAME`
  (one resource per tenant, kind and name) and, while published, `PUBNAME` (one per kind and
  name across tenants; it carries the same latest-version attributes). Lists read GSI1: the
  tenant's heads and the `PUBLIC#RES` partition of published names, merged; their sort key is
  escaped order-preserving (`_ordered`) so the merge, the name-prefix key condition and the
  cursor (the last sort key) agree with the (kind, name, owner) order. Another tenant reaches a
  published resource by id through the head's sparse GSI3 key. Every write that changes the
  visibility or the latest version is one transaction conditional on the head's `revision`.
  A version is limited by DynamoDB's 400 KB item size.
* Search (`search_messages`): each message with searchable text (agentvm.domain.message_text, at
  most 8 KB) gets a search item in its tenant's partition of the message's month (UTC): role,
  subtype and the text (zlib-compressed as `z` when smaller; time and ids are in the sort key),
  written in the same BatchWriteItem as the message (one item more: 1 WCU for most messages, 2
  for a reply of a few thousand characters); the message carries `srch` so that deleting its
  session computes the search item's key and deletes it first. A search reads the newest months first
  (eventually consistent Queries: 0.5 RRU per 4 KB), ranks each window of up to
  `search_window_items` items in memory with FTS5 (BM25), reads at most `search_budget_items`
  items per call and goes `search_months` (24) back; a consistent BatchGetItem of the page's
  sessions drops hits of a session deleted halfway. Keyed by tenant and month, a tenant never
  reads another's items, and no search scans. A tenant's current month is one partition: about
  1,000 messages per second per tenant before it throttles (a shard suffix would lift it).
* Not carried over from SQLite on purpose: `commit` does not advance `Session.updated_at` (that
  would be a second write per message; nothing reads it).

Request counts per operation (R = read, W = write request; on-demand bills units, not requests):
create_container 1 W · get_container 1 R · list_containers 1 R/page · create_image 1 W
(TransactWriteItems, 3 items) · get_image 1 R · list_images 1 R/page · update_image 1 W ·
delete_image 2 R + 1 R/page per session + ceil(n/25) W + 1 W (n counts the messages' search items
too) · get_session 1 R · create_session 1 W
(TransactWriteItems: a check of the image and 2 items) · list_sessions 1 R/page ·
list_tenant_sessions 1 R/page · delete_session 1 R
+ 1 W + 1 R/page + ceil(n/25) W · put_agent 1 W ·
get_agent 2 R · get_agent_for_image 1 R · get_image_and_agent 1 R (one Query, 1 unit for both) ·
list_agents 1 R/page · delete_agent 1 R + 1 W ·
commit ceil(items/25) W, where a checkpoint's events are 1 item (more only above 300 KB
compressed) and each message with searchable text adds its search item: a text turn's final
checkpoint is 1 W of 4 items · list_messages 1 R/page · search_messages 1 R per month partition
read (Queries of 1, 2, 4, … months at once; 24 R when nothing matches in 24 months; a page that
ends inside a window reads that window again) + 1 R (BatchGetItem of the page's sessions) · get_turn
2 R · list_turns 1 R/page · read_events 1 R/page (a page is up to 1 MB of blocks) · last_seq 1 R ·
reserve_seqs 1 R + 1 W (+1 W if a seq was logged beyond every reservation) · prune_events 8 R +
per session (1 R + 1 R per block cut in part + ceil(n/25) W, n = blocks deleted or rewritten) ·
list_unfinished_turns 16 R + ceil(n/100) R · create_resource 1 W (TransactWriteItems, 3 items, 4
when published) · add_resource_version 1 R + 1 W (TransactWriteItems, 2 items, 3 when the
published name changes; again when another version was added meanwhile) · resource_versions 1
R/page (own), 3 R (another tenant's published one), 2 R (none) · find_resource 1 R (BatchGetItem
of both name claims) + 1 R/page · list_resources 2 R (one Query per list, more when filters drop
items) + 1 R (BatchGetItem of the page's versions) · delete_resource 1 R/page + ceil(n/25) W + 1 W
(TransactWriteItems, 2-3 items); 1 R when absent.
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, cast

import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError

from agentvm.adapters.aws.botocore_async import AsyncBotocoreClient, new_client
from agentvm.adapters.aws.dynamodb_items import (
    ARCHIVED_ATTRIBUTE,
    TTL_ATTRIBUTE,
    Item,
    _failed_conditions,
    _key,
    _s,
    _session_pk,
)

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient

    from agentvm.adapters.aws.s3_history_archive import HistoryArchiveReader

GSI_TENANT: Final = "GSI1"
GSI_CONTAINER: Final = "GSI2"
GSI_BY_ID: Final = "GSI3"
GSI_SPARSE: Final = "GSI4"
DEFAULT_EVENT_TTL_S: Final = 48 * 3600

#: The key schema, in one place: `create_table` uses it and the SAM template is checked against it.
TABLE_DEFINITION: Final[dict[str, Any]] = {
    "AttributeDefinitions": [
        {"AttributeName": name, "AttributeType": "S"}
        for name in ("PK", "SK", "G1PK", "G1SK", "G2PK", "G2SK", "G3PK", "SPK", "SSK")
    ],
    "KeySchema": [{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
    "GlobalSecondaryIndexes": [
        {"IndexName": GSI_TENANT,
         "KeySchema": [{"AttributeName": "G1PK", "KeyType": "HASH"}, {"AttributeName": "G1SK", "KeyType": "RANGE"}],
         "Projection": {"ProjectionType": "ALL"}},
        {"IndexName": GSI_CONTAINER,
         "KeySchema": [{"AttributeName": "G2PK", "KeyType": "HASH"}, {"AttributeName": "G2SK", "KeyType": "RANGE"}],
         "Projection": {"ProjectionType": "ALL"}},
        {"IndexName": GSI_BY_ID,
         "KeySchema": [{"AttributeName": "G3PK", "KeyType": "HASH"}],
         "Projection": {"ProjectionType": "KEYS_ONLY"}},
        {"IndexName": GSI_SPARSE,
         "KeySchema": [{"AttributeName": "SPK", "KeyType": "HASH"}, {"AttributeName": "SSK", "KeyType": "RANGE"}],
         "Projection": {"ProjectionType": "KEYS_ONLY"}},
    ],
    "TimeToLive": {"AttributeName": TTL_ATTRIBUTE, "Enabled": True},
}

_CONFIG = Config(connect_timeout=3, read_timeout=10, retries={"mode": "standard", "max_attempts": 5})
_BATCH_WRITE_MAX = 25
_BATCH_GET_MAX = 100


class DynamoTable:
    """The table's client (created once by `open()`, reused until `close()`), clock and request
    helpers: the base of every repository on the table, which the `DynamoDBStore` façade combines."""

    #: UnprocessedItems/Keys are retried with full-jitter exponential backoff from this base.
    backoff_base_s: float = 0.05
    backoff_attempts: int = 8

    def __init__(self, table_name: str, *, session: botocore.session.Session | None = None,
                 endpoint_url: str | None = None, region_name: str | None = None,
                 event_ttl_s: int = DEFAULT_EVENT_TTL_S, history_hot_days: int = 0,
                 archive: HistoryArchiveReader | None = None, clock: Callable[[], float] = time.time) -> None:
        """`history_hot_days`: how long a history item (message, search item, turn) stays in the table
        after its last write (0: forever); `archive`: where the items TTL removed are read back
        (`s3_history_archive`; None: nowhere, reads see the hot items only)."""
        self.table_name = table_name
        self._session = session
        self._endpoint_url = endpoint_url
        self._region_name = region_name
        self._event_ttl_s = event_ttl_s
        self._history_ttl_s = history_hot_days * 86_400
        self.archive = archive
        self._clock = clock
        self._client: DynamoDBClient | None = None
        self._open_lock = asyncio.Lock()
        self._last_pos = 0

    async def open(self) -> None:
        async with self._open_lock:
            if self._client is not None:
                return
            # The awaitable botocore client behaves like the aiobotocore client these types describe.
            self._client = cast("DynamoDBClient", new_client(
                "dynamodb", session=self._session, endpoint_url=self._endpoint_url,
                region_name=self._region_name, config=_CONFIG))

    async def close(self) -> None:
        async with self._open_lock:
            client, self._client = self._client, None
            if client is not None:
                await cast(AsyncBotocoreClient, client).close()

    @property
    def client(self) -> DynamoDBClient:
        if self._client is None:
            raise RuntimeError("store is not open")
        return self._client

    async def create_table(self, *, billing: Literal["PAY_PER_REQUEST", "PROVISIONED"] = "PAY_PER_REQUEST",
                           capacity_units: int = 5) -> None:
        """Create the table from `TABLE_DEFINITION` (tests and local tooling; production uses SAM)."""
        spec = copy.deepcopy(TABLE_DEFINITION)
        ttl = spec.pop("TimeToLive")
        params: dict[str, Any] = {"TableName": self.table_name, "BillingMode": billing, **spec}
        if billing == "PROVISIONED":
            throughput = {"ReadCapacityUnits": capacity_units, "WriteCapacityUnits": capacity_units}
            params["ProvisionedThroughput"] = throughput
            for gsi in params["GlobalSecondaryIndexes"]:
                gsi["ProvisionedThroughput"] = dict(throughput)
        await self.client.create_table(**params)
        await self.client.get_waiter("table_exists").wait(TableName=self.table_name,
                                                           WaiterConfig={"Delay": 1, "MaxAttempts": 60})
        await self.client.update_time_to_live(TableName=self.table_name, TimeToLiveSpecification=ttl)

    def _put_op(self, item: Item, condition: str, **expression: Any) -> Item:
        return {"Put": {"TableName": self.table_name, "Item": item, "ConditionExpression": condition, **expression}}

    async def _transact(self, ops: list[Item]) -> list[bool]:
        """Write `ops` in one transaction: [] when written, else per operation whether its condition
        failed. A cancellation without a failed condition (a conflicting transaction) raises."""
        try:
            await self.client.transact_write_items(TransactItems=cast(Any, ops))
        except ClientError as exc:
            failed = _failed_conditions(exc)
            if not any(failed):
                raise
            return failed + [False] * (len(ops) - len(failed))
        return []

    async def _get(self, pk: str, sk: str) -> Item | None:
        resp = await self.client.get_item(TableName=self.table_name, Key=_key(pk, sk), ConsistentRead=True)
        return resp.get("Item")

    async def _query(self, **params: Any) -> list[Item]:
        items: list[Item] = []
        while True:
            resp = await self.client.query(TableName=self.table_name, **params)
            items.extend(resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return items
            params["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    async def _by_id(self, g3pk: str) -> Item | None:
        """GSI3 finds the base key; a consistent GetItem reads the item itself."""
        found = await self._query(IndexName=GSI_BY_ID, KeyConditionExpression="G3PK = :pk",
                                  ExpressionAttributeValues={":pk": _s(g3pk)})
        for k in found:
            item = await self._get(k["PK"]["S"], k["SK"]["S"])
            if item is not None:
                return item
        return None

    async def _sparse_keys(self, partitions: Sequence[str]) -> list[Item]:
        pages = await asyncio.gather(*(
            self._query(IndexName=GSI_SPARSE, KeyConditionExpression="SPK = :pk",
                        ExpressionAttributeValues={":pk": _s(p)}) for p in partitions))
        return [k for page in pages for k in page]

    async def _batch_write(self, requests: list[Item]) -> None:
        async def send(chunk: list[Item]) -> list[Item]:
            request_items: dict[str, Any] = {self.table_name: chunk}
            resp = await self.client.batch_write_item(RequestItems=request_items)
            unprocessed: Mapping[str, Any] = resp.get("UnprocessedItems") or {}
            return list(unprocessed.get(self.table_name, []))

        for start in range(0, len(requests), _BATCH_WRITE_MAX):
            await self._with_backoff(send, requests[start:start + _BATCH_WRITE_MAX], "BatchWriteItem")

    async def _batch_get(self, keys: list[Item]) -> list[Item]:
        found: list[Item] = []

        async def send(chunk: list[Item]) -> list[Item]:
            request_items: dict[str, Any] = {self.table_name: {"Keys": chunk, "ConsistentRead": True}}
            resp = await self.client.batch_get_item(RequestItems=request_items)
            responses: Mapping[str, Any] = resp.get("Responses") or {}
            found.extend(responses.get(self.table_name, []))
            unprocessed: Mapping[str, Any] = resp.get("UnprocessedKeys") or {}
            return list(unprocessed.get(self.table_name, {}).get("Keys", []))

        for start in range(0, len(keys), _BATCH_GET_MAX):
            await self._with_backoff(send, keys[start:start + _BATCH_GET_MAX], "BatchGetItem")
        return found

    async def _with_backoff(self, send: Callable[[list[Item]], Awaitable[list[Item]]], pending: list[Item],
                            what: str) -> None:
        for attempt in range(self.backoff_attempts):
            if attempt:
                await asyncio.sleep(random.uniform(0, self.backoff_base_s * 2 ** (attempt - 1)))
            pending = await send(pending)
            if not pending:
                return
        raise RuntimeError(f"DynamoDB {what} left {len(pending)} items unprocessed after "
                           f"{self.backoff_attempts} attempts")

    async def _session_history(self, tenant_id: str, session_id: str, prefix: str, low: str, high: str) -> list[Item]:
        """The session's history items whose sort key starts with `prefix`, hot and archived, one
        per sort key (the hot one when both exist).

        One consistent Query of the sort keys `low`..`high`, a range chosen to hold the session item
        too ("MSG#" < "SESS" < "TURN#"): its `archived_at` mark says whether TTL removed any history
        (into the archive), so a session without it costs no S3 request. Items past their
        `expires_at` but not yet removed are kept: they are in no archive yet."""
        items = await self._query(KeyConditionExpression="PK = :pk AND SK BETWEEN :lo AND :hi", ConsistentRead=True,
                                  ExpressionAttributeValues={":pk": _s(_session_pk(tenant_id, session_id)),
                                                             ":lo": _s(low), ":hi": _s(high)})
        hot = {i["SK"]["S"]: i for i in items if i["SK"]["S"].startswith(prefix)}
        marked = any(i["SK"]["S"] == "SESS" and ARCHIVED_ATTRIBUTE in i for i in items)
        if not marked or self.archive is None:
            return list(hot.values())
        archived = {i["SK"]["S"]: i for i in await self.archive.read_session(tenant_id, session_id)
                    if str(i.get("SK", {}).get("S", "")).startswith(prefix)}
        return list({**archived, **hot}.values())

    def _history_expiry(self) -> int | None:
        """`expires_at` (epoch s) of a history item written now; None when history is kept forever."""
        return int(self._clock()) + self._history_ttl_s if self._history_ttl_s else None

    def _next_pos(self) -> int:
        self._last_pos = max(self._last_pos + 1, time.time_ns())
        return self._last_pos
