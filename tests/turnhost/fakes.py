"""Fakes of the turn-host ports."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agentvm.domain.models import LeaseHandoff
from agentvm.domain.turn_hosts import TurnHostRecord, TurnRequest


class Dispatches:
    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []
        self.handoffs: list[LeaseHandoff | None] = []

    async def start_turns(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None:
        self.started.append((tenant_id, session_id))
        self.handoffs.append(handoff)


class Queue:
    def __init__(self, *, fail: bool = False) -> None:
        self.sent: list[tuple[str, str]] = []
        self.deleted: list[str] = []
        self.fail = fail
        self.handoffs: list[LeaseHandoff | None] = []
        self.inbox: asyncio.Queue[list[TurnRequest]] = asyncio.Queue()
        self.receives = 0

    async def send(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None:
        if self.fail:
            raise RuntimeError("SQS is down")
        self.sent.append((tenant_id, session_id))
        self.handoffs.append(handoff)

    async def receive(self, max_count: int, wait_s: float) -> list[TurnRequest]:
        self.receives += 1
        try:
            return await asyncio.wait_for(self.inbox.get(), wait_s)
        except TimeoutError:
            return []

    async def delete(self, requests: Sequence[TurnRequest]) -> None:
        self.deleted += [r.receipt for r in requests]


class Directory:
    def __init__(self, hosts: list[TurnHostRecord] | None = None, *, fail: bool = False) -> None:
        self.hosts = {h.host_id: h for h in hosts or []}
        self.lists = 0
        self.fail = fail
        self.beats: list[TurnHostRecord] = []
        self.deregistered: list[str] = []

    async def heartbeat(self, host: TurnHostRecord) -> None:
        self.beats.append(host)
        self.hosts[host.host_id] = host

    async def deregister(self, host_id: str) -> None:
        self.deregistered.append(host_id)
        self.hosts.pop(host_id, None)

    async def list_hosts(self) -> list[TurnHostRecord]:
        self.lists += 1
        if self.fail:
            raise RuntimeError("DynamoDB is down")
        return list(self.hosts.values())
