"""Portable session archives: one session (its image snapshot with the pinned resources, every
message, the turn log and its usage) as one JSON document, and back into any container.

```
{"format": "agentvm.session-archive", "version": 1, "exportedAt": ms,
 "origin": {"sessionId", "imageId", "containerId"},              # informational
 "image": {"name", "description", "systemPrompt", "config"},     # config: the snapshot, pins included
 "session": {"title", "createdAt"},
 "messages": [{"messageId", "turnRef"?, "body"}],                # conversation order
 "turns": [{"turnRef", "userMessageId", "status", "tier", "model", "usage", "listCost",
            "billedCost", "error", "createdAt", "startedAt", "endedAt", "agent", "task", "options",
            "firstTokenMs"?}],                                   # optional: archives before it lack it
 "usage": {"inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "listCost", "billedCost"},
 "checksum": "sha256:<hex>"}
```

The *content* is everything but `exportedAt`, `origin` and `checksum`; `checksum` is the sha256 of its
canonical JSON (sorted keys). Turn ids are replaced by refs (`t1`, `t2`, … in turn order) and no
other id of the server appears, so exporting an imported session gives the same content. Money is
Decimal text, never a float.

An import is checked whole before anything is written (format, version, checksum, every field).
Then the messages and turns are written under a new session id that nothing points to yet, and
the image with its session is created last: that write is the commit point, before which nothing
of the import is visible. A failure in between deletes what was written; a crash in between
leaves only rows that no image or session reaches.

Secrets: an export replaces the image's secrets (MCP servers' env values, header values, URL query
values and user information, credential flags in args; HTTP tools' headers and URL) with
`<redacted>` unless the caller asks for them (`include_secrets`). An imported image keeps the
markers; a message to it is refused (SecretsMissing) naming the fields. The checksum detects damage
(a truncated or altered file), not editing: anyone can recompute it, so an archive is only as
trustworthy as where it came from. Its MCP servers are configuration like any image's: their
commands run only in the importing tenant's container sandbox, with that tenant's rights."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from agentvm.domain.config_secrets import missing_secrets, redact_config
from agentvm.domain.models import Checkpoint, Image, Principal, Session, StoredMessage, Turn, TurnStatus, Usage
from agentvm.engine.context import conversation_order
from agentvm.errors import AgentVMError, InvalidRequest
from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.ids import image_id, now_ms, session_id, turn_id
from agentvm.money import money_text
from agentvm.services.image_sessions import MAX_TITLE_CHARS, ImageSessions
from agentvm.services.images import ImageService

log = logging.getLogger(__name__)

JSON = dict[str, Any]

ARCHIVE_FORMAT = "agentvm.session-archive"
ARCHIVE_VERSION = 1
WRITE_CHUNK = 200  # messages (and turns) per checkpoint of an import
UNFINISHED_CODE = "imported_unfinished"
UNFINISHED_TEXT = "This turn had not finished when its session was exported; it was imported as interrupted."
MAX_ID_CHARS = 128
_CONTAINER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")
_UNFINISHED = frozenset({TurnStatus.QUEUED, TurnStatus.RUNNING})
# not part of the content: they change with every export
_OUTSIDE_CONTENT = ("checksum", "exportedAt", "origin")
_USAGE_TOKENS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens")
_TOP = ("format", "version", "exportedAt", "origin", "image", "session", "messages", "turns", "usage", "checksum")
_IMAGE = ("name", "description", "systemPrompt", "config")
_SESSION = ("title", "createdAt")
_MESSAGE = ("messageId", "turnRef", "body")
_TURN = ("turnRef", "userMessageId", "status", "tier", "model", "usage", "listCost", "billedCost", "error",
         "createdAt", "startedAt", "endedAt", "agent", "task", "options")
_TURN_OPTIONAL = ("firstTokenMs",)
_TOTALS = (*_USAGE_TOKENS, "listCost", "billedCost")


class ArchiveTooLarge(AgentVMError):
    code = "archive_too_large"
    http_status = 413


def too_large(limit: int) -> ArchiveTooLarge:
    return ArchiveTooLarge(f"archive: larger than this server's limit of {limit} bytes (AVM_ARCHIVE_MAX_BYTES)",
                           field="archive")


def content_of(archive: Mapping[str, Any]) -> JSON:
    """What an export → import → export round trip keeps identical."""
    return {k: v for k, v in archive.items() if k not in _OUTSIDE_CONTENT}


def checksum_of(archive: Mapping[str, Any]) -> str:
    canonical = orjson.dumps(content_of(archive), option=orjson.OPT_SORT_KEYS)
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def encode_archive(archive: Mapping[str, Any]) -> bytes:
    return orjson.dumps(archive)


def parse_archive(raw: bytes | memoryview, *, max_bytes: int | None = None) -> JSON:
    """The archive's JSON object; InvalidRequest when it is not one (ArchiveTooLarge above `max_bytes`)."""
    if max_bytes is not None and len(raw) > max_bytes:
        raise too_large(max_bytes)
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the archive is not valid JSON (truncated or corrupted): {exc}",
                             field="archive") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("the archive is not a JSON object (a session archive is one)", field="archive")
    return doc


@dataclass(frozen=True, slots=True)
class ImportResult:
    session_id: str
    image_id: str
    container_id: str
    messages: int
    turns: int

    def to_wire(self) -> JSON:
        return {"sessionId": self.session_id, "imageId": self.image_id, "containerId": self.container_id,
                "messages": self.messages, "turns": self.turns}


# ---- validation ----------------------------------------------------------------------------------


def _bad(path: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{path}: {why}", field=path)


def _fields(value: Any, path: str, allowed: tuple[str, ...], required: tuple[str, ...]) -> JSON:
    """`value` as an object with only `allowed` keys and every `required` one (`path` "": the archive)."""
    if not isinstance(value, dict):
        raise _bad(path, "must be an object")
    prefix = f"{path}." if path else ""
    for key in value:
        if key not in allowed:
            raise _bad(f"{prefix}{key}", f"unknown field (known: {', '.join(allowed)})")
    for key in required:
        if key not in value:
            raise _bad(f"{prefix}{key}", "missing")
    return value


def _str(value: Any, path: str, *, optional: bool = False, max_chars: int | None = None,
         non_empty: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _bad(path, "must be a string" + (" or null" if optional else ""))
    if non_empty and not value:
        raise _bad(path, "must not be empty")
    if max_chars is not None and len(value) > max_chars:
        raise _bad(path, f"must be at most {max_chars} characters")
    return value


#: The largest integer an archive may hold (JSON's exact range; SQLite stores 64-bit integers).
MAX_ARCHIVE_INT = 2**53 - 1


def _int(value: Any, path: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(path, "must be a non-negative integer" + (" or null" if optional else ""))
    if value > MAX_ARCHIVE_INT:
        raise _bad(path, f"must be at most {MAX_ARCHIVE_INT}")
    return value


def _money(value: Any, path: str) -> Decimal:
    if not isinstance(value, str):
        raise _bad(path, "must be a decimal number as text (money is never a float)")
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise _bad(path, "must be a decimal number as text (money is never a float)") from None
    if not amount.is_finite() or amount < 0:
        raise _bad(path, "must be a finite, non-negative amount")
    return amount


def _usage(value: Any, path: str) -> Usage:
    u = _fields(value, path, _USAGE_TOKENS, _USAGE_TOKENS)
    tokens = [_int(u[k], f"{path}.{k}") or 0 for k in _USAGE_TOKENS]
    return Usage(*tokens)


def _check_snapshot(config: JSON) -> None:
    """The snapshot as the image builder makes it: what the engine and the tools read from it."""
    path = "image.config"
    if "model" in config:
        _str(config["model"], f"{path}.model", non_empty=True, max_chars=200)
    if "maxTokens" in config:
        tokens = _int(config["maxTokens"], f"{path}.maxTokens")
        if not tokens or tokens > 200_000:
            raise _bad(f"{path}.maxTokens", "must be an integer from 1 to 200000")
    if "tools" in config:
        from agentvm.tools.builtin import check_builtin_names  # loaded only when an archive is imported

        tools = config["tools"]
        if not isinstance(tools, list):
            raise _bad(f"{path}.tools", "must be a list of built-in tool names")
        try:
            check_builtin_names(tools)
        except InvalidRequest as exc:
            raise _bad(f"{path}.tools", exc.message.removeprefix("tools: ")) from None
    if "mcpServers" in config:
        from agentvm.tools.mcp import parse_mcp_servers

        try:
            parse_mcp_servers(config["mcpServers"])
        except InvalidRequest as exc:
            raise InvalidRequest(f"{path}.{exc.message}", field=f"{path}.{exc.field or 'mcpServers'}") from None
    if "sandbox" in config:
        from agentvm.domain.sandbox_spec import check_sandbox_content

        sandbox = config["sandbox"]
        if not isinstance(sandbox, dict):
            raise _bad(f"{path}.sandbox", "must be an object")
        try:
            check_sandbox_content(sandbox)
        except ValueError as exc:
            raise _bad(f"{path}.sandbox", str(exc)) from None
    if "httpTools" in config:
        tools = config["httpTools"]
        if not isinstance(tools, list):
            raise _bad(f"{path}.httpTools", "must be a list of objects")
        for i, spec in enumerate(tools):
            where = f"{path}.httpTools[{i}]"
            if not isinstance(spec, dict):
                raise _bad(where, "must be an object")
            for key in ("name", "url"):
                _str(spec.get(key), f"{where}.{key}", non_empty=True)
    if "knowledge" in config:
        refs = config["knowledge"]
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            raise _bad(f"{path}.knowledge", "must be a list of resource://knowledge/... references")
    for key in ("pins", "sources"):
        if key in config:
            table = config[key]
            if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
                raise _bad(f"{path}.{key}", "must be an object of strings")


@dataclass(slots=True)
class _Plan:
    """A checked archive, ready to be written under new ids."""

    image: JSON
    title: str | None
    created_at: int
    messages: list[tuple[str, str | None, JSON]]  # (message id, turn ref, body)
    turns: list[tuple[str, Turn]]  # (turn ref, the turn with placeholder ids)


def check_archive(archive: Mapping[str, Any]) -> _Plan:
    """Everything an import needs, checked whole: InvalidRequest naming the first problem."""
    if archive.get("format") != ARCHIVE_FORMAT:
        raise _bad("format", f'not a session archive (expected "{ARCHIVE_FORMAT}")')
    version = archive.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise _bad("version", f"must be an integer (this server reads {ARCHIVE_VERSION})")
    if version != ARCHIVE_VERSION:
        raise _bad("version", f"unknown archive version {version} (this server reads {ARCHIVE_VERSION})")
    checksum = archive.get("checksum")
    if not isinstance(checksum, str):
        raise _bad("checksum", "missing (an archive carries the sha256 of its content)")
    if checksum != checksum_of(archive):
        raise _bad("checksum", "the archive is corrupted (its content does not match its checksum)")
    _fields(dict(archive), "", _TOP, ("image", "session", "messages", "turns", "usage"))

    image = _fields(archive["image"], "image", _IMAGE, _IMAGE)
    _str(image["name"], "image.name", non_empty=True, max_chars=200)
    _str(image["description"], "image.description", optional=True)
    _str(image["systemPrompt"], "image.systemPrompt", optional=True)
    if not isinstance(image["config"], dict):
        raise _bad("image.config", "must be an object")
    _check_snapshot(image["config"])

    session = _fields(archive["session"], "session", _SESSION, _SESSION)
    title = _str(session["title"], "session.title", optional=True, max_chars=MAX_TITLE_CHARS)
    if title is not None and not title.strip():
        raise _bad("session.title", "must not be blank")
    created_at = _int(session["createdAt"], "session.createdAt") or 0

    turns = _check_turns(archive["turns"])
    messages = _check_messages(archive["messages"], {ref for ref, _turn in turns})
    ids = {mid for mid, _ref, _body in messages}
    for i, (_ref, turn) in enumerate(turns):
        if turn.user_message_id not in ids:
            raise _bad(f"turns[{i}].userMessageId", f"{turn.user_message_id} names no message of the archive")
    _check_totals(archive["usage"], [turn for _ref, turn in turns])
    return _Plan(image, title, created_at, messages, turns)


def _check_turns(value: Any) -> list[tuple[str, Turn]]:
    """The turn log, as turns with placeholder ids (tenant, turn, session, image, container)."""
    if not isinstance(value, list):
        raise _bad("turns", "must be a list")
    turns: list[tuple[str, Turn]] = []
    refs: set[str] = set()
    for i, raw in enumerate(value):
        at = f"turns[{i}]"
        t = _fields(raw, at, _TURN + _TURN_OPTIONAL, _TURN)
        ref = _str(t["turnRef"], f"{at}.turnRef", non_empty=True, max_chars=MAX_ID_CHARS) or ""
        if ref in refs:
            raise _bad(f"{at}.turnRef", f"{ref} names two turns")
        refs.add(ref)
        try:
            status = TurnStatus(t["status"])
        except ValueError:
            raise _bad(f"{at}.status", f"must be one of {', '.join(s.value for s in TurnStatus)}") from None
        _money(t["listCost"], f"{at}.listCost")
        _money(t["billedCost"], f"{at}.billedCost")
        error_code = error_message = None
        if t["error"] is not None:
            err = _fields(t["error"], f"{at}.error", ("code", "message"), ("code", "message"))
            error_code = _str(err["code"], f"{at}.error.code", optional=True)
            error_message = _str(err["message"], f"{at}.error.message", optional=True)
        if not isinstance(t["options"], dict):
            raise _bad(f"{at}.options", "must be an object")
        turns.append((ref, Turn(
            "", "", "", "", "",
            _str(t["userMessageId"], f"{at}.userMessageId", non_empty=True, max_chars=MAX_ID_CHARS) or "",
            status, _int(t["createdAt"], f"{at}.createdAt") or 0,
            tier=_str(t["tier"], f"{at}.tier", non_empty=True, max_chars=32) or "",
            model=_str(t["model"], f"{at}.model", optional=True, max_chars=200),
            usage=_usage(t["usage"], f"{at}.usage"),
            list_cost=t["listCost"], billed_cost=t["billedCost"], error_code=error_code, error_message=error_message,
            started_at=_int(t["startedAt"], f"{at}.startedAt", optional=True),
            ended_at=_int(t["endedAt"], f"{at}.endedAt", optional=True),
            agent=_str(t["agent"], f"{at}.agent", optional=True), task=_str(t["task"], f"{at}.task", optional=True),
            options=dict(t["options"]),
            first_token_ms=_int(t.get("firstTokenMs"), f"{at}.firstTokenMs", optional=True))))
    return turns


def _check_messages(value: Any, refs: set[str]) -> list[tuple[str, str | None, JSON]]:
    """(message id, turn ref, body) in conversation order; every turn ref one of `refs`."""
    if not isinstance(value, list):
        raise _bad("messages", "must be a list")
    messages: list[tuple[str, str | None, JSON]] = []
    seen: set[str] = set()
    for i, raw in enumerate(value):
        at = f"messages[{i}]"
        m = _fields(raw, at, _MESSAGE, ("messageId", "body"))
        mid = _str(m["messageId"], f"{at}.messageId", non_empty=True, max_chars=MAX_ID_CHARS) or ""
        if mid in seen:
            raise _bad(f"{at}.messageId", f"{mid} names two messages")
        seen.add(mid)
        ref = _str(m["turnRef"], f"{at}.turnRef", non_empty=True) if "turnRef" in m else None
        if ref is not None and ref not in refs:
            raise _bad(f"{at}.turnRef", f"{ref} names no turn of the archive")
        body = m["body"]
        if not isinstance(body, dict):
            raise _bad(f"{at}.body", "must be an object (an AgentX message)")
        if body.get("id") != mid:
            raise _bad(f"{at}.body.id", "must equal messageId")
        _str(body.get("role"), f"{at}.body.role", non_empty=True)
        if "timestamp" in body:
            _int(body["timestamp"], f"{at}.body.timestamp")
        messages.append((mid, ref, body))
    return messages


def _check_totals(value: Any, turns: list[Turn]) -> None:
    """The archive's usage totals are the sum of its turns' (money compared as Decimal)."""
    totals = _fields(value, "usage", _TOTALS, _TOTALS)
    tokens = _usage({k: totals[k] for k in _USAGE_TOKENS}, "usage")
    if tokens != sum((t.usage for t in turns), Usage()):
        raise _bad("usage", "the token totals do not match the sum of the turns")
    list_cost, billed_cost = _money(totals["listCost"], "usage.listCost"), _money(totals["billedCost"],
                                                                                "usage.billedCost")
    if list_cost != sum((Decimal(t.list_cost) for t in turns), Decimal(0)) or \
            billed_cost != sum((Decimal(t.billed_cost) for t in turns), Decimal(0)):
        raise _bad("usage", "the cost totals do not match the sum of the turns")


# ---- the service ---------------------------------------------------------------------------------


def _turn_entry(turn: Turn, ref: str) -> JSON:
    error = ({"code": turn.error_code, "message": turn.error_message}
             if turn.error_code is not None or turn.error_message is not None else None)
    return {"turnRef": ref, "userMessageId": turn.user_message_id, "status": str(turn.status), "tier": turn.tier,
            "model": turn.model, "usage": turn.usage.to_wire(), "listCost": turn.list_cost,
            "billedCost": turn.billed_cost, "error": error, "createdAt": turn.created_at,
            "startedAt": turn.started_at, "endedAt": turn.ended_at, "agent": turn.agent, "task": turn.task,
            "options": dict(turn.options), "firstTokenMs": turn.first_token_ms}


class SessionArchive:
    def __init__(self, deps: RuntimePorts, images: ImageService, center: ImageSessions) -> None:
        self.deps = deps
        self.images = images
        self.center = center

    async def export(self, p: Principal, sid: str, *, include_secrets: bool = False) -> JSON:
        """The session as an archive. Another tenant's session answers as not found. The image's
        secrets (MCP servers' env values, header values, URL query values and user information) are
        replaced by `<redacted>` unless `include_secrets` (domain/config_secrets.py).

        The turns are read before the messages: messages of a turn that began after that read (the
        session was in use) are left out with it, so every reference in the archive resolves."""
        session, image = await self.center.with_image(p, sid)
        store = self.deps.store
        turns = await store.list_turns(p.tenant_id, sid)
        refs = {t.turn_id: f"t{i}" for i, t in enumerate(turns, 1)}
        messages: list[JSON] = []
        for m in conversation_order(await store.list_messages(p.tenant_id, sid)):
            entry: JSON = {"messageId": m.message_id, "body": m.body}
            if m.turn_id is not None:
                if m.turn_id not in refs:
                    continue
                entry["turnRef"] = refs[m.turn_id]
            messages.append(entry)
        totals = Usage()
        list_total = billed_total = Decimal(0)
        for t in turns:
            totals += t.usage
            list_total += Decimal(t.list_cost)
            billed_total += Decimal(t.billed_cost)
        archive: JSON = {
            "format": ARCHIVE_FORMAT, "version": ARCHIVE_VERSION, "exportedAt": now_ms(),
            "origin": {"sessionId": session.session_id, "imageId": session.image_id,
                       "containerId": session.container_id},
            "image": {"name": image.name, "description": image.description, "systemPrompt": image.system_prompt,
                      "config": image.config if include_secrets else redact_config(image.config)[0]},
            "session": {"title": session.title, "createdAt": session.created_at},
            "messages": messages,
            "turns": [_turn_entry(t, refs[t.turn_id]) for t in turns],
            "usage": {**totals.to_wire(), "listCost": money_text(list_total), "billedCost": money_text(billed_total)},
        }
        archive["checksum"] = checksum_of(archive)
        return archive

    async def import_(self, p: Principal, container_id: str, archive: Mapping[str, Any]) -> ImportResult:
        """Restore an archive into the caller's container `container_id` (created if needed) as a new
        image with its session, under new ids. Checked whole first; nothing is visible until the
        image is created (the last write), and a failure before that deletes what was written."""
        if not isinstance(container_id, str) or not 1 <= len(container_id) <= MAX_ID_CHARS or \
                not _CONTAINER_ID.match(container_id):
            raise _bad("containerId", "1 to 128 letters, digits and . _ : @ -, starting with a letter or digit")
        plan = check_archive(archive)
        tenant, store, ts = p.tenant_id, self.deps.store, now_ms()
        iid, sid = image_id(), session_id()
        # new ids sort like the archive's order, so turns created in the same millisecond keep it
        new_ids = sorted(turn_id() for _ in plan.turns)
        ids = {ref: new_ids[i] for i, (ref, _turn) in enumerate(plan.turns)}
        turns: list[Turn] = []
        for ref, t in plan.turns:
            t.tenant_id, t.turn_id, t.session_id, t.image_id, t.container_id = tenant, ids[ref], sid, iid, container_id
            if t.status in _UNFINISHED:  # nothing must try to run it here
                t.status, t.error_code, t.error_message = TurnStatus.INTERRUPTED, UNFINISHED_CODE, UNFINISHED_TEXT
                t.ended_at = t.ended_at or ts
            turns.append(t)
        messages = [StoredMessage(sid, mid, body, ids[ref] if ref is not None else None)
                    for mid, ref, body in plan.messages]
        image = plan.image
        new_image = Image(tenant, iid, container_id, sid, image["name"], ts, ts, image["description"],
                          image["systemPrompt"], image["config"])
        last = max((int(m.body.get("timestamp", 0)) for m in messages), default=0)
        session = Session(tenant, sid, iid, container_id, plan.created_at, max(plan.created_at, last), plan.title)
        try:
            for i in range(0, max(len(messages), len(turns)), WRITE_CHUNK):
                await store.commit(Checkpoint(tenant, sid, messages=messages[i:i + WRITE_CHUNK],
                                              turns=turns[i:i + WRITE_CHUNK]))
            await self.images.containers.ensure(p, container_id)
            await store.create_image(new_image, session)  # the commit point: now it exists
        except BaseException:
            await self._discard(tenant, sid)
            raise
        log.info("session imported", extra={"session_id": sid, "image_id": iid, "container_id": container_id,
                                            "messages": len(messages), "turns": len(turns),
                                            "without_secrets": sorted(missing_secrets(image["config"]))})
        return ImportResult(sid, iid, container_id, len(messages), len(turns))

    async def _discard(self, tenant: str, sid: str) -> None:
        try:
            await self.deps.store.delete_session(tenant, sid)
        except Exception:  # best effort: the rows are unreachable anyway
            log.warning("could not delete the rows of a failed import", extra={"session_id": sid}, exc_info=True)
