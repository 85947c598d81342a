"""Page cursors of the turn log and of the sessions list: opaque to clients, checked when they come back."""

from __future__ import annotations

import base64
import binascii

from agentvm.domain.models import Session, Turn
from agentvm.errors import InvalidRequest
from agentvm.ids import MAX_EPOCH_MS


def next_turn_cursor(last: Turn) -> str:
    """The cursor of the page after the one that ended with `last` (pages go newest first)."""
    return _encode(last.created_at, last.turn_id)


def next_session_cursor(last: Session) -> str:
    """The cursor of the sessions page after the one that ended with `last` (newest first)."""
    return _encode(last.created_at, last.session_id)


def _encode(created_at: int, item_id: str) -> str:
    return base64.urlsafe_b64encode(f"{created_at}#{item_id}".encode()).decode().rstrip("=")


def session_cursor(cursor: str | None) -> tuple[int, str] | None:
    """(created_at, session_id) of a cursor from `next_session_cursor`; InvalidRequest for anything else."""
    return turn_cursor(cursor)


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
