"""A session's messages and event log on the table (`SessionLog`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from agentvm.adapters.aws.dynamodb_event_blocks import (
    _EVB,
    _EVB_HEAD_LEN,
    _EVB_HI,
    _block_keys,
    _block_seq,
    _BlockAssembler,
    _evb_sk,
    _event_block_items,
    _Row,
)
from agentvm.adapters.aws.dynamodb_items import (
    ARCHIVED_ATTRIBUTE,
    SHARDS,
    TTL_ATTRIBUTE,
    Item,
    _alive,
    _body_attrs,
    _conditional_failed,
    _evlog_keys,
    _expiring,
    _failed_item,
    _int,
    _k,
    _key,
    _message_body,
    _n,
    _opt_s,
    _put_opt,
    _s,
    _search_item,
    _session_pk,
    _turn_item,
)
from agentvm.adapters.aws.dynamodb_table import DynamoTable
from agentvm.domain.message_text import searchable_text
from agentvm.domain.models import Checkpoint, LoggedEvent, StoredMessage

_MSG_TIMED = "MSG#~"  # above every `MSG#{mid}` key of the older layout ("~" sorts after ids' characters)


def message_sk(message_id: str, created_ms: int) -> str:
    """A message's sort key: its creation time first, so the messages of a time range are one Query
    (`list_messages_since`), then its id. Deterministic, so a replayed checkpoint writes the same item."""
    return f"{_MSG_TIMED}{max(created_ms, 0):016d}#{_k(message_id)}"


class DynamoSessionLog(DynamoTable):
    """`SessionLog` on DynamoDB: messages, event blocks and the seq reservation."""

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
        hot_until = self._history_expiry()  # the hot window of this write's history items
        seen: set[str] = set()
        for m in checkpoint.messages:
            if m.message_id in seen:
                continue  # first wins, like INSERT OR IGNORE
            seen.add(m.message_id)
            created = int(m.body.get("timestamp", 0))
            sk = message_sk(m.message_id, created)
            item: Item = _expiring({"PK": pk, "SK": _s(sk), "message_id": _s(m.message_id),
                                    "pos": _n(self._next_pos()), **_body_attrs(m.body),
                                    "created_at": _n(created)}, hot_until)
            _put_opt(item, "turn_id", m.turn_id)
            text = searchable_text(m.body)
            if text:  # its search item; the flag tells a delete to remove that too
                item["srch"] = {"BOOL": True}
                searched.append(_expiring(_search_item(t, sid, m, created, text), hot_until))
            puts[sk] = item
        expires = int(self._clock()) + self._event_ttl_s
        rows: dict[int, _Row] = {}
        for e in checkpoint.events:
            rows.setdefault(e.seq, (e.seq, e.type, e.payload, e.created_at))  # first wins, like INSERT OR IGNORE
        for item in _event_block_items(pk, [rows[seq] for seq in sorted(rows)], expires):
            puts[item["SK"]["S"]] = item
        for turn in checkpoint.turns:
            # last wins, like INSERT OR REPLACE; each rewrite moves the turn's expiry on
            puts[f"TURN#{_k(turn.turn_id)}"] = _expiring(_turn_item(turn), hot_until)
        await self._batch_write([{"PutRequest": {"Item": i}} for i in (*puts.values(), *searched)])

    async def list_messages(self, tenant_id: str, session_id: str) -> list[StoredMessage]:
        items = await self._session_history(tenant_id, session_id, "MSG#", "MSG#", "SESS")
        items.sort(key=lambda i: _int(i, "pos"))
        return [StoredMessage(session_id, i["message_id"]["S"], _message_body(i), _opt_s(i, "turn_id"))
                for i in items]

    async def mark_archived(self, tenant_id: str, session_id: str) -> bool:
        """Mark the session item: some of its history is in the archive (the archive function, before
        it writes; reads of an unmarked session never call S3). False when there is no such session."""
        try:
            await self.client.update_item(
                TableName=self.table_name, Key=_key(_session_pk(tenant_id, session_id), "SESS"),
                UpdateExpression="SET #a = :now", ConditionExpression="attribute_exists(PK)",
                ExpressionAttributeNames={"#a": ARCHIVED_ATTRIBUTE},
                ExpressionAttributeValues={":now": _n(int(self._clock() * 1000))})
        except ClientError as exc:
            if _conditional_failed(exc):
                return False
            raise
        return True

    async def list_messages_since(self, tenant_id: str, session_id: str, since_ms: int) -> list[StoredMessage]:
        """The messages created at or after `since_ms`, by their time-ordered keys (a cached history's
        top-up: reads as many items as there are recent messages, whatever the conversation's length).
        Messages stored under the older key `MSG#{mid}` (before the time prefix) are not among them."""
        items = await self._query(
            KeyConditionExpression="PK = :pk AND SK BETWEEN :lo AND :hi", ConsistentRead=True,
            ExpressionAttributeValues={":pk": _s(_session_pk(tenant_id, session_id)),
                                       ":lo": _s(f"{_MSG_TIMED}{max(since_ms, 0):016d}"), ":hi": _s(f"{_MSG_TIMED}~")})
        items.sort(key=lambda i: _int(i, "pos"))
        return [StoredMessage(session_id, i["message_id"]["S"], _message_body(i), _opt_s(i, "turn_id"))
                for i in items]

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

    async def _newest_event(self, pk: str) -> Item | None:
        """The key and TTL of the newest block's last item (its head, or its last part): see `_block_seq`."""
        resp = await self.client.query(
            TableName=self.table_name, KeyConditionExpression="PK = :pk AND SK BETWEEN :lo AND :hi",
            ExpressionAttributeValues={":pk": _s(pk), ":lo": _s(_EVB), ":hi": _s(_EVB_HI)},
            ProjectionExpression="SK, #ttl", ExpressionAttributeNames={"#ttl": TTL_ATTRIBUTE},
            ScanIndexForward=False, Limit=1, ConsistentRead=True)
        items = resp.get("Items", [])
        return items[0] if items else None

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


if TYPE_CHECKING:
    from agentvm.ports import SessionLog

    def _implements_port(repo: DynamoSessionLog) -> SessionLog:  # mypy checks the port's signatures
        return repo
