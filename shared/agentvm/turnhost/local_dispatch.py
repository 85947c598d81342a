"""How a turn host's own front starts turns: on the host itself when it has room (no SQS hop, no
Lambda invoke), else as everywhere else (the tiered dispatcher: another host through the queue, or
`chat_turn`). The session's turns still run under its DynamoDB lease (hosting/session_worker.py)."""

from __future__ import annotations

from agentvm.domain.models import LeaseHandoff
from agentvm.ports import Dispatcher
from agentvm.turnhost.host import TurnHost


class LocalFirstDispatcher:
    def __init__(self, host: TurnHost, fallback: Dispatcher) -> None:
        self.host = host
        self.fallback = fallback
        #: where each dispatch went: "here" | "elsewhere"
        self.counts: dict[str, int] = {"here": 0, "elsewhere": 0}

    async def start_turns(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None:
        if self.host.take_here(tenant_id, session_id, handoff):
            self.counts["here"] += 1
            return
        self.counts["elsewhere"] += 1
        await self.fallback.start_turns(tenant_id, session_id, handoff=handoff)
