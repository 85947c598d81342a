"""The turn-host tier with `python -m agentvm.turnhost` as a real process against moto and the
emulated edge (the scripted driver of AVM_SCRIPT_PATH, a priced model):

(a) with no host running, turns run on `chat_turn`; (b) a host that starts takes the new turns (no
`chat_turn` invocation) and the client sees the same events in the same order; (c) a host at
capacity refuses, and another session's turn runs on `chat_turn` at once; (d) a host killed with
SIGKILL mid-turn: once its short lease has lapsed, a sweep starts a runner that fails the turn
`worker_lost`, the client has no duplicated seq and misses nothing stored, the budget hold is given
back, and the session's next message runs normally (on `chat_turn`). Also: a bad setting stops the
host at start-up with one line on stderr and exit code 2.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from typing import IO, Any

import pytest

from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.dynamodb_turn_hosts import DynamoDBTurnHosts
from agentvm.adapters.aws.dynamodb_usage import DynamoDBUsageLedger
from agentvm.cloud.runtime import CloudRuntime
from agentvm.config import Settings
from agentvm.domain.usage import Budget, period_of
from agentvm.hosting.session_worker import WORKER_LOST_TEXT
from agentvm.hosting.turn_sweep import SWEEP_GRACE_MS, sweep
from agentvm.ids import now_ms
from tests.aws_fixtures import REGION, put_new_key, without_agentvm_env
from tests.support.cloud_edge import CloudEdge, cloud_edge
from tests.support.scripts import slow_reply_script
from tests.support.stock_client import StockClient
from tests.support.turn_hosts import create_queue

REPO = Path(__file__).resolve().parents[2]
TENANT = "t-hosts"
MODEL = "claude-haiku-4-5"  # priced: each LLM call holds its worst case on the budget
SCRIPT = slow_reply_script("^slow", delay_ms=150)
LEASE_S = 3
HEARTBEAT_S = 0.5


@dataclass
class Stack:
    edge: CloudEdge
    store: DynamoDBStore
    env: dict[str, str]
    tmp: Path

    def chat_turns(self) -> list[str]:
        return [e["sessionId"] for e in self.edge.calls("chat_turn")]


@pytest.fixture
async def stack(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch,
                tmp_path: Path) -> AsyncIterator[Stack]:
    without_agentvm_env(monkeypatch)
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    table = f"agentvm-{uuid.uuid4().hex[:16]}"
    store = DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION)
    await store.open()
    await store.create_table()
    _key, token = await put_new_key(store, TENANT)
    env = {"AVM_CHAT_TURN_FUNCTION": "agentvm-chat-turn:live", "AVM_RELIABLE_WRAPPER": "false",
           "AVM_SCRIPT_PATH": str(script), "AVM_TURN_QUEUE_URL": create_queue(moto_endpoint),
           "AVM_SESSION_LEASE_S": str(LEASE_S), "AVM_TURN_HOST_HEARTBEAT_S": str(HEARTBEAT_S),
           "AVM_TURN_HOST_POLL_S": "0"}  # moto serves one request at a time: no long poll
    try:
        async with cloud_edge(moto_endpoint=moto_endpoint, token=token, table_name=table) as edge:
            env.update(edge.handler_env())
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            yield Stack(edge, store, env, tmp_path)
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def turn_host(stack: Stack, **env: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """`python -m agentvm.turnhost` in a process of its own, registered (and seen by every
    dispatcher: their directory cache lapses) before this yields; drained with SIGTERM after."""
    log = _log_file(stack.tmp / f"host-{uuid.uuid4().hex[:6]}.log")
    full = {**os.environ, **stack.env, **env, "PYTHONPATH": os.pathsep.join(
        str(REPO / part) for part in ("shared", "local", "client", "."))}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "agentvm.turnhost", cwd=REPO, env=full,
                                                stdout=log, stderr=subprocess.STDOUT)
    hosts = DynamoDBTurnHosts(stack.store)
    try:
        deadline = time.monotonic() + 30
        while not any(h.takes_turns(now_ms()) for h in await hosts.list_hosts()):
            assert proc.returncode is None and time.monotonic() < deadline, _text(log)
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.1)  # ws_default caches the directory for 2 s
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
        log.close()
    assert code in (0, -signal.SIGKILL), _text(_log_file(Path(log.name), "rb"))


def _log_file(path: Path, mode: str = "wb+") -> IO[bytes]:
    return open(path, mode)  # closed by the caller


def _text(log: IO[bytes]) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-4000:]


def session_of(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """A turn's session events without ids and times: (type, data without ids) in order."""
    out = []
    for e in events:
        data = {k: v for k, v in (e.get("data") or {}).items()
                if not k.endswith("Id") and k not in ("timestamp", "createdAt", "id", "durationMs", "usage")}
        out.append((e["type"], data if e["type"] in ("text_delta", "turn_response") else None))
    return out


async def test_no_host_then_a_host_takes_new_turns_with_the_same_events(stack: Stack) -> None:
    async with StockClient(stack.edge.url) as c:
        first = await c.new_image("c-a", model=MODEL)
        on_lambda = await c.turn(first["imageId"], "slow one", timeout=30)
        await stack.edge.settle(include_invokes=True)
        assert stack.chat_turns() == [first["sessionId"]]  # (a) no host: chat_turn

        async with turn_host(stack) as proc:
            second = await c.new_image("c-b", model=MODEL)
            on_host = await c.turn(second["imageId"], "slow one", timeout=30)
            again = await c.turn(first["imageId"], "slow one", timeout=30)  # a session chat_turn ran before
            await stack.edge.settle(include_invokes=True)
            assert stack.chat_turns() == [first["sessionId"]]  # (b) nothing more on chat_turn
            assert proc.returncode is None
    assert session_of(on_host) == session_of(on_lambda) == session_of(again)
    assert [e["type"] for e in on_host][-1] == "turn_response" and on_host[-1]["data"]["status"] == "completed"
    assert "".join(e["data"]["text"] for e in on_host if e["type"] == "text_delta") == "".join(
        f"w{i:02d} " for i in range(20)).rstrip()
    for events in (on_lambda, on_host, again):
        seqs = [e["seq"] for e in events]
        assert seqs == sorted(set(seqs))  # in order, none twice


async def test_a_host_at_capacity_refuses_and_the_other_turn_runs_on_chat_turn_at_once(stack: Stack) -> None:
    # a 2 s heartbeat (live 6 s): with the file's 0.5 s one, a heartbeat late by a loaded machine made the
    # idle host look dead when the first turn was dispatched, which then ran on chat_turn instead
    async with StockClient(stack.edge.url) as c, turn_host(stack, AVM_TURN_HOST_CAPACITY="1",
                                                           AVM_TURN_HOST_HEARTBEAT_S="2"):
        busy, other = await c.new_image("c-busy", model=MODEL), await c.new_image("c-other", model=MODEL)
        start = len(c.events)
        await c.request("message_send_request", {"imageId": busy["imageId"], "content": "slow and long"})
        await c.wait_for(lambda e: e.get("type") == "text_delta"
                         and e["context"]["imageId"] == busy["imageId"], 10, start)
        started = time.monotonic()
        await c.turn(other["imageId"], "hello", timeout=10)
        waited = time.monotonic() - started
        busy_done = [e for e in c.events[start:] if e.get("type") == "turn_response"
                     and e["context"]["imageId"] == busy["imageId"]]
        assert busy_done == []  # the other turn finished while the host's one still streamed
        await c.wait_for(lambda e: e.get("type") == "turn_response"
                         and e["context"]["imageId"] == busy["imageId"], 30, start)
        await stack.edge.settle(include_invokes=True)
    assert stack.chat_turns() == [other["sessionId"]]
    assert waited < 2.5, waited


async def test_a_host_killed_mid_turn_fails_the_turn_releases_the_hold_and_the_session_goes_on(
        stack: Stack) -> None:
    ledger, period = DynamoDBUsageLedger(stack.store), period_of(now_ms())
    await ledger.put_budget(Budget(TENANT, monthly=Decimal(5), updated_at=now_ms()))
    rt = await CloudRuntime(Settings()).ready()  # the sweep's runtime: the tiered dispatcher
    async with StockClient(stack.edge.url) as c:
        image = await c.new_image("c-kill", model=MODEL)
        sid = image["sessionId"]
        async with turn_host(stack) as proc:
            res = await c.request("message_send_request", {"imageId": image["imageId"], "content": "slow, killed"})
            assert "error" not in res["data"], res["data"]
            deadline = time.monotonic() + 20
            while sum(e.get("type") == "text_delta" for e in c.events) < 3:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            assert (await ledger.spend(TENANT, None, period)).reserved > 0  # the streaming call's hold
            proc.kill()
            await proc.wait()
            killed_at = time.monotonic()
        seen = len(c.events)
        assert stack.chat_turns() == []
        # past the lease (3 s) and the dead host's record (until: three heartbeats): a sweep
        await asyncio.sleep(max(0.0, LEASE_S + 0.5 - (time.monotonic() - killed_at)))
        report = await sweep(rt.store, rt.leases, rt.dispatcher, now_ms=now_ms() + SWEEP_GRACE_MS)
        assert (report.sessions, report.dispatched, report.failed) == (1, 1, 0)
        failed = await c.wait_for(lambda e: e.get("type") == "turn_response", 20, seen)
        assert failed["data"]["status"] == "failed"
        await stack.edge.settle(include_invokes=True)
        assert stack.chat_turns() == [sid]
        errors = [e for e in c.events[seen:] if e.get("type") == "error_occurred"]
        assert [e["data"] for e in errors] == [{"code": "worker_lost", "message": WORKER_LOST_TEXT,
                                                "recoverable": True}]
        assert (await ledger.spend(TENANT, None, period)).reserved == 0

        after = await c.turn(image["imageId"], "hello again", timeout=20)  # the next message: on chat_turn
        await stack.edge.settle(include_invokes=True)
        assert stack.chat_turns() == [sid, sid]
        assert after[-1]["type"] == "turn_response" and after[-1]["data"]["status"] == "completed"
        assert (await ledger.spend(TENANT, None, period)).reserved == 0

    seqs = [e["seq"] for e in c.events if "seq" in e and e["context"].get("sessionId", sid) == sid]
    assert seqs == sorted(set(seqs))  # none twice, in order
    stored = await stack.store.read_events(TENANT, sid, 0)
    # every stored event reached the client, but the sender's own `user_message` (it has its answer)
    missed = [(ev.type, ev.seq) for ev in stored if ev.seq not in set(seqs)]
    assert [t for t, _ in missed] == ["user_message", "user_message"]  # its two messages
    turns = await stack.store.list_turns(TENANT, sid)
    assert [(t.status, t.error_code, t.error_message) for t in turns] == [
        ("failed", "worker_lost", WORKER_LOST_TEXT), ("completed", None, None)]
    await rt.store.close()


def test_a_bad_setting_stops_the_host_with_one_line_and_exit_code_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AVM_")}
    env.update(PYTHONPATH=os.pathsep.join(str(REPO / p) for p in ("shared", "local", "client")),
               AVM_TURN_HOST_MAX_CPU="1.5")
    done = subprocess.run([sys.executable, "-m", "agentvm.turnhost"], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "invalid setting turn_host_max_cpu (AVM_TURN_HOST_MAX_CPU): Input should be less than or equal to 1"]
    env.pop("AVM_TURN_HOST_MAX_CPU")
    done = subprocess.run([sys.executable, "-m", "agentvm.turnhost"], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert (done.returncode, len(done.stderr.strip().splitlines())) == (2, 1)
    assert done.stderr.startswith("AVM_TABLE_NAME, AVM_TURN_QUEUE_URL, AVM_CHAT_TURN_FUNCTION, AVM_WS_ENDPOINT "
                                  "must be set")
