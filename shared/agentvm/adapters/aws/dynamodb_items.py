"""The table's items: keys and attribute values, and each record (container, image, agent, session,
turn, search item, resource) to and from its item. The table's layout: `dynamodb_table`."""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import unquote

import orjson
from botocore.exceptions import ClientError

from agentvm.domain.models import (
    Agent,
    Container,
    Image,
    ResourceVersion,
    Session,
    StoredMessage,
    Turn,
    TurnStatus,
    Usage,
)

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.type_defs import TransactWriteItemTypeDef

Item = dict[str, Any]

TTL_ATTRIBUTE: Final = "expires_at"
#: On the session item: set (epoch ms) once the archive function archived some of its history.
ARCHIVED_ATTRIBUTE: Final = "archived_at"
SHARDS: Final = 8
#: zlib level: 6 is 10-15 % smaller than 1 on a turn's events for ~0.1-0.2 ms more per checkpoint.
_ZLIB_LEVEL = 6
_UNFINISHED = (TurnStatus.QUEUED, TurnStatus.RUNNING)
_RES_HEAD = "RES"
_PUBLIC_LIST = "PUBLIC#RES"  # the GSI1 partition of every tenant's published resources


# ---- keys and attribute values ---------------------------------------------------------------


def _k(value: str) -> str:
    """Escape an id for use inside a composite key."""
    return value.replace("%", "%25").replace("#", "%23")


def _ts(ms: int) -> str:
    return f"{ms:016d}"


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


#: A message body above this many bytes is stored zlib-compressed (`bz`) when that is smaller: a write
#: unit is per KB, and an assistant reply of ~2,000 characters of prose then costs 1 unit, not 3.
BODY_COMPRESS_BYTES: Final = 512


def _body_attrs(body: Mapping[str, Any]) -> Item:
    """A message item's body: `body` (JSON text), or `bz` (the same, zlib-compressed) when it is long."""
    raw = orjson.dumps(body)
    if len(raw) > BODY_COMPRESS_BYTES:
        packed = zlib.compress(raw, _ZLIB_LEVEL)
        if len(packed) < len(raw):
            return {"bz": {"B": packed}}
    return {"body": _s(raw.decode())}


def _message_body(item: Mapping[str, Any]) -> dict[str, Any]:
    data = zlib.decompress(item["bz"]["B"]) if "bz" in item else item["body"]["S"]
    return cast(dict[str, Any], orjson.loads(data))


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
            {"PK": _s(pk), "SK": _s(sk), **_tenant_session_index(session), **attrs})


def _tenant_session_index(session: Session) -> Item:
    """GSI1 keys of a session's entry: the tenant's sessions newest first (`list_tenant_sessions`)."""
    return {"G1PK": _s(f"TENANT#{_k(session.tenant_id)}#SESS"),
            "G1SK": _s(f"{_ts(session.created_at)}#{_k(session.session_id)}")}


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


def _expiring(item: Item, expires_s: int | None) -> Item:
    """Give a history item (message, search item, turn) its `expires_at`: the write time plus the hot
    window (`DynamoTable._history_expiry`); None (a window of 0) keeps it forever."""
    if expires_s is not None:
        item[TTL_ATTRIBUTE] = _n(expires_s)
    return item


def _alive(item: Mapping[str, Any], now_s: int) -> bool:
    """False once TTL has passed: DynamoDB deletes expired items lazily, reads must not see them."""
    expires = _opt_int(item, TTL_ATTRIBUTE)
    return expires is None or expires > now_s


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
