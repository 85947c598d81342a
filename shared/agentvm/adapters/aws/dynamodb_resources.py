"""The resource center on the table (`ResourceRepository`)."""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from agentvm.adapters.aws.dynamodb_items import (
    _PUBLIC_LIST,
    _RES_HEAD,
    Item,
    _int,
    _k,
    _key,
    _latest_attrs,
    _n,
    _name_key,
    _ordered,
    _public_key,
    _published_id,
    _Resource,
    _resource_pk,
    _resource_version,
    _s,
    _version_item,
    _version_sk,
)
from agentvm.adapters.aws.dynamodb_table import GSI_BY_ID, GSI_TENANT, DynamoTable
from agentvm.domain.models import ResourceVersion
from agentvm.errors import Conflict, InvalidRequest, NotFound

#: The latest version's attributes a resource's listed items carry (what list filters read).
_LATEST = ("version", "version_key", "description", "tags")


class DynamoResources(DynamoTable):
    """`ResourceRepository` on DynamoDB."""

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

    def _claim_public(self, res: _Resource, latest: Item) -> Item:
        """Put the published name: free, or already this resource's (the owner has one per name)."""
        return self._put_op(res.public_item(latest), "attribute_not_exists(PK) OR #owner = :owner",
                            ExpressionAttributeNames={"#owner": "tenant_id"},
                            ExpressionAttributeValues={":owner": _s(res.owner)})

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
    from agentvm.ports import ResourceRepository

    def _implements_port(repo: DynamoResources) -> ResourceRepository:  # mypy checks the port's signatures
        return repo
