"""Page cursors of the turn log: opaque to clients, checked when they come back."""

from __future__ import annotations

import base64
import binascii

from agentvm.domain.models import Turn
from agentvm.errors import InvalidRequest
from agentvm.ids import MAX_EPOCH_MS


def next_turn_cursor(last: Turn) -> str:
    """The cursor of the page after the one that ended with `last` (pages go newest first)."""
    return base64.urlsafe_b64encode(f"{last.created_at}#{last.turn_id}".encode()).decode().rstrip("=")


def turn_cursor(cursor: str | None) -> tuple[int, str] | None:
    """(created_at, turn_id) of a cursor from `next_turn_cursor`; InvalidRequest for anything else."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, turn_id = raw.split("#", 1)
        if not turn_id or not 0 <= int(created) <= MAX_EPOCH_MS:
            raise ValueError(raw)
        return int(created), turn_id
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("cursor: not a cursor of this list", field="cursor") from None
