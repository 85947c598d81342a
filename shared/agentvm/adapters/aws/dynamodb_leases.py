"""The SessionLeases port on the session item of the AgentVM table.

Attributes kept on `SESS` beside the store's own: `lease_owner`, `lease_until` (epoch ms),
`seq_reserved` (the store's seq counter: a lease comes with a block of seqs), the session's
coordination sets `queued`, `announce`, `pending_subs` (string sets), the `interrupts` counter,
`runner`: the owner of a turn runner while it holds (or held, and died holding) the lease, and
`definitions`: bumped when the session's agent is destroyed (runners' cached definitions expire).

`acquire` returns the session itself too (its `ALL_OLD` is the whole item): a runner needs no
separate read of it.

Every step of the cloud turn protocol is one conditional UpdateItem that returns the whole state
(`ReturnValues=ALL_NEW`): taking the lease reserves seqs and shows the queue; releasing it removes
finished work and shows what was added meanwhile (release-then-recheck without a second request).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from agentvm.adapters.aws.dynamodb_items import (
    Item,
    _conditional_failed,
    _evlog_keys,
    _k,
    _key,
    _n,
    _s,
    _session,
    _session_pk,
    _turn,
)
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.domain.models import LeaseHandoff, LeaseState, Turn

_STATE = "lease_owner, lease_until, queued, announce, pending_subs, interrupts, interrupts_seen"


class DynamoDBLeases:
    def __init__(self, store: DynamoDBStore) -> None:
        self.store = store

    def _now_ms(self) -> int:
        clock: Callable[[], float] = self.store._clock
        return int(clock() * 1000)

    async def _update(self, tenant_id: str, session_id: str, expression: str, values: Item,
                      condition: str | None, *, returns: str = "ALL_NEW") -> Item | None:
        params: dict[str, Any] = {
            "TableName": self.store.table_name, "Key": _key(_session_pk(tenant_id, session_id), "SESS"),
            "UpdateExpression": expression, "ExpressionAttributeValues": values, "ReturnValues": returns}
        if condition:
            params["ConditionExpression"] = condition
        try:
            resp = await self.store.client.update_item(**params)
        except ClientError as exc:
            if _conditional_failed(exc):
                return None
            raise
        attrs: Item = resp.get("Attributes", {})
        return attrs

    async def acquire(self, tenant_id: str, session_id: str, owner: str, ttl_ms: int,
                      seq_block: int, *, runner: bool = False, queue: str | None = None,
                      handoff: LeaseHandoff | None = None) -> LeaseState | None:
        # ALL_OLD: the state before this write. The sets are unchanged by it (but for `queue`, added
        # below); the seq block is computed from the old counter, and a `resume_seq` left by a clean
        # release (no lease owner any more) continues the session's seqs without a gap, as does the
        # `next_seq` of a handoff taken over. After an expired lease (its holder died) the new block
        # starts above everything reserved: that holder may have used any of it.
        # A runner marks itself in the same write (`runner`), and only its own release removes the
        # mark: one found here was left by a runner that died holding the lease (no extra request).
        values: Item = {}
        condition = "attribute_not_exists(lease_until) OR lease_until < :now OR lease_owner = :o"
        if handoff is not None:
            condition += " OR lease_owner = :h"
            values[":h"] = _s(handoff.owner)
        return await self._take(tenant_id, session_id, owner, ttl_ms, seq_block, runner=runner,
                                condition=condition, values=values, queue=queue, handoff=handoff)

    async def take_over(self, tenant_id: str, session_id: str, owner: str, dead_runner: str, ttl_ms: int,
                        seq_block: int) -> LeaseState | None:
        # Only while the dead runner's mark is on the record and no one else holds the lease: a live
        # runner has its own mark, and a short-lived holder (ws_default after the lease expired) hands
        # the queue on to the runner it starts.
        return await self._take(tenant_id, session_id, owner, ttl_ms, seq_block, runner=True,
                                condition="runner = :dead AND (lease_owner = :dead OR "
                                          "attribute_not_exists(lease_until) OR lease_until < :now)",
                                values={":dead": _s(dead_runner)})

    async def _take(self, tenant_id: str, session_id: str, owner: str, ttl_ms: int, seq_block: int, *,
                    runner: bool, condition: str, values: Item, queue: str | None = None,
                    handoff: LeaseHandoff | None = None) -> LeaseState | None:
        now = self._now_ms()
        evlog = _evlog_keys(tenant_id, session_id)
        mark = ", runner = :o" if runner else ""
        adds = "seq_reserved :b"
        if queue is not None:
            adds += ", queued :q"
            values = {**values, ":q": {"SS": [queue]}}
        old = await self._update(
            tenant_id, session_id,
            f"SET lease_owner = :o, lease_until = :u, SPK = :spk, SSK = :ssk{mark} ADD {adds} REMOVE resume_seq",
            {":o": _s(owner), ":u": _n(now + ttl_ms), ":now": _n(now), ":b": _n(seq_block),
             ":spk": evlog["SPK"], ":ssk": evlog["SSK"], **values},
            f"attribute_exists(PK) AND ({condition})", returns="ALL_OLD")
        if old is None:
            return None
        before = int(old["seq_reserved"]["N"]) if "seq_reserved" in old else 0
        attrs = {**old, "lease_owner": _s(owner), "lease_until": _n(now + ttl_ms)}
        if queue is not None:
            attrs["queued"] = {"SS": sorted(_strings(old, "queued") | {queue})}
        first = before + 1
        resume = old.get("resume_seq")
        previous = old["lease_owner"]["S"] if "lease_owner" in old else None
        if resume is not None and previous is None and int(resume["N"]) <= before:
            first = int(resume["N"])
        elif handoff is not None and previous == handoff.owner and 0 < handoff.next_seq <= before + 1:
            first = handoff.next_seq
        dead = old["runner"]["S"] if "runner" in old and old["runner"]["S"] != owner else ""
        session = _session(old) if "image_id" in old and "container_id" in old else None
        # with seq_block 0 the block is empty (first > last when nothing is handed on): the holder
        # publishes nothing and hands `first_seq` on at its release
        return replace(_state(attrs, now, first_seq=first, last_seq=before + max(seq_block, 0), dead_runner=dead),
                       session=session)

    async def renew(self, tenant_id: str, session_id: str, owner: str, ttl_ms: int) -> LeaseState | None:
        now = self._now_ms()
        attrs = await self._update(tenant_id, session_id, "SET lease_until = :u",
                                   {":o": _s(owner), ":u": _n(now + ttl_ms)}, "lease_owner = :o")
        return None if attrs is None else _state(attrs, now)

    async def release(self, tenant_id: str, session_id: str, owner: str, *, queue: str | None = None,
                      done: Collection[str] = (), announced: Collection[tuple[str, str]] = (),
                      served: Collection[str] = (), next_seq: int | None = None,
                      runner: bool = False) -> LeaseState | None:
        if queue is not None and done:
            raise ValueError("release: queue and done cannot change the queue in the same write")
        values: Item = {":o": _s(owner)}
        expression = "REMOVE lease_owner, lease_until" + (", runner" if runner else "")
        if next_seq is not None:
            expression = "SET resume_seq = :ns " + expression
            values[":ns"] = _n(next_seq)
        if queue is not None:
            expression += " ADD queued :q"
            values[":q"] = {"SS": [queue]}
        removals = []
        for name, ids, placeholder in (("queued", done, ":d"), ("announce", [_pair(a) for a in announced], ":a"),
                                       ("pending_subs", served, ":p")):
            if ids:
                removals.append(f"{name} {placeholder}")
                values[placeholder] = {"SS": sorted(set(ids))}
        if removals:
            expression += " DELETE " + ", ".join(removals)
        attrs = await self._update(tenant_id, session_id, expression, values, "lease_owner = :o")
        return None if attrs is None else _state(attrs, self._now_ms())

    async def poll(self, tenant_id: str, session_id: str, *, consistent: bool = False) -> LeaseState:
        # Eventually consistent by default (half the price): a signal seen one poll later is still
        # acted on, and every decision that must be exact is a conditional write.
        resp = await self.store.client.get_item(
            TableName=self.store.table_name, Key=_key(_session_pk(tenant_id, session_id), "SESS"),
            ProjectionExpression=f"{_STATE}, runner", ConsistentRead=consistent)
        attrs, now = resp.get("Item", {}), self._now_ms()
        state = _state(attrs, now)
        if "runner" in attrs and not state.held:  # a runner's mark on an expired lease: it died
            state = replace(state, dead_runner=attrs["runner"]["S"])
        return state

    async def enqueue(self, tenant_id: str, session_id: str, turn_id: str, sender: str | None) -> None:
        await self._update(tenant_id, session_id, "ADD queued :t, announce :a",
                           {":t": {"SS": [turn_id]}, ":a": {"SS": [_pair((turn_id, sender or ""))]}},
                           "attribute_exists(PK)")

    async def owe_replay(self, tenant_id: str, session_id: str, connection_id: str) -> None:
        await self._update(tenant_id, session_id, "ADD pending_subs :c", {":c": {"SS": [connection_id]}},
                           "attribute_exists(PK)")

    async def request_interrupt(self, tenant_id: str, session_id: str) -> int | None:
        attrs = await self._update(tenant_id, session_id, "ADD interrupts :one",
                                   {":one": _n(1), ":now": _n(self._now_ms())}, "lease_until >= :now")
        return None if attrs is None else int(attrs["interrupts"]["N"])

    async def bump_definitions(self, tenant_id: str, session_id: str) -> None:
        await self._update(tenant_id, session_id, "ADD definitions :one", {":one": _n(1)}, "attribute_exists(PK)",
                           returns="NONE")

    async def ack_interrupt(self, tenant_id: str, session_id: str, owner: str, count: int) -> None:
        await self._update(tenant_id, session_id, "SET interrupts_seen = :n", {":n": _n(count), ":o": _s(owner)},
                           "lease_owner = :o")

    async def get_turns(self, tenant_id: str, session_id: str, turn_ids: Collection[str]) -> list[Turn]:
        if not turn_ids:
            return []
        pk = _session_pk(tenant_id, session_id)
        items = await self.store._batch_get([_key(pk, f"TURN#{_k(t)}") for t in sorted(set(turn_ids))])
        return sorted((_turn(i) for i in items), key=lambda t: (t.created_at, t.turn_id))


def _strings(attrs: Mapping[str, Any], name: str) -> frozenset[str]:
    value = attrs.get(name)
    return frozenset(value["SS"]) if value else frozenset()


_SEP = " "  # neither turn ids nor API Gateway connection ids contain a space


def _pair(entry: tuple[str, str]) -> str:
    return f"{entry[0]}{_SEP}{entry[1]}"


def _pairs(attrs: Mapping[str, Any], name: str) -> frozenset[tuple[str, str]]:
    out = set()
    for value in _strings(attrs, name):
        turn, _, sender = value.partition(_SEP)
        out.add((turn, sender))
    return frozenset(out)


def _state(attrs: Mapping[str, Any], now_ms: int, *, first_seq: int = 0, last_seq: int = 0,
           dead_runner: str = "") -> LeaseState:
    until = attrs.get("lease_until")
    return LeaseState(first_seq=first_seq, last_seq=last_seq, queued=_strings(attrs, "queued"),
                      announce=_pairs(attrs, "announce"), pending_subs=_strings(attrs, "pending_subs"),
                      interrupts=int(attrs["interrupts"]["N"]) if "interrupts" in attrs else 0,
                      interrupts_seen=int(attrs["interrupts_seen"]["N"]) if "interrupts_seen" in attrs else 0,
                      held=until is not None and int(until["N"]) >= now_ms, dead_runner=dead_runner,
                      definitions=int(attrs["definitions"]["N"]) if "definitions" in attrs else 0)


if TYPE_CHECKING:
    from agentvm.ports import SessionLeases

    def _implements_leases(leases: DynamoDBLeases) -> SessionLeases:  # mypy checks the port's signatures
        return leases
