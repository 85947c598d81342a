"""The turn hosts' own WebSocket front (AVM_TURN_HOST_WS_PORT: template.yaml `WebSocketFront=LoadBalancer`)
with `python -m agentvm.turnhost` as real processes against moto and the emulated edge:

(a) a stock AgentX client on host A's front gets exactly the frames a client gets through API
Gateway, its turn runs on A (no queue hop, no `chat_turn`), and a second subscriber on host B gets
the same session events (posted A → B over B's internal endpoint); (b) a bad key: API Gateway
refuses the upgrade with 401 and the reason, the host's front accepts it and closes it at once with
1008 and the same reason (nothing else reaches it), a missing `auth` frame closes with 1008, a bad one gets
the `system_error` frame then 1008; the internal endpoint refuses a post without B's token;
(c) host A killed with SIGKILL mid-turn: the client on B sees the turn fail `worker_lost` once the
lease lapsed (a sweep), the budget hold is released, and a fresh subscriber replaying the event log
gets every stored event once, in order (B got every stored one live too; the dead run's deltas were
never stored).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from agentvm.adapters.aws.dynamodb_connections import DynamoDBConnections
from agentvm.adapters.aws.dynamodb_turn_hosts import DynamoDBTurnHosts
from agentvm.adapters.aws.dynamodb_usage import DynamoDBUsageLedger
from agentvm.api.ws_auth import timeout_reason
from agentvm.cloud.runtime import CloudRuntime
from agentvm.config import Settings
from agentvm.domain.usage import Budget, period_of
from agentvm.hosting.session_worker import WORKER_LOST_TEXT
from agentvm.hosting.turn_sweep import SWEEP_GRACE_MS, sweep
from agentvm.ids import now_ms
from tests.cloud import test_turn_host_process
from tests.cloud.test_turn_host_process import (
    LEASE_S,
    MODEL,
    REPO,
    TENANT,
    Stack,
    _log_file,
    _text,
    session_of,
)
from tests.support.servers import free_port
from tests.support.stock_client import StockClient

AUTH_TIMEOUT_S = 1
stack = test_turn_host_process.stack  # the fixture: moto, the emulated edge, a key, a turn queue


@dataclass
class FrontHost:
    proc: asyncio.subprocess.Process
    ws_port: int
    peer_port: int
    token: str
    log: Path

    def url(self, token: str | None) -> str:
        base = f"ws://127.0.0.1:{self.ws_port}/"
        return f"{base}?token={token}" if token else base

    def stopped(self) -> dict[str, Any]:
        """The host's "turn host stopped" log record."""
        for line in self.log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("msg") == "turn host stopped":
                    return dict(record)
        raise AssertionError(self.log.read_text()[-4000:])


@contextlib.asynccontextmanager
async def front_host(stack: Stack, **env: str) -> AsyncIterator[FrontHost]:
    """A turn host with its own front, healthy (registered) before this yields; drained after."""
    ws_port, peer_port = free_port(), free_port()
    path = stack.tmp / f"front-{uuid.uuid4().hex[:6]}.log"
    log = _log_file(path)
    full = {**os.environ, **stack.env, "AVM_TURN_HOST_WS_PORT": str(ws_port),
            "AVM_TURN_HOST_PEER_PORT": str(peer_port), "AVM_TURN_HOST_ADDRESS": "127.0.0.1",
            "AVM_AUTH_TIMEOUT_S": str(AUTH_TIMEOUT_S), **env,
            "PYTHONPATH": os.pathsep.join(str(REPO / part) for part in ("shared", "local", "client", "."))}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "agentvm.turnhost", cwd=REPO, env=full,
                                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient() as http:
            while True:
                assert proc.returncode is None and time.monotonic() < deadline, _text(log)
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(f"http://127.0.0.1:{ws_port}/health")).status_code == 200:
                        break
                await asyncio.sleep(0.05)
        hosts = await DynamoDBTurnHosts(stack.store).list_hosts()
        mine = [h for h in hosts if h.port == peer_port]
        assert len(mine) == 1 and mine[0].address == "127.0.0.1" and len(mine[0].token) >= 40
        yield FrontHost(proc, ws_port, peer_port, mine[0].token, path)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
        log.close()
    assert code in (0, -signal.SIGKILL), path.read_text()[-4000:]


async def _subscribers(stack: Stack, session_id: str, n: int, timeout: float = 10.0) -> None:
    registry = DynamoDBConnections(stack.store)
    deadline = time.monotonic() + timeout
    while len(await registry.subscribers(TENANT, session_id)) < n:
        assert time.monotonic() < deadline, f"the session never had {n} subscribers"
        await asyncio.sleep(0.05)


def _token(stack: Stack) -> str:
    assert stack.edge.token is not None
    return stack.edge.token


async def test_a_stock_client_on_a_host_gets_the_api_gateway_frames_and_b_gets_the_same_events(
        stack: Stack) -> None:
    token = _token(stack)
    async with front_host(stack) as a, front_host(stack) as b:
        async with StockClient(stack.edge.url) as via_api:
            image = await via_api.new_image("c-api", model=MODEL)
            on_api = await via_api.turn(image["imageId"], "slow one", timeout=30)
        async with StockClient(a.url(token)) as on_a, StockClient(b.url(token)) as on_b:
            mine = await on_a.new_image("c-a", model=MODEL)
            on_host = await on_a.turn(mine["imageId"], "slow one", timeout=30)
            # the frames of the whole conversation, responses included, are those of API Gateway
            assert [e["type"] for e in on_a.events] == [e["type"] for e in via_api.events]
            assert len(on_a.raw) == len(via_api.raw)
            assert session_of(on_host) == session_of(on_api)
            assert on_host[-1]["type"] == "turn_response" and on_host[-1]["data"]["status"] == "completed"

            await on_b.request("image_get_request", {"imageId": mine["imageId"]})  # subscribes on B
            # the stock client's `subscribe` frame follows the response unanswered: wait until B's host
            # has stored it, or A could announce the next message before B is a subscriber
            await _subscribers(stack, mine["sessionId"], 2)
            start_b, raw_b = len(on_b.events), len(on_b.raw)
            second = await on_a.turn(mine["imageId"], "slow two", timeout=30)
            await on_b.wait_for(lambda e: e.get("type") == "turn_response", 30, start_b)
            seen_b = [e for e in on_b.events[start_b:] if "seq" in e]
            posted_to_b = len(on_b.raw) - raw_b  # every frame of A's turn, each an internal post A → B
        await stack.edge.settle(include_invokes=True)
        assert stack.chat_turns() == []
    # B got every event of the turn, in order, once; the sender does not get its own user_message
    assert [e["seq"] for e in seen_b] == sorted({e["seq"] for e in seen_b})
    sent = {e["seq"] for e in second}
    assert [e["type"] for e in seen_b if e["seq"] not in sent] == ["user_message"]
    assert session_of([e for e in seen_b if e["seq"] in sent]) == session_of(second)
    assert [e["seq"] for e in seen_b if e["seq"] in sent] == [e["seq"] for e in second]
    # A ran its client's two turns itself (no queue hop); the API Gateway client's turn came through
    # the queue to one of the hosts
    stopped_a, stopped_b = a.stopped(), b.stopped()
    emf = [json.loads(line) for line in a.log.read_text().splitlines() if '"_aws"' in line]
    accepted = [m for m in emf if "ConnectionsAccepted" in m]  # the ws_connect metric, from the host's front
    assert [(m["function"], m["ConnectionsAccepted"]) for m in accepted] == [("turn_host", [1.0])]
    lines = [json.loads(line) for line in a.log.read_text().splitlines() if '"websocket accepted"' in line]
    assert [line.get("auth") for line in lines] == ["key"]  # how it authenticated: a log field, not a dimension
    assert (stopped_a["local"], stopped_b["local"]) == (2, 0)
    assert (stopped_a["received"] + stopped_b["received"], stopped_a["refused"] + stopped_b["refused"]) == (1, 0)
    assert posted_to_b == len(seen_b) > 0
    assert (stopped_b["front"]["peer_posted"], stopped_b["front"]["peer_refused"]) == (posted_to_b, 0)
    assert stopped_a["front"]["peer_posted"] == 0  # B's frames to A: none (B ran no turn, A's client got its own)


async def test_bad_and_missing_keys_are_refused_as_on_the_other_fronts(stack: Stack) -> None:
    async with front_host(stack) as a:
        with pytest.raises(InvalidStatus) as err:  # API Gateway: $connect's 401 refuses the upgrade
            async with connect(stack.edge.url.split("?")[0] + "?token=avm_bad"):
                pass
        assert (err.value.response.status_code, err.value.response.body) == (401, b"API key not valid")
        # the host's front is no API Gateway: 1008 and the reason, which a browser can read
        async with connect(a.url("avm_bad")) as ws:
            with contextlib.suppress(ConnectionClosed):  # the close may be in already
                await ws.send(json.dumps({"type": "container_create_request", "timestamp": 1, "source": "command",
                                          "category": "request", "intent": "request",
                                          "data": {"containerId": "c-refused", "requestId": "r0"}}))
            got = []
            with pytest.raises(ConnectionClosed):
                while True:
                    got.append(await asyncio.wait_for(ws.recv(), 10))
        assert (got, ws.close_code, ws.close_reason) == ([], 1008, "API key not valid")

        async with connect(a.url(None)) as ws:  # no key and no auth frame
            started = time.monotonic()
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
            assert ws.close_code == 1008 and ws.close_reason == timeout_reason(AUTH_TIMEOUT_S)
            assert AUTH_TIMEOUT_S <= time.monotonic() - started < AUTH_TIMEOUT_S + 3

        frames = []
        for url in (stack.edge.url.split("?")[0], a.url(None)):
            async with connect(url) as ws:
                await ws.send(json.dumps({"type": "auth", "headers": {"Authorization": "Bearer avm_bad"}}))
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 10)
                if url.startswith(f"ws://127.0.0.1:{a.ws_port}"):
                    assert (ws.close_code, ws.close_reason) == (1008, "unauthorized")
        for f in frames:
            f.pop("timestamp", None)
        assert frames[0] == frames[1] and frames[0]["type"] == "system_error"

        async with connect(a.url(None)) as ws:  # a good auth frame: then requests work
            await ws.send(json.dumps({"type": "auth", "headers": {"Authorization": f"Bearer {_token(stack)}"}}))
            await ws.send(json.dumps({"type": "container_create_request", "timestamp": 1, "source": "command",
                                      "category": "request", "intent": "request",
                                      "data": {"containerId": "c-auth", "requestId": "r1"}}))
            answer: dict[str, Any] = {}
            while answer.get("category") != "response":
                answer = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert answer["type"] == "container_create_response" and "error" not in answer["data"]
            assert answer["data"]["requestId"] == "r1"

        closes = []  # a message above API Gateway's 128 KB: closed 1009 on both fronts
        for url in (stack.edge.url, a.url(_token(stack))):
            async with connect(url, max_size=None) as ws:
                await ws.send("x" * (128 * 1024 + 1))
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 10)
                closes.append(ws.close_code)
        assert closes == [1009, 1009]

        # the internal endpoint: nothing is delivered without the host's token
        async with httpx.AsyncClient() as http:
            cid = "h-x-1"
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": a.token}):
                res = await http.post(f"http://127.0.0.1:{a.peer_port}/@connections/{cid}", content=b"{}",
                                      headers=headers)
                assert res.status_code == 401
            res = await http.post(f"http://127.0.0.1:{a.peer_port}/@connections/{cid}", content=b"{}",
                                  headers={"authorization": f"Bearer {a.token}"})
            assert res.status_code == 410  # authenticated, and no such socket


async def test_a_host_killed_mid_turn_the_client_on_b_sees_worker_lost_and_nothing_is_lost(stack: Stack) -> None:
    token = _token(stack)
    ledger, period = DynamoDBUsageLedger(stack.store), period_of(now_ms())
    await ledger.put_budget(Budget(TENANT, monthly=Decimal(5), updated_at=now_ms()))
    rt = await CloudRuntime(Settings()).ready()  # the sweep's runtime: the tiered dispatcher
    async with front_host(stack) as b, StockClient(b.url(token)) as on_b:
        async with front_host(stack) as a, StockClient(a.url(token)) as on_a:
            image = await on_a.new_image("c-kill", model=MODEL)
            sid = image["sessionId"]
            await on_b.request("image_get_request", {"imageId": image["imageId"]})
            start_b = len(on_b.events)
            res = await on_a.request("message_send_request", {"imageId": image["imageId"], "content": "slow, killed"})
            assert "error" not in res["data"], res["data"]
            deltas = iter(range(3, 0, -1))  # the third text_delta on B
            await on_b.wait_for(lambda e: e.get("type") == "text_delta" and next(deltas) == 1, 20, start_b)
            assert (await ledger.spend(TENANT, None, period)).reserved > 0
            a.proc.kill()
            await a.proc.wait()
            killed_at = time.monotonic()
        seen = len(on_b.events)
        await asyncio.sleep(max(0.0, LEASE_S + 0.5 - (time.monotonic() - killed_at)))
        report = await sweep(rt.store, rt.leases, rt.dispatcher, now_ms=now_ms() + SWEEP_GRACE_MS)
        assert (report.sessions, report.dispatched, report.failed) == (1, 1, 0)
        failed = await on_b.wait_for(lambda e: e.get("type") == "turn_response", 20, seen)
        assert failed["data"]["status"] == "failed"
        assert time.monotonic() - killed_at < LEASE_S + 10
        errors = [e["data"] for e in on_b.events[seen:] if e.get("type") == "error_occurred"]
        assert errors == [{"code": "worker_lost", "message": WORKER_LOST_TEXT, "recoverable": True}]
        deadline = time.monotonic() + 5  # the run on B gives the hold back as it ends (another process)
        while (await ledger.spend(TENANT, None, period)).reserved != 0:
            assert time.monotonic() < deadline, await ledger.spend(TENANT, None, period)
            await asyncio.sleep(0.05)
        live = [e["seq"] for e in on_b.events[start_b:] if "seq" in e]
        assert live == sorted(set(live))

        async with StockClient(b.url(token)) as again:  # resume from the event log
            await again.send_raw({"type": "subscribe", "sessionId": sid, "afterSeq": 0})
            stored = await stack.store.read_events(TENANT, sid, 0)
            deadline = time.monotonic() + 10
            while len([e for e in again.events if "seq" in e]) < len(stored):
                assert time.monotonic() < deadline, (len(again.events), len(stored))
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # nothing more comes
            replayed = [e["seq"] for e in again.events if "seq" in e]
            assert replayed == [ev.seq for ev in stored]
        # B missed nothing stored since it subscribed (the dead run's deltas were never stored)
        assert [q for q in replayed if q >= live[0]] == [q for q in live if q in set(replayed)]
        assert live[-1] == replayed[-1]
        turns = await stack.store.list_turns(TENANT, sid)
        assert [(t.status, t.error_code) for t in turns] == [("failed", "worker_lost")]
    await rt.store.close()
