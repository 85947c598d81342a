"""Start-up recovery: turns a crash left queued or running are closed as failed, with an error
message in their history, so the conversation reads truthfully and the next message works."""

from __future__ import annotations

import logging

from agentvm.domain.models import Checkpoint, StoredMessage, TurnStatus
from agentvm.ids import message_id, now_ms
from agentvm.ports import Store
from agentvm.protocol import messages as msgs

log = logging.getLogger(__name__)

RESTART_CODE = "server_restart"
RESTART_TEXT = "The server stopped before this turn finished; send the message again to retry."


async def recover_unfinished_turns(store: Store) -> int:
    turns = await store.list_unfinished_turns()
    for turn in turns:
        ts = now_ms()
        turn.status = TurnStatus.FAILED
        turn.error_code, turn.error_message = RESTART_CODE, RESTART_TEXT
        turn.ended_at = ts
        mid = message_id()
        body = msgs.error_message(mid, RESTART_TEXT, RESTART_CODE, ts)
        await store.commit(Checkpoint(turn.tenant_id, turn.session_id,
                                      messages=[StoredMessage(turn.session_id, mid, body, turn.turn_id)],
                                      turns=[turn]))
    if turns:
        log.warning("recovered unfinished turns", extra={"count": len(turns)})
    return len(turns)
