"""The turn-host tier's records: a turn request on the queue, a host in the directory."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """Run the queued turns of a session. `receipt`: the queue's handle of the message (to delete it)."""

    tenant_id: str
    session_id: str
    receipt: str = ""


@dataclass(frozen=True, slots=True)
class TurnHostRecord:
    """A turn host as registered: valid until `until_ms` (its heartbeat extends it), running
    `running` of `capacity` sessions, `accepting` new ones or not (draining, at capacity, CPU-bound)."""

    host_id: str
    until_ms: int
    capacity: int
    running: int
    accepting: bool

    def takes_turns(self, now_ms: int) -> bool:
        """Alive and accepting, with room as of its last heartbeat."""
        return self.accepting and self.until_ms > now_ms and self.running < self.capacity
