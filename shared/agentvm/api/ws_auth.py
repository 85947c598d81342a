"""The WebSocket auth handshake, one for `avm serve` (api/ws_endpoint.py) and the cloud (`ws_default`),
as docs/tenancy.md states it.

An upgrade without credentials (a browser cannot set headers) must send
`{"type": "auth", "headers": {"Authorization": "Bearer <key>"}}` first, within the auth timeout of its
connect; the frame is answered with nothing, and never echoed or logged. `avm serve` reads that frame
before anything else and closes the socket (1008, the reason) when it is missing or bad. In the cloud,
`$connect` recorded the connection as not yet authenticated and `ConnectionHandshake` takes its frames:
API Gateway does not order one connection's frames, so a frame other than `auth` waits (re-reading the
connection) until the connection is authenticated, or the deadline has passed; a refusal is a
`system_error` frame with the reason, then the connection is deleted (API Gateway cannot send a close
code of ours)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson

from agentvm.auth.api_keys import Authenticator, extract_token
from agentvm.domain.models import ConnectionRecord, Principal
from agentvm.errors import Unauthorized, public_message
from agentvm.ids import now_ms
from agentvm.protocol.envelope import encode, event
from agentvm.protocol.events import SystemError

log = logging.getLogger(__name__)

# close reasons fit a close frame (123 bytes): what a client shows when its key is missing
AUTH_FIRST = 'API key required: send {"type": "auth", "headers": {"Authorization": "Bearer <key>"}} first'
NOT_JSON = "API key required: the first frame is not JSON (send the auth frame first)"
NOT_CONNECTED = "This connection is not authenticated any more: reconnect with your API key."
# how long past the deadline a waiting frame still gives an `auth` frame in flight to land (cloud)
AUTH_GRACE_MS = 500
_POLL_FIRST_S, _POLL_MAX_S = 0.05, 0.5


def timeout_reason(timeout_s: float) -> str:
    return f"API key required: no auth frame within {timeout_s:g} s"


@dataclass(frozen=True, slots=True)
class AuthFrame:
    """A first frame read as an `auth` frame: `headers` when it is a well-formed one, else the reason
    to refuse it (`is_auth`: it is an `auth` frame, well formed or not)."""

    is_auth: bool
    headers: Mapping[str, str] | None
    refusal: str


def read_auth_frame(body: str | bytes) -> AuthFrame:
    try:
        frame = orjson.loads(body)
    except orjson.JSONDecodeError:
        return AuthFrame(False, None, NOT_JSON)
    if not isinstance(frame, dict) or frame.get("type") != "auth":
        return AuthFrame(False, None, AUTH_FIRST)
    headers = frame.get("headers")
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        return AuthFrame(True, None, AUTH_FIRST)
    return AuthFrame(True, headers, "")


async def upgrade_principal(authenticator: Authenticator, headers: Mapping[str, str],
                            query: Mapping[str, str] | None) -> Principal | None:
    """The caller an upgrade names (the header or `?token=`); None when it names none: an `auth`
    frame comes next. A bad key raises `Unauthorized`: the upgrade is refused."""
    token = extract_token(headers, query)
    return None if token is None else await authenticator.authenticate(token)


async def frame_principal(authenticator: Authenticator, headers: Mapping[str, str]) -> Principal:
    """The caller an `auth` frame names: the same key check as on an upgrade."""
    return await authenticator.authenticate(extract_token(headers, None))


def unauthorized_frame(reason: str) -> str:
    err = SystemError(message=public_message(Unauthorized(reason)), severity="error", code="unauthorized")
    return encode(event("system_error", err, None))


class HandshakeConnections(Protocol):
    """What the handshake needs of the cloud's connection registry."""

    async def get_connection(self, connection_id: str) -> ConnectionRecord | None: ...
    async def authenticate(self, connection_id: str, tenant_id: str, key_id: str | None) -> bool: ...
    async def delete_connection(self, connection_id: str) -> None: ...


class HandshakeGateway(Protocol):
    """What the handshake needs of the cloud's gateway: say why, then close."""

    async def post(self, connection_id: str, frame: str) -> bool: ...
    async def delete_connection(self, connection_id: str) -> bool: ...


@dataclass(slots=True)
class ConnectionHandshake:
    """The cloud's side: each frame of a connection goes through `admit`. `on_authenticated()` and
    `on_refused(why)` count what happened (the function's metrics)."""

    connections: HandshakeConnections
    gateway: HandshakeGateway
    authenticator: Authenticator
    timeout_s: float
    on_authenticated: Callable[[], None] = lambda: None
    on_refused: Callable[[str], None] = lambda why: None

    async def admit(self, connection_id: str, body: str | bytes, received_ms: int | None = None
                    ) -> ConnectionRecord | None:
        """The connection's record to handle the frame under, once it is authenticated; None when
        there is nothing more to do (the connection is unknown or refused, or this was its `auth`
        frame). `received_ms`: when the frame arrived (the deadline judges its arrival, not how long
        the record's read took under load); now when not given."""
        received_ms = now_ms() if received_ms is None else received_ms
        record = await self.connections.get_connection(connection_id)
        if record is None:  # its record expired or $connect never completed
            await self.gateway.post(connection_id, unauthorized_frame(NOT_CONNECTED))
            return None
        if record.authenticated:
            return record
        return await self._pending(record, body, received_ms)

    async def _pending(self, record: ConnectionRecord, body: str | bytes, received_ms: int) -> ConnectionRecord | None:
        cid = record.connection_id
        deadline = record.connected_at + int(self.timeout_s * 1000)
        frame = read_auth_frame(body)
        if frame.is_auth:
            if received_ms > deadline:
                await self._refuse(cid, timeout_reason(self.timeout_s), "auth_timeout")
            elif frame.headers is None:
                await self._refuse(cid, frame.refusal, "not_authenticated")
            else:
                try:
                    principal = await frame_principal(self.authenticator, frame.headers)
                except Unauthorized as exc:
                    await self._refuse(cid, exc.message, "invalid_key")
                else:
                    if await self.connections.authenticate(cid, principal.tenant_id, principal.key_id):
                        self.on_authenticated()
            return None  # answered with nothing, as avm serve does
        # Another frame: the `auth` frame may be on its way in a concurrent invocation.
        current: ConnectionRecord | None = record
        delay = _POLL_FIRST_S
        while current is not None and not current.authenticated:
            left_ms = deadline + AUTH_GRACE_MS - now_ms()
            if left_ms <= 0:
                await self._refuse(cid, frame.refusal, "not_authenticated")
                return None
            await asyncio.sleep(min(delay, left_ms / 1000))
            delay = min(delay * 2, _POLL_MAX_S)
            current = await self.connections.get_connection(cid)
        return current  # None: refused or disconnected meanwhile

    async def _refuse(self, connection_id: str, reason: str, why: str) -> None:
        """Say why in a `system_error` frame, then close the connection (the frame itself is never logged)."""
        log.info("websocket refused", extra={"reason": reason})
        try:
            await self.gateway.post(connection_id, unauthorized_frame(reason))
            await self.gateway.delete_connection(connection_id)
        except Exception:  # the record goes anyway: the connection can do nothing more
            log.exception("could not close a refused connection")
        await self.connections.delete_connection(connection_id)  # $disconnect does it too; sooner is safer
        self.on_refused(why)
