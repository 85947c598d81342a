"""Images and their sessions on the table (`ImageRepository`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from botocore.exceptions import ClientError

from agentvm.adapters.aws.dynamodb_items import (
    ARCHIVED_ATTRIBUTE,
    Item,
    _conditional_failed,
    _error_code,
    _image,
    _image_pk,
    _int,
    _k,
    _key,
    _n,
    _put_new,
    _put_opt,
    _s,
    _search_key,
    _session,
    _session_entry_key,
    _session_items,
    _session_pk,
    _ts,
)
from agentvm.adapters.aws.dynamodb_table import GSI_CONTAINER, GSI_TENANT, DynamoTable
from agentvm.domain.cursors import next_session_cursor, session_cursor
from agentvm.domain.models import Image, Session
from agentvm.errors import Conflict


class DynamoImages(DynamoTable):
    """`ImageRepository` on DynamoDB: deleting an image or a session deletes everything of it."""

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
        they are found through their messages, so a delete cut short can still find them). A session
        marked archived has its archive deleted here, before any of its items (so a delete cut
        short still finds the mark and finishes)."""
        children = await self._query(KeyConditionExpression="PK = :pk",
                                     ProjectionExpression="PK, SK, message_id, created_at, srch, #a",
                                     ExpressionAttributeNames={"#a": ARCHIVED_ATTRIBUTE},
                                     ExpressionAttributeValues={":pk": _s(_session_pk(tenant_id, session_id))},
                                     ConsistentRead=True)
        if self.archive is not None and any(ARCHIVED_ATTRIBUTE in c for c in children):
            await self.archive.delete_session(tenant_id, session_id)
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

    async def list_tenant_sessions(self, tenant_id: str, *, image_id: str | None = None, limit: int = 50,
                                   cursor: str | None = None) -> tuple[list[Session], str | None]:
        """One image's: its partition's session entries (SK `SESS#<created>#<id>`); the tenant's:
        GSI1 (`TENANT#<t>#SESS`, G1SK `<created>#<id>`). Both read backwards from the cursor."""
        before = session_cursor(cursor)
        if image_id is not None:
            prefix, pk_name, key, pk = "SESS#", "PK", "SK", _image_pk(tenant_id, image_id)
            params: dict[str, Any] = {"ConsistentRead": True}
        else:
            prefix, pk_name, key, pk = "", "G1PK", "G1SK", f"TENANT#{_k(tenant_id)}#SESS"
            params = {"IndexName": GSI_TENANT}
        high = f"{prefix}{_ts(before[0])}#{_k(before[1])}" if before is not None else f"{prefix}~"
        params.update({
            "TableName": self.table_name, "ScanIndexForward": False,
            "KeyConditionExpression": f"{pk_name} = :pk AND {key} BETWEEN :low AND :high",
            "ExpressionAttributeValues": {":pk": _s(pk), ":low": _s(prefix or "0"), ":high": _s(high)}})
        items: list[Item] = []
        while len(items) <= limit:
            resp = await self.client.query(**params, Limit=limit + 1 - len(items))
            items += [i for i in resp.get("Items", []) if i[key]["S"] != high]  # BETWEEN includes high
            if "LastEvaluatedKey" not in resp:
                break
            params["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        sessions = [_session(i) for i in items]
        return sessions[:limit], (next_session_cursor(sessions[limit - 1]) if len(sessions) > limit else None)

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


if TYPE_CHECKING:
    from agentvm.ports import ImageRepository

    def _implements_port(repo: DynamoImages) -> ImageRepository:  # mypy checks the port's signatures
        return repo
