"""The turn-host tier's records: a turn request on the queue, a host in the directory."""

from __future__ import annotations

from dataclasses import dataclass

from agentvm.domain.models import LeaseHandoff


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """Run the queued turns of a session. `receipt`: the queue's handle of the message (to delete it);
    `handoff`: the lease passed on by the `ws_default` that sent it (`LeaseHandoff`)."""

    tenant_id: str
    session_id: str
    receipt: str = ""
    handoff: LeaseHandoff | None = None


@dataclass(frozen=True, slots=True)
class TurnHostRecord:
    """A turn host as registered: valid until `until_ms` (its heartbeat extends it), running
    `running` of `capacity` sessions, `accepting` new ones or not (draining, at capacity, CPU-bound).

    A host with its own WebSocket front also names where other hosts post frames for its connections
    (`address`:`port`, its private address) and the random `token` those posts must carry; empty
    without a front."""

    host_id: str
    until_ms: int
    capacity: int
    running: int
    accepting: bool
    address: str = ""
    port: int = 0
    token: str = ""

    def takes_turns(self, now_ms: int) -> bool:
        """Alive and accepting, with room as of its last heartbeat."""
        return self.accepting and self.until_ms > now_ms and self.running < self.capacity


#: The connection ids of a turn host's own WebSocket front: `h-<host id>-<random>` (API Gateway's
#: are 15 base64 characters and `=`, never with this prefix).
HOST_CONNECTION_PREFIX = "h-"


def host_connection_id(host_id: str, random_part: str) -> str:
    return f"{HOST_CONNECTION_PREFIX}{host_id}-{random_part}"


def host_of(connection_id: str) -> str | None:
    """The host whose front holds the connection; None for an API Gateway connection."""
    if not connection_id.startswith(HOST_CONNECTION_PREFIX):
        return None
    host, sep, rest = connection_id[len(HOST_CONNECTION_PREFIX):].rpartition("-")
    return host if sep and host and rest else None
