"""The Store port on one DynamoDB table (on-demand), through botocore (`botocore_async`).

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
| Message   | SESS#{t}#{sid}   | MSG#{mid}         | –                                                  | –          |
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
(TransactWriteItems: a check of the image and 2 items) · list_sessions 1 R/page · delete_session 1 R
+ 1 W + 1 R/page + ceil(n/25) W · put_agent 1 W ·
get_agent 2 R · get_agent_for_image 1 R · list_agents 1 R/page · delete_agent 1 R + 1 W ·
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
import base64
import binascii
import copy
import itertools
import random
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, cast
from urllib.parse import unquote

import botocore.session
import orjson
from botocore.config import Config
from botocore.exceptions import ClientError

from agentvm.adapters.aws.botocore_async import AsyncBotocoreClient, new_client
from agentvm.adapters.sqlite_fts import rank_texts
from agentvm.domain.cursors import next_turn_cursor, turn_cursor
from agentvm.domain.message_text import (
    bad_cursor,
    cursor_int,
    match_expression,
    search_cursor,
    search_cursor_state,
    searchable_text,
)
from agentvm.domain.models import (
    Agent,
    Checkpoint,
    Container,
    Image,
    LoggedEvent,
    ResourceVersion,
    SearchHit,
    Session,
    StoredMessage,
    Turn,
    TurnStatus,
    Usage,
)
from agentvm.errors import Conflict, InvalidRequest, NotFound

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient
    from types_aiobotocore_dynamodb.type_defs import TransactWriteItemTypeDef

Item = dict[str, Any]

TTL_ATTRIBUTE: Final = "expires_at"
GSI_TENANT: Final = "GSI1"
GSI_CONTAINER: Final = "GSI2"
GSI_BY_ID: Final = "GSI3"
GSI_SPARSE: Final = "GSI4"
SHARDS: Final = 8
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
_EVB = "EVB#"
_EVB_HI = "EVB#~"  # "~" sorts after every digit and "#"
_EVB_HEAD_LEN = len(f"{_EVB}{0:020d}")  # a block's head item; its parts' keys are longer
#: Compressed bytes per item: a block holds at most this much, and the compressed data of a single
#: event above it is continued in part items. DynamoDB's item limit is 400 KB, names included.
_BLOCK_BYTES = 300_000
#: zlib level: 6 is 10-15 % smaller than 1 on a turn's events for ~0.1-0.2 ms more per checkpoint.
_ZLIB_LEVEL = 6
_UNFINISHED = (TurnStatus.QUEUED, TurnStatus.RUNNING)
_RES_HEAD = "RES"
_PUBLIC_LIST = "PUBLIC#RES"  # the GSI1 partition of every tenant's published resources
#: The latest version's attributes a resource's listed items carry (what list filters read).
_LATEST = ("version", "version_key", "description", "tags")


class DynamoDBStore:
    """`Store` on DynamoDB. The client is created once by `open()` and reused until `close()`."""

    #: UnprocessedItems/Keys are retried with full-jitter exponential backoff from this base.
    backoff_base_s: float = 0.05
    backoff_attempts: int = 8
    #: `search_messages`: the items ranked together (one BM25 window, read newest first), the items
    #: one call reads at most (whole windows), and how many months back from now a search goes.
    search_window_items: int = 500
    search_budget_items: int = 2000
    search_months: int = 24

    def __init__(self, table_name: str, *, session: botocore.session.Session | None = None,
                 endpoint_url: str | None = None, region_name: str | None = None,
                 event_ttl_s: int = DEFAULT_EVENT_TTL_S, clock: Callable[[], float] = time.time) -> None:
        self.table_name = table_name
        self._session = session
        self._endpoint_url = endpoint_url
        self._region_name = region_name
        self._event_ttl_s = event_ttl_s
        self._clock = clock
        self._client: DynamoDBClient | None = None
        self._open_lock = asyncio.Lock()
        self._last_pos = 0

    # ---- lifecycle ---------------------------------------------------------------------------

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

    # ---- containers --------------------------------------------------------------------------

    async def create_container(self, container: Container) -> bool:
        t, cid = container.tenant_id, container.container_id
        item = {
            "PK": _s(f"CONT#{_k(t)}#{_k(cid)}"), "SK": _s("CONT"),
            "G1PK": _s(f"TENANT#{_k(t)}#CONT"), "G1SK": _s(f"{_ts(container.created_at)}#{_k(cid)}"),
            "tenant_id": _s(t), "container_id": _s(cid),
            "created_at": _n(container.created_at), "updated_at": _n(container.updated_at),
        }
        try:
            await self.client.put_item(TableName=self.table_name, Item=item,
                                       ConditionExpression="attribute_not_exists(PK)")
        except ClientError as exc:
            if _conditional_failed(exc):
                return False
            raise
        return True

    async def get_container(self, tenant_id: str, container_id: str) -> Container | None:
        item = await self._get(f"CONT#{_k(tenant_id)}#{_k(container_id)}", "CONT")
        return _container(item) if item else None

    async def list_containers(self, tenant_id: str) -> list[Container]:
        items = await self._query(IndexName=GSI_TENANT, KeyConditionExpression="G1PK = :pk",
                                  ExpressionAttributeValues={":pk": _s(f"TENANT#{_k(tenant_id)}#CONT")})
        return [_container(i) for i in items]

    # ---- images and sessions -----------------------------------------------------------------

    async def create_image(self, image: Image, session: Session) -> None:
        t, iid, cid = image.tenant_id, image.image_id, image.container_id
        created = _ts(image.created_at)
        image_item: Item = {
            "PK": _s(_image_pk(t, iid)), "SK": _s("IMG"),
            "G1PK": _s(f"TENANT#{_k(t)}#IMG"), "G1SK": _s(f"{created}#{_k(iid)}"),
            "G2PK": _s(f"CONT#{_k(t)}#{_k(cid)}"), "G2SK": _s(f"IMG#{created}#{_k(iid)}"),
            "tenant_id": _s(t), "image_id": _s(iid), "container_id": _s(cid), "session_id": _s(image.session_id),
            "name": _s(image.name), "created_at": _n(image.created_at), "updated_at": _n(image.updated_at),
            # JSON text, not a map: nested floats would come back as Decimal otherwise.
            "config": _s(orjson.dumps(image.config).decode()),
        }
        _put_opt(image_item, "description", image.description)
        _put_opt(image_item, "system_prompt", image.system_prompt)
        # A transaction: the image, its session and the session's entry in the image's partition
        # appear together, and an existing session (with its seq reservation) is never overwritten.
        # Images are created rarely; the 3x write cost is noise.
        try:
            await self.client.transact_write_items(TransactItems=[
                _put_new(self.table_name, item) for item in (image_item, *_session_items(session))])
        except ClientError as exc:
            if _error_code(exc) == "TransactionCanceledException":
                raise Conflict(f"Image or session already exists: {iid}") from exc
            raise

    async def get_image(self, tenant_id: str, image_id: str) -> Image | None:
        item = await self._get(_image_pk(tenant_id, image_id), "IMG")
        return _image(item) if item else None

    async def list_images(self, tenant_id: str, container_id: str | None = None) -> list[Image]:
        if container_id is None:
            items = await self._query(
                IndexName=GSI_TENANT, KeyConditionExpression="G1PK = :pk", ScanIndexForward=False,
                ExpressionAttributeValues={":pk": _s(f"TENANT#{_k(tenant_id)}#IMG")})
        else:
            items = await self._query(
                IndexName=GSI_CONTAINER, KeyConditionExpression="G2PK = :pk AND begins_with(G2SK, :img)",
                ScanIndexForward=False,
                ExpressionAttributeValues={":pk": _s(f"CONT#{_k(tenant_id)}#{_k(container_id)}"),
                                           ":img": _s("IMG#")})
        return [_image(i) for i in items]

    async def update_image(self, tenant_id: str, image_id: str, *, name: str | None,
                           description: str | None, updated_at: int) -> Image | None:
        sets = ["#u = :u"]
        names = {"#u": "updated_at"}
        values: Item = {":u": _n(updated_at)}
        if name is not None:
            sets.append("#n = :n")
            names["#n"], values[":n"] = "name", _s(name)
        if description is not None:
            sets.append("#d = :d")
            names["#d"], values[":d"] = "description", _s(description)
        try:
            resp = await self.client.update_item(
                TableName=self.table_name, Key=_key(_image_pk(tenant_id, image_id), "IMG"),
                UpdateExpression="SET " + ", ".join(sets), ConditionExpression="attribute_exists(PK)",
                ExpressionAttributeNames=names, ExpressionAttributeValues=values, ReturnValues="ALL_NEW")
        except ClientError as exc:
            if _conditional_failed(exc):
                return None
            raise
        return _image(resp["Attributes"])

    async def delete_image(self, tenant_id: str, image_id: str) -> bool:
        image_pk = _image_pk(tenant_id, image_id)
        item = await self._get(image_pk, "IMG")
        if item is None:
            return False
        # The image's partition lists its sessions (entries `SESS#…`) besides the agent. Everything
        # of one session (the session item, messages, events, turns) shares the session's partition
        # key: one Query each finds it all. The image item goes last, so an interrupted delete is redone.
        entries = await self._query(KeyConditionExpression="PK = :pk AND begins_with(SK, :s)",
                                    ProjectionExpression="PK, SK, session_id", ConsistentRead=True,
                                    ExpressionAttributeValues={":pk": _s(image_pk), ":s": _s("SESS#")})
        sids = dict.fromkeys([item["session_id"]["S"], *(e["session_id"]["S"] for e in entries)])
        keys = [{"PK": e["PK"], "SK": e["SK"]} for e in entries] + [_key(image_pk, "AGENT")]
        for sid in sids:
            keys += await self._session_keys(tenant_id, sid)
        await self._batch_write([{"DeleteRequest": {"Key": k}} for k in keys])
        resp = await self.client.delete_item(TableName=self.table_name, Key=_key(image_pk, "IMG"),
                                             ReturnValues="ALL_OLD")
        return "Attributes" in resp

    async def _session_keys(self, tenant_id: str, session_id: str) -> list[Item]:
        """The keys of the session's items, after the search items of its messages (deleted first:
        they are found through their messages, so a delete cut short can still find them)."""
        children = await self._query(KeyConditionExpression="PK = :pk",
                                     ProjectionExpression="PK, SK, message_id, created_at, srch",
                                     ExpressionAttributeValues={":pk": _s(_session_pk(tenant_id, session_id))},
                                     ConsistentRead=True)
        searched = [_search_key(tenant_id, session_id, c["message_id"]["S"], _int(c, "created_at"))
                    for c in children if "srch" in c]
        return searched + [{"PK": c["PK"], "SK": c["SK"]} for c in children]

    async def get_session(self, tenant_id: str, session_id: str) -> Session | None:
        item = await self._get(_session_pk(tenant_id, session_id), "SESS")
        return _session(item) if item is not None else None

    async def create_session(self, session: Session) -> bool:
        t = session.tenant_id
        try:
            await self.client.transact_write_items(TransactItems=[
                {"ConditionCheck": {"TableName": self.table_name, "Key": _key(_image_pk(t, session.image_id), "IMG"),
                                    "ConditionExpression": "container_id = :cid",
                                    "ExpressionAttributeValues": {":cid": _s(session.container_id)}}},
                *(_put_new(self.table_name, item) for item in _session_items(session))])
        except ClientError as exc:
            if _error_code(exc) != "TransactionCanceledException":
                raise
            reasons = [r.get("Code") for r in exc.response.get("CancellationReasons", [])]
            if reasons and reasons[0] == "ConditionalCheckFailed":
                return False  # no such image (of this tenant and container)
            raise Conflict(f"Session already exists: {session.session_id}") from exc
        return True

    async def list_sessions(self, tenant_id: str, image_id: str) -> list[Session]:
        entries = await self._query(KeyConditionExpression="PK = :pk AND begins_with(SK, :s)", ConsistentRead=True,
                                    ExpressionAttributeValues={":pk": _s(_image_pk(tenant_id, image_id)),
                                                               ":s": _s("SESS#")})
        return [_session(e) for e in entries]

    async def delete_session(self, tenant_id: str, session_id: str) -> bool:
        item = await self._get(_session_pk(tenant_id, session_id), "SESS")
        if item is None:
            return False
        session = _session(item)
        # the image's entry first: a session half deleted is no longer listed, and deleting it again finishes it
        await self.client.delete_item(TableName=self.table_name, Key=_key(*_session_entry_key(session)))
        keys = await self._session_keys(tenant_id, session_id)
        await self._batch_write([{"DeleteRequest": {"Key": k}} for k in keys])
        return True

    # ---- agents ------------------------------------------------------------------------------

    async def put_agent(self, agent: Agent) -> Agent:
        t, aid, cid = agent.tenant_id, agent.agent_id, agent.container_id
        created = _ts(agent.created_at)
        item: Item = {
            "PK": _s(_image_pk(t, agent.image_id)), "SK": _s("AGENT"),
            "G1PK": _s(f"TENANT#{_k(t)}#AGENT"), "G1SK": _s(f"{created}#{_k(aid)}"),
            "G2PK": _s(f"CONT#{_k(t)}#{_k(cid)}"), "G2SK": _s(f"AGENT#{created}#{_k(aid)}"),
            "G3PK": _s(f"AGENT#{_k(t)}#{_k(aid)}"),
            "tenant_id": _s(t), "agent_id": _s(aid), "image_id": _s(agent.image_id), "container_id": _s(cid),
            "name": _s(agent.name), "created_at": _n(agent.created_at),
        }
        try:
            await self.client.put_item(TableName=self.table_name, Item=item,
                                       ConditionExpression="attribute_not_exists(PK)",
                                       ReturnValuesOnConditionCheckFailure="ALL_OLD")
        except ClientError as exc:
            if not _conditional_failed(exc):
                raise
            existing = _failed_item(exc)
            if existing is None:  # an endpoint that does not return it
                existing = await self._get(_image_pk(t, agent.image_id), "AGENT")
            if existing is None:  # deleted in between: try again
                return await self.put_agent(agent)
            return _agent(existing)
        return agent

    async def get_agent(self, tenant_id: str, agent_id: str) -> Agent | None:
        found = await self._by_id(f"AGENT#{_k(tenant_id)}#{_k(agent_id)}")
        return _agent(found) if found is not None and found["agent_id"]["S"] == agent_id else None

    async def get_agent_for_image(self, tenant_id: str, image_id: str) -> Agent | None:
        item = await self._get(_image_pk(tenant_id, image_id), "AGENT")
        return _agent(item) if item else None

    async def list_agents(self, tenant_id: str, container_id: str | None = None) -> list[Agent]:
        if container_id is None:
            items = await self._query(IndexName=GSI_TENANT, KeyConditionExpression="G1PK = :pk",
                                      ExpressionAttributeValues={":pk": _s(f"TENANT#{_k(tenant_id)}#AGENT")})
        else:
            items = await self._query(
                IndexName=GSI_CONTAINER, KeyConditionExpression="G2PK = :pk AND begins_with(G2SK, :agent)",
                ExpressionAttributeValues={":pk": _s(f"CONT#{_k(tenant_id)}#{_k(container_id)}"),
                                           ":agent": _s("AGENT#")})
        return [_agent(i) for i in items]

    async def delete_agent(self, tenant_id: str, agent_id: str) -> bool:
        keys = await self._query(IndexName=GSI_BY_ID, KeyConditionExpression="G3PK = :pk",
                                 ExpressionAttributeValues={":pk": _s(f"AGENT#{_k(tenant_id)}#{_k(agent_id)}")})
        deleted = False
        for k in keys:
            try:
                await self.client.delete_item(TableName=self.table_name, Key={"PK": k["PK"], "SK": k["SK"]},
                                              ConditionExpression="agent_id = :aid",
                                              ExpressionAttributeValues={":aid": _s(agent_id)})
                deleted = True
            except ClientError as exc:
                if not _conditional_failed(exc):
                    raise
        return deleted

    # ---- history, turns, event log -----------------------------------------------------------

    async def commit(self, checkpoint: Checkpoint) -> None:
        """Write the checkpoint with BatchWriteItem: ceil(items / 25) requests, usually one.

        The events go into one compressed block item (several above `_BLOCK_BYTES` compressed, see
        `_event_blocks`). Cost: one write unit per item per started KB, plus one GSI3 unit for a
        turn's first write and GSI4 units when a turn enters or leaves queued/running. A text turn's
        final checkpoint (1 message + ~30 events + 1 turn) is 3 items in 1 request.

        No transaction (it would double every unit and cap a checkpoint at 100 items): every key
        is deterministic (message id, last seq of an event block, turn id), so the batch is
        idempotent, and a failure raises to the caller, which keeps the checkpoint and commits it
        again; replaying it converges to the same items. A failed checkpoint's events come back
        ahead of newer ones in the next checkpoint, so its block may then exist twice, alone and
        inside a bigger block: `read_events` returns each seq once. The price of no transaction:
        while a batch is in flight (milliseconds; longer if unprocessed items are retried) a reader
        may see part of it, e.g. a later block before an earlier one of the same checkpoint. Live
        subscribers already have those events from the channel; only a replay landing in that
        window is affected.
        """
        t, sid = checkpoint.tenant_id, checkpoint.session_id
        pk = _s(_session_pk(t, sid))
        puts: dict[str, Item] = {}
        searched: list[Item] = []
        for m in checkpoint.messages:
            sk = f"MSG#{_k(m.message_id)}"
            if sk in puts:
                continue  # first wins, like INSERT OR IGNORE
            created = int(m.body.get("timestamp", 0))
            item: Item = {"PK": pk, "SK": _s(sk), "message_id": _s(m.message_id), "pos": _n(self._next_pos()),
                          "body": _s(orjson.dumps(m.body).decode()), "created_at": _n(created)}
            _put_opt(item, "turn_id", m.turn_id)
            text = searchable_text(m.body)
            if text:  # its search item; the flag tells a delete to remove that too
                item["srch"] = {"BOOL": True}
                searched.append(_search_item(t, sid, m, created, text))
            puts[sk] = item
        expires = int(self._clock()) + self._event_ttl_s
        rows: dict[int, _Row] = {}
        for e in checkpoint.events:
            rows.setdefault(e.seq, (e.seq, e.type, e.payload, e.created_at))  # first wins, like INSERT OR IGNORE
        for item in _event_block_items(pk, [rows[seq] for seq in sorted(rows)], expires):
            puts[item["SK"]["S"]] = item
        for turn in checkpoint.turns:
            puts[f"TURN#{_k(turn.turn_id)}"] = _turn_item(turn)  # last wins, like INSERT OR REPLACE
        await self._batch_write([{"PutRequest": {"Item": i}} for i in (*puts.values(), *searched)])

    async def list_messages(self, tenant_id: str, session_id: str) -> list[StoredMessage]:
        items = await self._query(KeyConditionExpression="PK = :pk AND begins_with(SK, :msg)", ConsistentRead=True,
                                  ExpressionAttributeValues={":pk": _s(_session_pk(tenant_id, session_id)),
                                                             ":msg": _s("MSG#")})
        items.sort(key=lambda i: _int(i, "pos"))
        return [StoredMessage(session_id, i["message_id"]["S"], orjson.loads(i["body"]["S"]), _opt_s(i, "turn_id"))
                for i in items]

    async def search_messages(self, tenant_id: str, query: str, *, limit: int = 20,
                              cursor: str | None = None) -> tuple[list[SearchHit], str | None]:
        """Search the tenant's search items (`SRCH#{t}#{yyyymm}`), newest month first, one window at
        a time: up to `search_window_items` items read newest first (eventually consistent Queries),
        ranked together with an in-memory FTS5 index (BM25) and returned best first; then the next,
        older window. A call reads at most `search_budget_items` items (whole windows): a page may
        then hold fewer than `limit` hits, and its cursor continues below. The cursor is a window's
        bounds and how many of its hits were returned (a page ending inside a window reads that
        window again), or where the next window starts; the search ends `search_months` months
        back. Hits whose session no longer exists (a delete cut short) are dropped after one
        consistent BatchGetItem of the page's sessions, which also gives their images."""
        state = search_cursor_state(cursor, query)
        match = match_expression(query)
        limit = max(limit, 1)
        if state is None:
            newest = _month(int(self._clock() * 1000) + 86_400_000)  # a day ahead: writers' clocks differ
            state = {"old": _month_add(newest, 1 - self.search_months), "below": [newest, "~"]}
        oldest = _cursor_month(state.get("old"))
        positions: list[_Pos]
        window: tuple[_Pos, _Pos] | None
        if "below" in state:
            below: _Pos | None = _cursor_pos(state["below"])
            window, skip, last = None, 0, False
            positions = [_cursor_pos(state["below"])]
        else:
            hi, lo = _cursor_pos(state.get("hi")), _cursor_pos(state.get("lo"))
            if hi < lo:
                raise bad_cursor()
            below, window = None, (hi, lo)
            skip, last = cursor_int(state, "skip"), state.get("last") is True
            positions = [hi, lo]
        # every month a cursor names lies within the search's months: a forged one cannot make it read more
        if not all(0 <= _months_between(m, oldest) <= self.search_months for m, _sk in positions):
            raise bad_cursor()
        if match is None:
            return [], None
        found: list[tuple[Item, float, str]] = []
        read = 0
        while True:
            if window is None:
                assert below is not None
                if read >= self.search_budget_items:
                    return await self._search_hits(tenant_id, found), search_cursor(
                        {"old": oldest, "below": list(below)}, query)
                items, last = await self._search_window(tenant_id, below, oldest)
                if not items:
                    return await self._search_hits(tenant_id, found), None
                window = (_search_pos(items[0]), _search_pos(items[-1]))
            else:
                items = await self._search_range(tenant_id, *window)
            read += len(items)
            ranked = await asyncio.to_thread(rank_texts, [_search_text(i) for i in items], match)
            taken = ranked[skip:skip + limit - len(found)]
            found += [(items[n], score, snippet) for n, score, snippet in taken]
            if skip + len(taken) < len(ranked):  # the page is full inside this window
                return await self._search_hits(tenant_id, found), search_cursor(
                    {"old": oldest, "hi": list(window[0]), "lo": list(window[1]), "skip": skip + len(taken),
                     "last": last}, query)
            if last:
                return await self._search_hits(tenant_id, found), None
            below, window, skip = window[1], None, 0  # the next window starts below this one
            if len(found) == limit:
                return await self._search_hits(tenant_id, found), search_cursor(
                    {"old": oldest, "below": list(below)}, query)

    async def get_turn(self, tenant_id: str, turn_id: str) -> Turn | None:
        found = await self._by_id(f"TURN#{_k(tenant_id)}#{_k(turn_id)}")
        return _turn(found) if found is not None else None

    async def list_turns(self, tenant_id: str, session_id: str) -> list[Turn]:
        items = await self._query(KeyConditionExpression="PK = :pk AND begins_with(SK, :turn)", ConsistentRead=True,
                                  ExpressionAttributeValues={":pk": _s(_session_pk(tenant_id, session_id)),
                                                             ":turn": _s("TURN#")})
        turns = [_turn(i) for i in items]
        turns.sort(key=lambda t: (t.created_at, t.turn_id))
        return turns

    async def list_tenant_turns(self, tenant_id: str, *, since_ms: int | None = None, until_ms: int | None = None,
                                limit: int = 50, cursor: str | None = None) -> tuple[list[Turn], str | None]:
        before = turn_cursor(cursor)
        low = f"{_ts(since_ms or 0)}#"
        high = f"{_ts(until_ms)}#" if until_ms is not None else "~"
        if before is not None:
            high = min(high, f"{_ts(before[0])}#{_k(before[1])}")
        items: list[Item] = []
        params: dict[str, Any] = {
            "TableName": self.table_name, "IndexName": GSI_TENANT, "ScanIndexForward": False,
            "KeyConditionExpression": "G1PK = :pk AND G1SK BETWEEN :low AND :high",
            "ExpressionAttributeValues": {":pk": _s(f"TENANT#{_k(tenant_id)}#TURN"), ":low": _s(low),
                                          ":high": _s(high)}}
        while len(items) <= limit:
            resp = await self.client.query(**params, Limit=limit + 1 - len(items))
            items += [i for i in resp.get("Items", []) if i["G1SK"]["S"] != high]  # BETWEEN includes high
            if "LastEvaluatedKey" not in resp:
                break
            params["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        turns = [_turn(i) for i in items]
        return turns[:limit], (next_turn_cursor(turns[limit - 1]) if len(turns) > limit else None)

    async def read_events(self, tenant_id: str, session_id: str, after_seq: int,
                          limit: int = 10_000) -> list[LoggedEvent]:
        """One Query from the block holding `after_seq + 1` on (blocks are keyed by their last seq).

        Each block holds at least one event, so a page of `limit - len(out)` items (plus the parts
        a block still lacks) is enough; the loop stops as soon as `limit` events are read.
        """
        if limit <= 0:
            return []
        now = int(self._clock())
        # Above every key of the block ending at after_seq, its parts included ("~" > "#").
        lo = f"{_evb_sk(after_seq)}~" if after_seq >= 0 else _EVB
        params: dict[str, Any] = {
            "TableName": self.table_name, "ConsistentRead": True,
            "KeyConditionExpression": "PK = :pk AND SK BETWEEN :lo AND :hi",
            "ExpressionAttributeValues": {":pk": _s(_session_pk(tenant_id, session_id)), ":lo": _s(lo),
                                          ":hi": _s(_EVB_HI)}}
        out: list[LoggedEvent] = []
        last = after_seq
        blocks = _BlockAssembler()
        while len(out) < limit:
            resp = await self.client.query(**params, Limit=limit - len(out) + blocks.missing())
            for item in resp.get("Items", []):
                block = blocks.feed(item)
                if block is None or not _alive(block.head, now):
                    continue
                for seq, type_, payload, created_at in block.rows():
                    if seq > last:  # a replayed checkpoint's block may repeat seqs of an earlier one
                        out.append(LoggedEvent(seq, type_, payload, created_at))
                        last = seq
                        if len(out) == limit:
                            return out
            if "LastEvaluatedKey" not in resp:
                break
            params["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        return out

    async def last_seq(self, tenant_id: str, session_id: str) -> int:
        newest = await self._newest_event(_session_pk(tenant_id, session_id))
        return _block_seq(newest) if newest is not None and _alive(newest, int(self._clock())) else 0

    async def reserve_seqs(self, tenant_id: str, session_id: str, block: int) -> tuple[int, int]:
        """An atomic counter on the session item (`ADD seq_reserved`), floored at the newest logged seq.

        Seqs are only handed out from reservations, so normally `seq_reserved` is already at or
        above every logged seq and the conditional ADD succeeds alone. An event logged beyond
        every reservation fails the condition; the counter is then moved to that seq plus the block
        with a compare-and-set on the value seen, and the loop retries if another reserver won.
        """
        pk = _session_pk(tenant_id, session_id)
        newest = await self._newest_event(pk)
        logged = _block_seq(newest) if newest is not None else 0
        key = _key(pk, "SESS")
        evlog = _evlog_keys(tenant_id, session_id)
        while True:
            try:
                resp = await self.client.update_item(
                    TableName=self.table_name, Key=key,
                    UpdateExpression="ADD seq_reserved :b SET SPK = :spk, SSK = :ssk",
                    ConditionExpression="attribute_exists(PK) AND seq_reserved >= :logged",
                    ExpressionAttributeValues={":b": _n(block), ":logged": _n(logged),
                                               ":spk": evlog["SPK"], ":ssk": evlog["SSK"]},
                    ReturnValues="UPDATED_NEW", ReturnValuesOnConditionCheckFailure="ALL_OLD")
                until = _int(resp["Attributes"], "seq_reserved")
                return until - block + 1, until
            except ClientError as exc:
                if not _conditional_failed(exc):
                    raise
                current = _failed_item(exc)
                if current is None:
                    current = await self._get(pk, "SESS")
            if current is None:  # no such session: nothing to record, as in SQLite
                return logged + 1, logged + block
            try:
                await self.client.update_item(
                    TableName=self.table_name, Key=key,
                    UpdateExpression="SET seq_reserved = :v, SPK = :spk, SSK = :ssk",
                    ConditionExpression="seq_reserved = :seen",
                    ExpressionAttributeValues={":v": _n(logged + block), ":seen": current["seq_reserved"],
                                               ":spk": evlog["SPK"], ":ssk": evlog["SSK"]})
                return logged + 1, logged + block
            except ClientError as exc:
                if not _conditional_failed(exc):
                    raise

    async def prune_events(self, older_than_ms: int) -> int:
        """Delete events created before the cutoff except the newest of each session, like SQLite.

        TTL already removes every event `event_ttl_s` after it was written, for free; this is for
        shorter retention. It visits the sessions in the sparse EVLOG index (8 Queries, no Scan);
        a session found without events leaves the index (the next `reserve_seqs` puts it back;
        an event written from a block reserved earlier is still removed by TTL). A block whose
        events are all older than the cutoff is deleted whole; a block crossing the cutoff, and the
        newest block of a session (which keeps its last event), are read and rewritten without the
        removed events, with their TTL unchanged. Returns the number of events removed.
        """
        sessions = await self._sparse_keys([f"EVLOG#{s}" for s in range(SHARDS)])
        sem = asyncio.Semaphore(8)

        async def one(pk: str) -> int:
            async with sem:
                return await self._prune_session(pk, older_than_ms)

        return sum(await asyncio.gather(*(one(k["PK"]["S"]) for k in sessions)))

    async def list_unfinished_turns(self) -> list[Turn]:
        found = await self._sparse_keys([f"TURN#{status}#{s}" for status in _UNFINISHED for s in range(SHARDS)])
        # A lagging index may list a turn under both statuses for a moment; BatchGetItem refuses duplicates.
        keys = {(k["PK"]["S"], k["SK"]["S"]): {"PK": k["PK"], "SK": k["SK"]} for k in found}
        items = await self._batch_get(list(keys.values()))
        turns = [t for t in map(_turn, items) if t.status in _UNFINISHED]  # the index lags the table
        turns.sort(key=lambda t: (t.created_at, t.tenant_id, t.turn_id))
        return turns

    # ---- resources ---------------------------------------------------------------------------

    async def create_resource(self, first: ResourceVersion) -> None:
        """One transaction: the head, the name claim, the first version (and the published name)."""
        res = _Resource(first.tenant_id, first.resource_id, first.kind, first.name)
        latest = _latest_attrs(first)
        ops = [self._put_op(res.head(first.published, 1, latest), "attribute_not_exists(PK)"),
               self._put_op(res.name_item(), "attribute_not_exists(PK)"),
               self._put_op(_version_item(first), "attribute_not_exists(PK)")]
        if first.published:
            ops.append(self._claim_public(res, latest))
        failed = await self._transact(ops)
        if any(failed[:3]):
            raise Conflict(f"Resource already exists: {res.kind}/{res.name}")
        if failed:
            raise Conflict(f"Another tenant already published {res.kind}/{res.name}")

    async def add_resource_version(self, version: ResourceVersion) -> None:
        """Read the head, then one transaction: the version, the head (its visibility and latest
        version, conditional on the revision read) and the published name when it changes."""
        while True:
            head = await self._get(_resource_pk(version.tenant_id, version.resource_id), _RES_HEAD)
            if head is None:
                raise NotFound(f"Resource not found: {version.kind}/{version.name}")
            res = _Resource.of(head)
            was_published, revision = head["published"]["BOOL"], _int(head, "revision")
            newest = (version.version_key, version.version) > (head["version_key"]["S"], head["version"]["S"])
            latest = _latest_attrs(version) if newest else {a: head[a] for a in _LATEST}
            ops = [self._put_op(_version_item(version), "attribute_not_exists(PK)"),
                   self._put_op(res.head(version.published, revision + 1, latest), "#rev = :rev",
                                ExpressionAttributeNames={"#rev": "revision"},
                                ExpressionAttributeValues={":rev": _n(revision)})]
            if version.published and (newest or not was_published):
                ops.append(self._claim_public(res, latest))
            elif was_published and not version.published:
                # Unconditional: the published name of a published resource is its own (both
                # change only together, in these transactions).
                ops.append({"Delete": {"TableName": self.table_name, "Key": res.public_key}})
            failed = await self._transact(ops)
            if not failed:
                return
            if failed[0]:
                raise Conflict(f"Version {version.version} of {res.kind}/{res.name} already exists")
            if not failed[1]:
                raise Conflict(f"Another tenant already published {res.kind}/{res.name}")
            # else another version was added since the head was read: read it again

    async def resource_versions(self, tenant_id: str, resource_id: str) -> list[ResourceVersion]:
        own_pk = _resource_pk(tenant_id, resource_id)
        own = await self._readable(tenant_id, own_pk)
        if own:
            return own
        # Another tenant's resource is readable once published; GSI3 finds published heads by id.
        keys = await self._query(IndexName=GSI_BY_ID, KeyConditionExpression="G3PK = :pk",
                                 ExpressionAttributeValues={":pk": _s(_published_id(resource_id))})
        for pk in sorted({k["PK"]["S"] for k in keys} - {own_pk}):
            versions = await self._readable(tenant_id, pk)
            if versions:
                return versions
        return []

    async def find_resource(self, tenant_id: str, kind: str, name: str) -> list[ResourceVersion]:
        own, public = _name_key(tenant_id, kind, name), _public_key(kind, name)
        claims = {i["PK"]["S"]: i for i in await self._batch_get([own, public])}
        for key in (own, public):  # the tenant's own resource wins
            claim = claims.get(key["PK"]["S"])
            if claim is not None:
                versions = await self._readable(tenant_id, _resource_pk(claim["tenant_id"]["S"],
                                                                        claim["resource_id"]["S"]))
                if versions:
                    return versions
        return []

    async def list_resources(self, tenant_id: str, *, kind: str | None = None, name: str | None = None,
                             tag: str | None = None, query: str | None = None, limit: int = 50,
                             cursor: str | None = None) -> tuple[list[ResourceVersion], str | None]:
        """The tenant's heads and the published names (GSI1), merged in key order; then the page's
        latest versions with one BatchGetItem.

        Each partition is read up to `limit + 1` matching items after the cursor: the first
        `limit + 1` of the merge are among them. Kind and name prefix are key conditions (the
        list key is order-preserving, see `_list_sk`); tag and query are matched here, on the
        latest version's description and tags that the listed items carry."""
        limit = max(limit, 1)
        after = _decode_cursor(cursor)
        prefix = f"{_ordered(kind)}#{_ordered(name or '')}" if kind is not None else ""

        def wanted(item: Item) -> bool:
            return _listing_matches(item, name, tag, query)

        own, public = await asyncio.gather(
            self._listed(f"TENANT#{_k(tenant_id)}#RES", prefix, after, limit + 1, wanted),
            # the tenant's own published resources are in its own list already
            self._listed(_PUBLIC_LIST, prefix, after, limit + 1,
                         lambda i: i["tenant_id"]["S"] != tenant_id and wanted(i)))
        found = sorted(own + public, key=lambda i: str(i["G1SK"]["S"]))[:limit + 1]
        page = found[:limit]
        keys = [_key(_Resource.of(i).pk, _version_sk(i["version_key"]["S"], i["version"]["S"])) for i in page]
        versions = {(v["PK"]["S"], v["SK"]["S"]): v for v in await self._batch_get(keys)}
        out = [_resource_version(listed, versions[(key["PK"]["S"], key["SK"]["S"])])
               for listed, key in zip(page, keys, strict=True)
               if (key["PK"]["S"], key["SK"]["S"]) in versions]  # else deleted meanwhile
        return out, _encode_cursor(page[-1]["G1SK"]["S"]) if len(found) > limit else None

    async def delete_resource(self, tenant_id: str, resource_id: str) -> bool:
        """The versions first (BatchWriteItem), then one transaction removes the head with the names,
        conditional on the revision read: a version added meanwhile is found by the next round."""
        pk = _resource_pk(tenant_id, resource_id)
        while True:
            items = await self._query(KeyConditionExpression="PK = :pk", ConsistentRead=True,
                                      ExpressionAttributeValues={":pk": _s(pk)})
            head = next((i for i in items if i["SK"]["S"] == _RES_HEAD), None)
            await self._batch_write([{"DeleteRequest": {"Key": {"PK": i["PK"], "SK": i["SK"]}}}
                                     for i in items if i is not head])
            if head is None:
                return False
            res = _Resource.of(head)
            ops: list[Item] = [
                {"Delete": {"TableName": self.table_name, "Key": _key(pk, _RES_HEAD),
                            "ConditionExpression": "#rev = :rev", "ExpressionAttributeNames": {"#rev": "revision"},
                            "ExpressionAttributeValues": {":rev": head["revision"]}}},
                {"Delete": {"TableName": self.table_name, "Key": res.name_key}}]
            if head["published"]["BOOL"]:
                ops.append({"Delete": {"TableName": self.table_name, "Key": res.public_key}})
            if not await self._transact(ops):
                return True

    # ---- request helpers ---------------------------------------------------------------------

    def _put_op(self, item: Item, condition: str, **expression: Any) -> Item:
        return {"Put": {"TableName": self.table_name, "Item": item, "ConditionExpression": condition, **expression}}

    def _claim_public(self, res: _Resource, latest: Item) -> Item:
        """Put the published name: free, or already this resource's (the owner has one per name)."""
        return self._put_op(res.public_item(latest), "attribute_not_exists(PK) OR #owner = :owner",
                            ExpressionAttributeNames={"#owner": "tenant_id"},
                            ExpressionAttributeValues={":owner": _s(res.owner)})

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

    async def _readable(self, reader: str, pk: str) -> list[ResourceVersion]:
        """The versions of the resource in partition `pk` (highest first) if `reader` may read it."""
        items = await self._query(KeyConditionExpression="PK = :pk", ConsistentRead=True,
                                  ExpressionAttributeValues={":pk": _s(pk)})
        head = next((i for i in items if i["SK"]["S"] == _RES_HEAD), None)
        if head is None or (head["tenant_id"]["S"] != reader and not head["published"]["BOOL"]):
            return []
        versions = [_resource_version(head, i) for i in items if i is not head]
        versions.sort(key=lambda v: (v.version_key, v.version), reverse=True)
        return versions

    async def _listed(self, g1pk: str, prefix: str, after: str | None, want: int,
                      keep: Callable[[Item], bool]) -> list[Item]:
        """Up to `want` items of a GSI1 resource list that `keep` accepts, in key order, whose key
        starts with `prefix` and is above `after`."""
        if after is not None and after >= prefix:
            condition, values = "G1PK = :pk AND G1SK > :sk", {":pk": _s(g1pk), ":sk": _s(after)}
        elif prefix:
            condition, values = "G1PK = :pk AND begins_with(G1SK, :sk)", {":pk": _s(g1pk), ":sk": _s(prefix)}
        else:
            condition, values = "G1PK = :pk", {":pk": _s(g1pk)}
        params: dict[str, Any] = {"TableName": self.table_name, "IndexName": GSI_TENANT, "Limit": want,
                                  "KeyConditionExpression": condition, "ExpressionAttributeValues": values}
        out: list[Item] = []
        while True:
            resp = await self.client.query(**params)
            for item in resp.get("Items", []):
                if not item["G1SK"]["S"].startswith(prefix):  # past the prefix (read from `after`)
                    return out
                if keep(item):
                    out.append(item)
                    if len(out) == want:
                        return out
            if "LastEvaluatedKey" not in resp:
                return out
            params["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    async def _search_window(self, tenant_id: str, below: _Pos, oldest: int) -> tuple[list[Item], bool]:
        """Up to `search_window_items` search items below `below`, newest first, going back to the
        month `oldest`; and whether nothing older is left. Months are read 1, 2, 4, … at a time
        (concurrently), so a sparse history costs a few round trips, and a dense month no extra read."""
        want = max(self.search_window_items, 1)
        month, sk = below
        items: list[Item] = []
        batch = 1
        while month >= oldest:
            months = [m for m in (_month_add(month, -i) for i in range(batch)) if m >= oldest]
            pages = await asyncio.gather(*(self._search_month(tenant_id, m, sk if m == month else "~",
                                                              want - len(items)) for m in months))
            for page in pages:
                items += page[:want - len(items)]
                if len(items) >= want:
                    return items, False
            month, sk, batch = _month_add(months[-1], -1), "~", batch * 2
        return items, True

    async def _search_month(self, tenant_id: str, month: int, below: str, want: int) -> list[Item]:
        """Up to `want` search items of one month partition below the sort key `below`, newest first."""
        params: dict[str, Any] = {
            "TableName": self.table_name, "ScanIndexForward": False, "KeyConditionExpression": "PK = :pk AND SK < :sk",
            "ExpressionAttributeValues": {":pk": _s(_search_pk(tenant_id, month)), ":sk": _s(below)}}
        items: list[Item] = []
        while len(items) < want:
            resp = await self.client.query(**params, Limit=want - len(items))
            items += resp.get("Items", [])
            if "LastEvaluatedKey" not in resp:
                break
            params["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        return items

    async def _search_range(self, tenant_id: str, hi: _Pos, lo: _Pos) -> list[Item]:
        """The search items from `hi` down to `lo` (both included): a window read before, again."""
        async def month_items(month: int) -> list[Item]:
            values: Item = {":pk": _s(_search_pk(tenant_id, month))}
            if month == hi[0] == lo[0]:
                condition = "PK = :pk AND SK BETWEEN :lo AND :hi"
                values[":lo"], values[":hi"] = _s(lo[1]), _s(hi[1])
            elif month == hi[0]:
                condition, values[":hi"] = "PK = :pk AND SK <= :hi", _s(hi[1])
            elif month == lo[0]:
                condition, values[":lo"] = "PK = :pk AND SK >= :lo", _s(lo[1])
            else:
                condition = "PK = :pk"
            return await self._query(KeyConditionExpression=condition, ExpressionAttributeValues=values,
                                     ScanIndexForward=False)

        months = [hi[0]]
        while months[-1] > lo[0]:
            months.append(_month_add(months[-1], -1))
        pages = await asyncio.gather(*(month_items(m) for m in months))
        return [item for page in pages for item in page]

    async def _search_hits(self, tenant_id: str, found: list[tuple[Item, float, str]]) -> list[SearchHit]:
        """The hits whose session still exists, with its image (one consistent BatchGetItem)."""
        ids = [_search_ids(item) for item, _score, _snippet in found]
        sessions = {i["session_id"]["S"]: i for i in await self._batch_get(
            [_key(_session_pk(tenant_id, sid), "SESS") for sid in dict.fromkeys(sid for _ts, sid, _mid in ids)])}
        return [SearchHit(sid, mid, item["role"]["S"], item["subtype"]["S"], created, snippet, score,
                          sessions[sid]["image_id"]["S"])
                for (item, score, snippet), (created, sid, mid) in zip(found, ids, strict=True) if sid in sessions]

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

    async def _newest_event(self, pk: str) -> Item | None:
        """The key and TTL of the newest block's last item (its head, or its last part): see `_block_seq`."""
        resp = await self.client.query(
            TableName=self.table_name, KeyConditionExpression="PK = :pk AND SK BETWEEN :lo AND :hi",
            ExpressionAttributeValues={":pk": _s(pk), ":lo": _s(_EVB), ":hi": _s(_EVB_HI)},
            ProjectionExpression="SK, #ttl", ExpressionAttributeNames={"#ttl": TTL_ATTRIBUTE},
            ScanIndexForward=False, Limit=1, ConsistentRead=True)
        items = resp.get("Items", [])
        return items[0] if items else None

    async def _sparse_keys(self, partitions: Sequence[str]) -> list[Item]:
        pages = await asyncio.gather(*(
            self._query(IndexName=GSI_SPARSE, KeyConditionExpression="SPK = :pk",
                        ExpressionAttributeValues={":pk": _s(p)}) for p in partitions))
        return [k for page in pages for k in page]

    async def _prune_session(self, pk: str, older_than_ms: int) -> int:
        found = await self._query(
            KeyConditionExpression="PK = :pk AND SK BETWEEN :lo AND :hi", ConsistentRead=True,
            ProjectionExpression="SK, #n, #parts, #newest, #oldest",
            ExpressionAttributeNames={"#n": "n", "#parts": "parts", "#newest": "created_at",
                                      "#oldest": "oldest_created_at"},
            ExpressionAttributeValues={":pk": _s(pk), ":lo": _s(_EVB), ":hi": _s(_EVB_HI)})
        heads = [i for i in found if len(i["SK"]["S"]) == _EVB_HEAD_LEN]
        if not heads:
            try:
                await self.client.update_item(TableName=self.table_name, Key=_key(pk, "SESS"),
                                              UpdateExpression="REMOVE SPK, SSK",
                                              ConditionExpression="attribute_exists(PK)")
            except ClientError as exc:
                if not _conditional_failed(exc):  # else the session is gone: nothing to unlist
                    raise
            return 0
        newest_seq = _block_seq(heads[-1])
        writes: dict[str, Item] = {}  # by SK: one request per key (a rewrite's put wins over a delete)
        removed = 0
        for head in heads:
            n, newest = _int(head, "n"), head is heads[-1]
            if not newest and _int(head, "created_at") < older_than_ms:
                for key in _block_keys(pk, head):
                    writes.setdefault(key["SK"]["S"], {"DeleteRequest": {"Key": key}})
                removed += n
            elif _int(head, "oldest_created_at") < older_than_ms and (n > 1 or not newest):
                removed += await self._trim_block(pk, head["SK"]["S"], older_than_ms, newest_seq, writes)
        await self._batch_write(list(writes.values()))
        return removed

    async def _trim_block(self, pk: str, sk: str, older_than_ms: int, newest_seq: int, writes: dict[str, Item]) -> int:
        """Add to `writes` the rewrite of a block without the events pruning removes; their number."""
        items = await self._query(KeyConditionExpression="PK = :pk AND SK BETWEEN :lo AND :hi", ConsistentRead=True,
                                  ExpressionAttributeValues={":pk": _s(pk), ":lo": _s(sk), ":hi": _s(f"{sk}#~")})
        assembler = _BlockAssembler()
        block = next((b for b in map(assembler.feed, items) if b is not None), None)
        if block is None:  # deleted meanwhile, or incomplete: TTL removes it
            return 0
        rows = block.rows()
        keep = [r for r in rows if r[3] >= older_than_ms or r[0] >= newest_seq]
        if len(keep) == len(rows):
            return 0
        for key in _block_keys(pk, block.head):
            writes.setdefault(key["SK"]["S"], {"DeleteRequest": {"Key": key}})
        for item in _event_block_items(_s(pk), keep, _int(block.head, TTL_ATTRIBUTE)):
            writes[item["SK"]["S"]] = {"PutRequest": {"Item": item}}
        return len(rows) - len(keep)

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

    def _next_pos(self) -> int:
        self._last_pos = max(self._last_pos + 1, time.time_ns())
        return self._last_pos


# ---- keys and attribute values ---------------------------------------------------------------


def _k(value: str) -> str:
    """Escape an id for use inside a composite key."""
    return value.replace("%", "%25").replace("#", "%23")


def _ts(ms: int) -> str:
    return f"{ms:016d}"


def _evb_sk(last_seq: int) -> str:
    return f"{_EVB}{last_seq:020d}"


def _part_sk(block_sk: str, part: int) -> str:
    return f"{block_sk}#{part:04d}"


def _image_pk(tenant_id: str, image_id: str) -> str:
    return f"IMG#{_k(tenant_id)}#{_k(image_id)}"


def _session_pk(tenant_id: str, session_id: str) -> str:
    return f"SESS#{_k(tenant_id)}#{_k(session_id)}"


def _shard(*parts: str) -> int:
    return zlib.crc32("#".join(parts).encode()) % SHARDS


def _put_new(table_name: str, item: Item) -> TransactWriteItemTypeDef:
    return {"Put": {"TableName": table_name, "Item": item, "ConditionExpression": "attribute_not_exists(PK)"}}


_Pos = tuple[int, str]  # a search item's place: its month (yyyymm) and sort key


def _search_pk(tenant_id: str, month: int) -> str:
    return f"SRCH#{_k(tenant_id)}#{month:06d}"


def _search_key(tenant_id: str, session_id: str, message_id: str, created: int) -> Item:
    """A message's search item: the tenant's partition of the message's month (UTC), newest last."""
    return _key(_search_pk(tenant_id, _month(created)), f"{_ts(created)}#{_k(session_id)}#{_k(message_id)}")


def _search_item(tenant_id: str, session_id: str, m: StoredMessage, created: int, text: str) -> Item:
    """A message's search item: its key (which holds the time and ids), role, subtype and text;
    the text zlib-compressed (`z`) when that is smaller (a write unit and storage are per byte)."""
    item: Item = {**_search_key(tenant_id, session_id, m.message_id, created),
                  "role": _s(str(m.body.get("role", ""))), "subtype": _s(str(m.body.get("subtype", "")))}
    raw = text.encode()
    packed = zlib.compress(raw, _ZLIB_LEVEL)
    if len(packed) < len(raw):
        item["z"] = {"B": packed}
    else:
        item["text"] = _s(text)
    return item


def _search_text(item: Mapping[str, Any]) -> str:
    return zlib.decompress(item["z"]["B"]).decode() if "z" in item else str(item["text"]["S"])


def _search_ids(item: Mapping[str, Any]) -> tuple[int, str, str]:
    """(created, session id, message id) of a search item, from its sort key."""
    created, sid, mid = str(item["SK"]["S"]).split("#")
    return int(created), unquote(sid), unquote(mid)  # `_k` escapes only "%" and "#", as %25 and %23


def _search_pos(item: Mapping[str, Any]) -> _Pos:
    return int(item["PK"]["S"][-6:]), str(item["SK"]["S"])


def _month(ms: int) -> int:
    """yyyymm (UTC) of an epoch-ms time."""
    t = time.gmtime(min(max(ms, 0), 253_402_300_799_999) // 1000)
    return t.tm_year * 100 + t.tm_mon


def _months_between(later: int, earlier: int) -> int:
    return (later // 100 - earlier // 100) * 12 + later % 100 - earlier % 100


def _month_add(month: int, n: int) -> int:
    index = (month // 100) * 12 + month % 100 - 1 + n
    return (index // 12) * 100 + index % 12 + 1


def _cursor_month(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 197001 <= value <= 999912 \
            or not 1 <= value % 100 <= 12:
        raise bad_cursor()
    return value


def _cursor_pos(value: Any) -> _Pos:
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], str) and 0 < len(value[1]) <= 1024):
        raise bad_cursor()
    return _cursor_month(value[0]), value[1]


def _session_entry_key(session: Session) -> tuple[str, str]:
    """The session's entry in its image's partition (how `list_sessions` finds an image's sessions)."""
    return (_image_pk(session.tenant_id, session.image_id),
            f"SESS#{_ts(session.created_at)}#{_k(session.session_id)}")


def _session_items(session: Session) -> tuple[Item, Item]:
    """The session item (with its seq reservation) and its entry in the image's partition."""
    attrs: Item = {"tenant_id": _s(session.tenant_id), "session_id": _s(session.session_id),
                   "image_id": _s(session.image_id), "container_id": _s(session.container_id),
                   "created_at": _n(session.created_at), "updated_at": _n(session.updated_at)}
    _put_opt(attrs, "title", session.title)
    pk, sk = _session_entry_key(session)
    return ({"PK": _s(_session_pk(session.tenant_id, session.session_id)), "SK": _s("SESS"),
             **_evlog_keys(session.tenant_id, session.session_id), **attrs, "seq_reserved": _n(0)},
            {"PK": _s(pk), "SK": _s(sk), **attrs})


def _session(item: Item) -> Session:
    return Session(item["tenant_id"]["S"], item["session_id"]["S"], item["image_id"]["S"],
                   item["container_id"]["S"], _int(item, "created_at"), _int(item, "updated_at"),
                   item["title"]["S"] if "title" in item else None)


def _evlog_keys(tenant_id: str, session_id: str) -> Item:
    return {"SPK": _s(f"EVLOG#{_shard(tenant_id, session_id)}"), "SSK": _s(f"{_k(tenant_id)}#{_k(session_id)}")}


def _key(pk: str, sk: str) -> Item:
    return {"PK": _s(pk), "SK": _s(sk)}


def _s(value: str) -> Item:
    return {"S": value}


def _n(value: int) -> Item:
    return {"N": str(value)}


def _put_opt(item: Item, name: str, value: str | int | None) -> None:
    if value is not None:
        item[name] = _n(value) if isinstance(value, int) else _s(value)


def _int(item: Mapping[str, Any], name: str) -> int:
    return int(item[name]["N"])


def _opt_s(item: Mapping[str, Any], name: str) -> str | None:
    value = item.get(name)
    return None if value is None else str(value["S"])


def _opt_int(item: Mapping[str, Any], name: str) -> int | None:
    value = item.get(name)
    return None if value is None else int(value["N"])


def _alive(item: Mapping[str, Any], now_s: int) -> bool:
    """False once TTL has passed: DynamoDB deletes expired items lazily, reads must not see them."""
    expires = _opt_int(item, TTL_ATTRIBUTE)
    return expires is None or expires > now_s


# ---- event blocks ----------------------------------------------------------------------------

_Row = tuple[int, str, str, int]  # seq, type, payload (an encoded JSON envelope), created_at


def _event_blocks(rows: list[_Row]) -> list[tuple[list[_Row], bytes]]:
    """Rows (in seq order) as compressed blocks of at most `_BLOCK_BYTES`, halved by raw size until
    they fit. A single event above it stays one block; `_event_block_items` continues it in parts."""
    data = zlib.compress(orjson.dumps(rows), _ZLIB_LEVEL)
    if len(data) <= _BLOCK_BYTES or len(rows) == 1:
        return [(rows, data)]
    sizes = list(itertools.accumulate(len(r[1]) + len(r[2]) for r in rows))  # sizes[k - 1]: rows[:k]
    cut = min(range(1, len(rows)), key=lambda k: abs(2 * sizes[k - 1] - sizes[-1]))
    return _event_blocks(rows[:cut]) + _event_blocks(rows[cut:])


def _event_block_items(pk: Item, rows: list[_Row], expires: int) -> list[Item]:
    """The items of the rows' blocks: per block a head (keyed by its last seq), and for data above
    `_BLOCK_BYTES` (one big event) part items `EVB#{last}#0001`… that sort right after it."""
    items: list[Item] = []
    for block, data in _event_blocks(rows) if rows else []:
        sk = _evb_sk(block[-1][0])
        created = [r[3] for r in block]
        head: Item = {"PK": pk, "SK": _s(sk), "first_seq": _n(block[0][0]), "last_seq": _n(block[-1][0]),
                      "n": _n(len(block)), "created_at": _n(max(created)), "oldest_created_at": _n(min(created)),
                      "data": {"B": data[:_BLOCK_BYTES]}, TTL_ATTRIBUTE: _n(expires)}
        items.append(head)
        parts = [data[i:i + _BLOCK_BYTES] for i in range(_BLOCK_BYTES, len(data), _BLOCK_BYTES)]
        if parts:
            head["parts"] = _n(1 + len(parts))
            items.extend({"PK": pk, "SK": _s(_part_sk(sk, i)), "data": {"B": chunk}, TTL_ATTRIBUTE: _n(expires)}
                         for i, chunk in enumerate(parts, 1))
    return items


def _block_seq(item: Mapping[str, Any]) -> int:
    """The last seq of the block an item (head or part) belongs to, read from its key."""
    return int(item["SK"]["S"][len(_EVB):_EVB_HEAD_LEN])


def _block_keys(pk: str, head: Mapping[str, Any]) -> list[Item]:
    sk = head["SK"]["S"]
    return [_key(pk, sk)] + [_key(pk, _part_sk(sk, i)) for i in range(1, _opt_int(head, "parts") or 1)]


@dataclass(frozen=True, slots=True)
class _Block:
    head: Item
    data: bytes  # the compressed rows, parts joined

    def rows(self) -> list[_Row]:
        return [(int(seq), str(type_), str(payload), int(created))
                for seq, type_, payload, created in orjson.loads(zlib.decompress(self.data))]


class _BlockAssembler:
    """Joins each block head with its parts, which a Query returns right after it (across pages).

    A block missing a part (still being written, or a part already deleted by TTL) and a part
    without its head (its block ends at the `after_seq` of a read, or the head expired) are skipped.
    """

    def __init__(self) -> None:
        self._head: Item | None = None
        self._chunks: list[bytes] = []

    def missing(self) -> int:
        """Parts the pending block still needs."""
        return 0 if self._head is None else (_opt_int(self._head, "parts") or 1) - len(self._chunks)

    def feed(self, item: Item) -> _Block | None:
        sk = item["SK"]["S"]
        if len(sk) == _EVB_HEAD_LEN:
            self._head, self._chunks = item, [item["data"]["B"]]
        elif self._head is not None and sk == _part_sk(self._head["SK"]["S"], len(self._chunks)):
            self._chunks.append(item["data"]["B"])
        else:
            return None
        if self.missing():
            return None
        block = _Block(self._head, b"".join(self._chunks))
        self._head, self._chunks = None, []
        return block


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _conditional_failed(exc: ClientError) -> bool:
    return _error_code(exc) == "ConditionalCheckFailedException"


def _failed_item(exc: ClientError) -> Item | None:
    """The item a failed condition saw (`ReturnValuesOnConditionCheckFailure=ALL_OLD`)."""
    item = cast(Mapping[str, Any], exc.response).get("Item")
    return cast(Item, item) if isinstance(item, dict) else None


def _failed_conditions(exc: ClientError) -> list[bool]:
    """Per operation of a cancelled transaction, whether its condition failed ([] for other errors)."""
    if _error_code(exc) != "TransactionCanceledException":
        return []
    reasons = cast(Mapping[str, Any], exc.response).get("CancellationReasons") or []
    return [r.get("Code") == "ConditionalCheckFailed" for r in reasons]


# ---- records ---------------------------------------------------------------------------------


def _container(i: Mapping[str, Any]) -> Container:
    return Container(i["tenant_id"]["S"], i["container_id"]["S"], _int(i, "created_at"), _int(i, "updated_at"))


def _image(i: Mapping[str, Any]) -> Image:
    return Image(tenant_id=i["tenant_id"]["S"], image_id=i["image_id"]["S"], container_id=i["container_id"]["S"],
                 session_id=i["session_id"]["S"], name=i["name"]["S"], created_at=_int(i, "created_at"),
                 updated_at=_int(i, "updated_at"), description=_opt_s(i, "description"),
                 system_prompt=_opt_s(i, "system_prompt"), config=orjson.loads(i["config"]["S"]))


def _agent(i: Mapping[str, Any]) -> Agent:
    return Agent(i["tenant_id"]["S"], i["agent_id"]["S"], i["image_id"]["S"], i["container_id"]["S"],
                 i["name"]["S"], _int(i, "created_at"))


def _turn_item(t: Turn) -> Item:
    item: Item = {
        "PK": _s(_session_pk(t.tenant_id, t.session_id)), "SK": _s(f"TURN#{_k(t.turn_id)}"),
        "G3PK": _s(f"TURN#{_k(t.tenant_id)}#{_k(t.turn_id)}"),
        "tenant_id": _s(t.tenant_id), "turn_id": _s(t.turn_id), "session_id": _s(t.session_id),
        "image_id": _s(t.image_id), "container_id": _s(t.container_id), "user_message_id": _s(t.user_message_id),
        "status": _s(str(t.status)), "created_at": _n(t.created_at), "tier": _s(t.tier),
        "input_tokens": _n(t.usage.input_tokens), "output_tokens": _n(t.usage.output_tokens),
        "cache_read_tokens": _n(t.usage.cache_read_tokens), "cache_write_tokens": _n(t.usage.cache_write_tokens),
        "list_cost": _s(t.list_cost), "billed_cost": _s(t.billed_cost),
    }
    for name, value in (("model", t.model), ("error_code", t.error_code), ("error_message", t.error_message),
                        ("started_at", t.started_at), ("ended_at", t.ended_at), ("agent", t.agent),
                        ("task", t.task), ("key_id", t.key_id), ("first_token_ms", t.first_token_ms)):
        _put_opt(item, name, value)
    if t.options:
        item["options"] = _s(orjson.dumps(t.options).decode())
    if t.status in _UNFINISHED:  # sparse: only unfinished turns are in the status index
        item["SPK"] = _s(f"TURN#{t.status}#{_shard(t.tenant_id, t.turn_id)}")
        item["SSK"] = _s(f"{_ts(t.created_at)}#{_k(t.tenant_id)}#{_k(t.turn_id)}")
    else:  # sparse too: the tenant's turn log holds finished turns (one index write per turn)
        item["G1PK"] = _s(f"TENANT#{_k(t.tenant_id)}#TURN")
        item["G1SK"] = _s(f"{_ts(t.created_at)}#{_k(t.turn_id)}")
    return item


def _turn(i: Mapping[str, Any]) -> Turn:
    return Turn(
        tenant_id=i["tenant_id"]["S"], turn_id=i["turn_id"]["S"], session_id=i["session_id"]["S"],
        image_id=i["image_id"]["S"], container_id=i["container_id"]["S"], user_message_id=i["user_message_id"]["S"],
        status=TurnStatus(i["status"]["S"]), created_at=_int(i, "created_at"), tier=i["tier"]["S"],
        model=_opt_s(i, "model"),
        usage=Usage(_int(i, "input_tokens"), _int(i, "output_tokens"), _int(i, "cache_read_tokens"),
                    _int(i, "cache_write_tokens")),
        list_cost=i["list_cost"]["S"], billed_cost=i["billed_cost"]["S"], error_code=_opt_s(i, "error_code"),
        error_message=_opt_s(i, "error_message"), started_at=_opt_int(i, "started_at"),
        ended_at=_opt_int(i, "ended_at"), agent=_opt_s(i, "agent"), task=_opt_s(i, "task"),
        options=orjson.loads(i["options"]["S"]) if "options" in i else {}, key_id=_opt_s(i, "key_id"),
        first_token_ms=_opt_int(i, "first_token_ms"))


# ---- resources -------------------------------------------------------------------------------


def _ordered(value: str) -> str:
    """Escape for a key that must sort like its parts: every character up to "%" becomes %XX, so
    "#" (the separator) sorts below every escaped part's characters and "#"-joined keys sort like
    the tuples of their parts (and a prefix of a part stays a prefix of its key)."""
    return "".join(f"%{ord(ch):02X}" if ch <= "%" else ch for ch in value)


def _list_sk(kind: str, name: str, owner: str) -> str:
    return f"{_ordered(kind)}#{_ordered(name)}#{_ordered(owner)}"


def _resource_pk(owner: str, resource_id: str) -> str:
    return f"RES#{_k(owner)}#{_k(resource_id)}"


def _version_sk(version_key: str, version: str) -> str:
    return f"V#{_k(version_key)}#{_k(version)}"


def _name_key(owner: str, kind: str, name: str) -> Item:
    return _key(f"RESNAME#{_k(owner)}#{_k(kind)}#{_k(name)}", "RESNAME")


def _public_key(kind: str, name: str) -> Item:
    return _key(f"PUBNAME#{_k(kind)}#{_k(name)}", "PUBNAME")


def _published_id(resource_id: str) -> str:
    return f"PUBRES#{_k(resource_id)}"


@dataclass(frozen=True, slots=True)
class _Resource:
    """A resource's identity, and the keys and shared attributes of its items."""

    owner: str
    resource_id: str
    kind: str
    name: str

    @staticmethod
    def of(item: Mapping[str, Any]) -> _Resource:
        return _Resource(item["tenant_id"]["S"], item["resource_id"]["S"], item["kind"]["S"], item["name"]["S"])

    @property
    def pk(self) -> str:
        return _resource_pk(self.owner, self.resource_id)

    @property
    def name_key(self) -> Item:
        return _name_key(self.owner, self.kind, self.name)

    @property
    def public_key(self) -> Item:
        return _public_key(self.kind, self.name)

    def _listed_attrs(self, g1pk: str, published: bool, latest: Item) -> Item:
        return {"G1PK": _s(g1pk), "G1SK": _s(_list_sk(self.kind, self.name, self.owner)),
                "tenant_id": _s(self.owner), "resource_id": _s(self.resource_id), "kind": _s(self.kind),
                "name": _s(self.name), "published": {"BOOL": published}, **latest}

    def head(self, published: bool, revision: int, latest: Item) -> Item:
        item: Item = {"PK": _s(self.pk), "SK": _s(_RES_HEAD), "revision": _n(revision),
                      **self._listed_attrs(f"TENANT#{_k(self.owner)}#RES", published, latest)}
        if published:  # sparse: other tenants find a published resource by id through GSI3
            item["G3PK"] = _s(_published_id(self.resource_id))
        return item

    def name_item(self) -> Item:
        return {**self.name_key, "tenant_id": _s(self.owner), "resource_id": _s(self.resource_id)}

    def public_item(self, latest: Item) -> Item:
        return {**self.public_key, **self._listed_attrs(_PUBLIC_LIST, True, latest)}


def _latest_attrs(v: ResourceVersion) -> Item:
    return {"version": _s(v.version), "version_key": _s(v.version_key), "description": _s(v.description),
            "tags": _s(orjson.dumps(v.tags).decode())}


def _version_item(v: ResourceVersion) -> Item:
    # JSON text, not maps and lists: nested floats would come back as Decimal otherwise.
    return {"PK": _s(_resource_pk(v.tenant_id, v.resource_id)), "SK": _s(_version_sk(v.version_key, v.version)),
            **_latest_attrs(v), "content": _s(orjson.dumps(v.content).decode()), "content_hash": _s(v.content_hash),
            "dependencies": _s(orjson.dumps(v.dependencies).decode()), "created_at": _n(v.created_at)}


def _resource_version(resource: Mapping[str, Any], v: Mapping[str, Any]) -> ResourceVersion:
    """A version item read with its resource's head or listed item (identity and visibility)."""
    return ResourceVersion(
        tenant_id=resource["tenant_id"]["S"], resource_id=resource["resource_id"]["S"], kind=resource["kind"]["S"],
        name=resource["name"]["S"], version=v["version"]["S"], version_key=v["version_key"]["S"],
        content=orjson.loads(v["content"]["S"]), content_hash=v["content_hash"]["S"],
        dependencies=tuple(orjson.loads(v["dependencies"]["S"])), description=v["description"]["S"],
        tags=tuple(orjson.loads(v["tags"]["S"])), published=bool(resource["published"]["BOOL"]),
        created_at=_int(v, "created_at"))


def _listing_matches(item: Mapping[str, Any], name: str | None, tag: str | None, query: str | None) -> bool:
    tags: list[str] = orjson.loads(item["tags"]["S"])
    if name and not item["name"]["S"].startswith(name):  # without a kind it is not a key condition
        return False
    if tag is not None and tag not in tags:
        return False
    if not query:
        return True
    q = query.casefold()
    return any(q in text.casefold() for text in (item["name"]["S"], item["description"]["S"], *tags))


def _encode_cursor(list_sk: str) -> str:
    return base64.urlsafe_b64encode(list_sk.encode()).decode()


def _decode_cursor(cursor: str | None) -> str | None:
    if cursor is None:
        return None
    try:
        after = base64.b64decode(cursor, altchars=b"-_", validate=True).decode()
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest("Invalid cursor", field="cursor") from exc
    if not after:
        raise InvalidRequest("Invalid cursor", field="cursor")
    return after


if TYPE_CHECKING:
    from agentvm.ports import Store

    def _implements_store(store: DynamoDBStore) -> Store:  # mypy checks the port's signatures
        return store
