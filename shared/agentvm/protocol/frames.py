"""Batched frames, an AgentVM extension (docs/protocol.md, "Batched frames").

A client that connects with `?frames=batch` receives, in one frame, the events queued for it at the
moment its sender takes them (those published in the same tick, and those published while the
previous frame was being posted): a JSON array of the event objects, in publish order, at most
`MAX_BATCH_BYTES` long. A frame that holds one event is that event's object, as for any client, so an
event too big for a batch is sent alone (in the cloud: inline up to 128 KB or by reference). A client
that does not ask (the stock AgentX client) gets one event per frame, exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# WebSocket close codes (RFC 6455) every front closes with.
GOING_AWAY = 1001
POLICY_VIOLATION = 1008
INTERNAL_ERROR = 1011
TRY_AGAIN_LATER = 1013

QUERY_PARAM = "frames"
QUERY_VALUE = "batch"
# API Gateway bills a WebSocket message per 32 KB unit: a batch never costs more than one.
MAX_BATCH_BYTES = 32 * 1024


def wants_batches(query: Mapping[str, Any] | None) -> bool:
    """Does an upgrade's query string ask for batched frames (`frames=batch`)?"""
    return query is not None and query.get(QUERY_PARAM) == QUERY_VALUE


class FrameBatch:
    """Events for one frame: `add` until it refuses, then send `frame()`."""

    __slots__ = ("limit", "payloads", "size")

    def __init__(self, first: str, *, limit: int = MAX_BATCH_BYTES) -> None:
        self.payloads = [first]
        self.size = len(first.encode()) + 2  # with the brackets
        self.limit = limit

    def add(self, payload: str) -> bool:
        """Take `payload` if the batch stays within the limit (with its comma); False otherwise."""
        grown = self.size + len(payload.encode()) + 1
        if grown > self.limit:
            return False
        self.payloads.append(payload)
        self.size = grown
        return True

    def frame(self) -> str:
        """One event: its own object; several: the array of them."""
        if len(self.payloads) == 1:
            return self.payloads[0]
        return "[" + ",".join(self.payloads) + "]"

    def __len__(self) -> int:
        return len(self.payloads)
