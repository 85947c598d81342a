"""The three WebSocket routes of the cloud, one implementation for both fronts: API Gateway's
`$connect`, `$default` and `$disconnect` functions (functions/ws_*/handler.py) and the turn host's own
front (turnhost/front.py), which calls them for each upgrade, inbound frame and close.

* `connect`: authenticate the key of the upgrade (header or `?token=`) and record connection →
  principal. An upgrade without credentials is recorded as not yet authenticated: its first frame
  must be an `auth` frame within AVM_AUTH_TIMEOUT_S (docs/tenancy.md). A bad key is refused (401).
* `frame`: the `ConnectionHandshake` (api/ws_auth.py), then the AgentX command router.
* `disconnect`: forget the connection with its subscriptions and watches.

`metric(name, unit, value)` counts what happened (the caller's metrics: a function's EMF, or nothing);
the breakdowns (how a connection authenticated, why it was refused) are log fields, not metric
dimensions (docs/observability.md, "Cloud metrics")."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agentvm.auth.api_keys import extract_token
from agentvm.cloud.observability import Count
from agentvm.domain.models import ConnectionRecord, Principal
from agentvm.errors import Unauthorized
from agentvm.ids import now_ms
from agentvm.protocol.frames import wants_batches

if TYPE_CHECKING:
    from agentvm.cloud.runtime import CloudRuntime

log = logging.getLogger("agentvm.ws_connect")

class Metric(Protocol):
    def __call__(self, name: str, unit: Any, value: float) -> None: ...


def no_metric(name: str, unit: Any, value: float) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Connected:
    """What an upgrade gets: `status` 200 (accepted; `authenticated` False when an `auth` frame must
    follow) or 401 with the `reason`."""

    status: int
    reason: str = ""
    authenticated: bool = True


async def connect(rt: CloudRuntime, connection_id: str, headers: Mapping[str, str] | None,
                  query: Mapping[str, str] | None, metric: Metric = no_metric) -> Connected:
    token = extract_token(headers, query)
    batch = wants_batches(query)
    if token is None:  # the first frame authenticates it, within AVM_AUTH_TIMEOUT_S
        await rt.registry.put_connection(ConnectionRecord(connection_id, "", None, now_ms(), authenticated=False,
                                                          batch=batch))
        log.info("websocket accepted", extra={"auth": "frame"})
        metric("ConnectionsAccepted", Count, 1)
        return Connected(200, authenticated=False)
    try:
        principal = await rt.authenticator.authenticate(token)
    except Unauthorized as exc:
        log.info("websocket refused", extra={"reason": "invalid_key", "detail": exc.message})
        metric("ConnectionsRefused", Count, 1)
        return Connected(401, exc.message)
    await rt.registry.put_connection(ConnectionRecord(connection_id, principal.tenant_id, principal.key_id,
                                                      now_ms(), batch=batch))
    log.info("websocket accepted", extra={"auth": "key"})
    metric("ConnectionsAccepted", Count, 1)
    return Connected(200)


async def frame(rt: CloudRuntime, connection_id: str, body: str | bytes, metric: Metric = no_metric, *,
                role: str = "ws_default", received_ms: int | None = None) -> ConnectionRecord | None:
    """Handle one inbound frame; the connection's record when it was handled as an authenticated
    connection's frame, None when the handshake took it (an `auth` frame, a refusal). `received_ms`:
    when the front received it (API Gateway's `requestTimeEpoch`), for the auth deadline."""
    # imported here: `connect` and `disconnect` never load the router (ws_default loads it at init)
    from agentvm.api.ws_auth import ConnectionHandshake

    handshake = ConnectionHandshake(
        rt.registry, rt.gateway, rt.authenticator, rt.settings.auth_timeout_s,
        on_refused=lambda why: metric("ConnectionsRefused", Count, 1))  # the reason is in its log line
    record = await handshake.admit(connection_id, body, received_ms)
    if record is None:
        return None
    inv = rt.invocation(record.tenant_id, role=role)
    inv.fanout.known(record)
    try:
        await rt.router(inv).handle_frame(Principal(record.tenant_id, record.key_id), connection_id, body)
    finally:
        await inv.fanout.close()
    return record


async def disconnect(rt: CloudRuntime, connection_id: str) -> None:
    await rt.registry.delete_connection(connection_id)
