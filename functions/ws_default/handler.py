"""$default: every client frame goes through the AgentX command router. Answers and events are
posted to connections; turns are handed to `chat_turn` (never run inside the 29 s integration).

A connection `$connect` accepted without credentials must authenticate with a first frame
`{"type": "auth", "headers": {"Authorization": "Bearer <key>"}}` within AVM_AUTH_TIMEOUT_S of its
connect, as on `avm serve` (docs/tenancy.md). The frame is answered with nothing, and is never logged
or echoed. A bad key, a malformed `auth` frame, or no `auth` frame in time gets a `system_error`
frame with the reason, then the connection is deleted (API Gateway cannot send a close code of ours).
API Gateway does not order one connection's frames: a frame other than `auth` that arrives while the
connection is not yet authenticated waits (re-reading the connection) until it is, or until the
deadline has passed, and only then closes the connection."""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import orjson

# loaded at init (and in a SnapStart snapshot), not by the first request
import agentvm.adapters.aws.cloud_fanout
import agentvm.api.ws_router  # noqa: F401
from agentvm.auth.api_keys import extract_token
from agentvm.cloud.observability import Count, observe
from agentvm.cloud.runtime import CloudRuntime, run, runtime
from agentvm.domain.models import ConnectionRecord, Principal
from agentvm.errors import Unauthorized, public_message
from agentvm.ids import now_ms
from agentvm.protocol.envelope import encode, event
from agentvm.protocol.events import SystemError

log = logging.getLogger("agentvm.ws_default")
obs = observe("ws_default")

NOT_CONNECTED = "This connection is not authenticated any more: reconnect with your API key."
# the reasons avm serve closes such a connection with (api/ws_endpoint.py)
AUTH_FIRST = ('authenticate first: {"type": "auth", "headers": {"Authorization": "Bearer <key>"}} '
              '(or the header or ?token= on the upgrade)')
NOT_JSON = "authenticate first: the first frame is not JSON"
# how long past the deadline a waiting frame still gives an `auth` frame in flight to land
AUTH_GRACE_MS = 500
_POLL_FIRST_S, _POLL_MAX_S = 0.05, 0.5


async def _frame(connection_id: str, body: str | bytes) -> None:
    rt = await runtime().ready()
    record = await rt.registry.get_connection(connection_id)
    if record is None:  # its record expired or $connect never completed
        err = SystemError(message=public_message(Unauthorized(NOT_CONNECTED)), severity="error",
                          code="unauthorized")
        await rt.gateway.post(connection_id, encode(event("system_error", err, None)))
        return
    if not record.authenticated:
        authenticated = await _pending(rt, record, body)
        if authenticated is None:
            return
        record = authenticated
    inv = rt.invocation(record.tenant_id, role="ws_default")
    inv.fanout.known(record)
    try:
        await rt.router(inv).handle_frame(Principal(record.tenant_id, record.key_id), connection_id, body)
    finally:
        await inv.fanout.close()


def _auth_frame(body: str | bytes) -> tuple[bool, dict[str, str] | None, str]:
    """(is an `auth` frame, its headers when well formed, the reason to refuse it otherwise)."""
    try:
        frame = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False, None, NOT_JSON
    if not isinstance(frame, dict) or frame.get("type") != "auth":
        return False, None, AUTH_FIRST
    headers = frame.get("headers")
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        return True, None, AUTH_FIRST
    return True, headers, ""


async def _pending(rt: CloudRuntime, record: ConnectionRecord, body: str | bytes) -> ConnectionRecord | None:
    """A frame of a connection not yet authenticated: the record to handle it with once the
    connection is authenticated, or None when there is nothing more to do (this was the `auth` frame,
    or the connection was refused)."""
    cid = record.connection_id
    timeout_s = rt.settings.auth_timeout_s
    deadline = record.connected_at + int(timeout_s * 1000)
    is_auth, headers, reason = _auth_frame(body)
    if is_auth:
        if now_ms() > deadline:
            await _refuse(rt, cid, f"no auth frame within {timeout_s:g} s", "auth_timeout")
        elif headers is None:
            await _refuse(rt, cid, reason, "not_authenticated")
        else:
            try:
                principal = await rt.authenticator.authenticate(extract_token(headers, None))
            except Unauthorized as exc:
                await _refuse(rt, cid, exc.message, "invalid_key")
            else:
                if await rt.registry.authenticate(cid, principal.tenant_id, principal.key_id):
                    obs.metric("ConnectionsAuthenticated", Count, 1, auth="frame")
        return None  # answered with nothing, as avm serve does
    # Another frame: the `auth` frame may be on its way in a concurrent invocation.
    current: ConnectionRecord | None = record
    delay = _POLL_FIRST_S
    while current is not None and not current.authenticated:
        left_ms = deadline + AUTH_GRACE_MS - now_ms()
        if left_ms <= 0:
            await _refuse(rt, cid, reason, "not_authenticated")
            return None
        await asyncio.sleep(min(delay, left_ms / 1000))
        delay = min(delay * 2, _POLL_MAX_S)
        current = await rt.registry.get_connection(cid)
    return current  # None: refused or disconnected meanwhile


async def _refuse(rt: CloudRuntime, connection_id: str, reason: str, why: str) -> None:
    """Say why in a `system_error` frame, then close the connection (the frame itself is never logged)."""
    log.info("websocket refused", extra={"reason": reason})
    err = SystemError(message=public_message(Unauthorized(reason)), severity="error", code="unauthorized")
    try:
        await rt.gateway.post(connection_id, encode(event("system_error", err, None)))
        await rt.gateway.delete_connection(connection_id)
    except Exception:  # the record goes anyway: the connection can do nothing more
        log.exception("could not close a refused connection")
    await rt.registry.delete_connection(connection_id)  # $disconnect does it too; sooner is safer
    obs.metric("ConnectionsRefused", Count, 1, reason=why)


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, int]:
    body: str | bytes = event.get("body") or ""
    if event.get("isBase64Encoded") and isinstance(body, str):
        body = base64.b64decode(body)
    run(_frame(event["requestContext"]["connectionId"], body))
    return {"statusCode": 200}
