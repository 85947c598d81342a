"""Crash recovery: a turn's process dies in the middle of the turn (`kill -9` of `avm serve`; a
`chat_turn` invocation that stops without a word in the cloud), and the system comes back consistent.

Local: the store passes SQLite's integrity check right after the kill, and after the restart the
interrupted turns are `failed` (`server_restart`) with an error message in their history, the user
messages are kept, nothing is billed twice, no budget stays held, no tool process outlives the
server, and the next message works (`hosting/recovery.py`).

Cloud (moto): the next `chat_turn` of the session, once the dead invocation's lease has expired,
fails the turn it left unfinished (`worker_lost`), gives back the budget hold of the call it died in,
publishes the error to the subscribers, and runs the turns queued behind it
(`hosting/session_worker.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO

import httpx
import pytest

from agentvm.adapters.aws.dynamodb_items import _key, _session_pk
from agentvm.adapters.aws.dynamodb_leases import DynamoDBLeases
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.local.cgroups import PidsCgroups
from agentvm.cloud import runtime as cloud_runtime
from agentvm.domain.models import (
    Checkpoint,
    ConnectionRecord,
    Image,
    LeaseHandoff,
    Principal,
    Session,
    Subscription,
    TurnStatus,
)
from agentvm.domain.usage import Budget, Spend, period_of
from agentvm.hosting.leased_host import LEASE_TTL_MS, LeasedSessions
from agentvm.hosting.recovery import RESTART_CODE, RESTART_TEXT
from agentvm.hosting.session_worker import WORKER_LOST_TEXT
from agentvm.ids import now_ms
from agentvm.protocol.commands import ImageConfig
from agentvm.services.use_cases import UseCases
from tests.aws_fixtures import REGION, aws_env, moto_endpoint  # noqa: F401  (fixtures)
from tests.cloud.conftest import cloud_runtime_on
from tests.support.moto_posts import posted_frames
from tests.support.servers import REPO, ServeProcess, serve, start_serve, stop_serve
from tests.support.stock_client import StockClient

MODEL = "claude-haiku-4-5"  # a priced model: each LLM call holds its worst case on the budget
SCRIPT = f"""
rules:
  - match: "^stream"
    responses:
      - model: {MODEL}
        text: ["w00 ", "w01 ", "w02 ", "w03 ", "w04 ", "w05 ", "w06 ", "w07 ", "w08 ", "w09 ",
               "w10 ", "w11 ", "w12 ", "w13 ", "w14 ", "w15 ", "w16 ", "w17 ", "w18 ", "w19"]
        delay_ms: 150
        usage: {{input_tokens: 40, output_tokens: 20}}
  - match: "^tool"
    responses:
      - model: {MODEL}
        text: ["Running it."]
        tool_calls: [{{id: toolu_crash, name: bash, input: {{command: "sleep 29.37; echo late"}}}}]
        usage: {{input_tokens: 30, output_tokens: 5}}
      - {{model: {MODEL}, text: ["Finished."], usage: {{input_tokens: 50, output_tokens: 2}}}}
"""
TOOL_MARK = "sleep 29.37"


def read_only(db: Path) -> sqlite3.Connection:
    """The database as the crash left it, opened without writing to it (the WAL is read, not merged)."""
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True)


def rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = read_only(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def integrity(db: Path) -> str:
    return str(rows(db, "PRAGMA integrity_check")[0][0])


def scripted(data: Path, **env: str) -> dict[str, str]:
    """`avm serve`'s environment: the scripted driver on SCRIPT."""
    script = data.parent / "script.yaml"
    script.write_text(SCRIPT)
    return {"AVM_SCRIPT_PATH": str(script), **env}


def processes_with(mark: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if mark in cmd:
            found.append(int(entry.name))
    return found


async def wait_until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.05)


async def history(c: StockClient, image_id: str) -> list[dict[str, Any]]:
    return list((await c.request("image_messages_request", {"imageId": image_id}))["data"]["messages"])


async def session_turns(srv: ServeProcess, session_id: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient() as http:
        r = await http.get(f"{srv.http}/v1/sessions/{session_id}/turns", timeout=5)
    r.raise_for_status()
    return list(r.json()["items"])


async def reserved(srv: ServeProcess) -> Decimal:
    async with httpx.AsyncClient() as http:
        r = await http.get(f"{srv.http}/v1/budgets", timeout=5)
    return Decimal(r.json()["reserved"])


# ---- local: kill -9 of avm serve ---------------------------------------------------------------------


@pytest.mark.e2e
async def test_kill_dash_nine_mid_stream_with_a_turn_queued_then_restart_recovers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    db = data / "agentvm.db"
    env = scripted(data)
    srv = start_serve(data, env=env)
    try:
        async with httpx.AsyncClient() as http:
            r = await http.put(f"{srv.http}/v1/budgets", json={"monthlyBudget": "5"}, timeout=5)
            assert r.status_code == 200, r.text
        async with StockClient(srv.url) as c:
            image = await c.new_image("c1", model=MODEL)
            await c.request("message_send_request", {"imageId": image["imageId"], "content": "stream please"})
            await c.wait_for(lambda e: e["type"] == "text_delta" and "w02" in e["data"]["text"])
            queued = await c.request("message_send_request", {"imageId": image["imageId"], "content": "queued behind"})
            assert "error" not in queued["data"]
            await c.wait_type("conversation_queued")
            assert await reserved(srv) > 0  # the streaming call's worst case is held
            assert stop_serve(srv, kill=True) == -signal.SIGKILL
    finally:
        stop_serve(srv)

    # the store as the crash left it: consistent; nothing of the running turn was written yet
    # (a pure-chat turn is written when it ends), so both turns still read "queued"
    assert integrity(db) == "ok"
    assert [r[0] for r in rows(db, "SELECT status FROM turns ORDER BY created_at")] == ["queued", "queued"]
    assert rows(db, "SELECT count(*) FROM usage_records") == [(0,)]
    [(held,)] = rows(db, "SELECT reserved FROM spend WHERE key_id = ''")
    assert Decimal(held) > 0  # the hold of the call that never ended is still on the budget

    with serve(data, env=env) as srv2:
        async with StockClient(srv2.url) as c:
            got = await history(c, image["imageId"])
            assert [(m["subtype"], m["content"]) for m in got] == [
                ("user", "stream please"), ("error", RESTART_TEXT), ("user", "queued behind"), ("error", RESTART_TEXT)]
            assert {m["errorCode"] for m in got if m["subtype"] == "error"} == {RESTART_CODE}
            turns = await session_turns(srv2, image["sessionId"])
            assert [(t["task"], t["status"], t["error"]) for t in turns] == [
                (task, "failed", {"code": RESTART_CODE, "message": RESTART_TEXT})
                for task in ("stream please", "queued behind")]
            assert all(t["endedAt"] for t in turns)
            assert await reserved(srv2) == 0  # start-up released the dead process's holds

            events = await c.turn(image["imageId"], "hello again")
            assert events[-1]["data"]["status"] == "completed"
            text = "".join(e["data"]["text"] for e in events if e["type"] == "text_delta")
            assert text == "You said: hello again"
        log_text = srv2.log()

    assert '"recovered unfinished turns"' in log_text and '"count":2' in log_text
    assert integrity(db) == "ok"
    statuses = rows(db, "SELECT task, status, error_code FROM turns ORDER BY created_at")
    assert statuses == [("stream please", "failed", RESTART_CODE), ("queued behind", "failed", RESTART_CODE),
                        ("hello again", "completed", None)]
    # usage: one record, for the call that ended; none for the call the crash cut off
    records = rows(db, "SELECT t.task, u.record_id, u.status FROM usage_records u JOIN turns t USING (turn_id)")
    assert [(task, rid.split("#", 1)[1], status) for task, rid, status in records] == [
        ("hello again", "llm#1", "completed")]


@pytest.mark.e2e
async def test_kill_dash_nine_while_a_tool_runs_then_restart_recovers(tmp_path: Path) -> None:
    """Without bubblewrap (which kills the tool with the server) the tool's processes outlive the
    server: the restart kills what is left in the dead server's per-call cgroups (when the server may
    create them: root, or a delegated cgroup)."""
    cgroups = PidsCgroups.find()
    data = tmp_path / "data"
    db = data / "agentvm.db"
    env = scripted(data, AVM_SANDBOX_ISOLATION="none")
    if os.geteuid() != 0:  # not root, `none` is unconfined: it runs only with the explicit unsafe opt-in
        env["AVM_UNSAFE_UNSANDBOXED_TOOLS"] = "1"
    srv = start_serve(data, env=env)
    try:
        async with StockClient(srv.url) as c:
            image = await c.new_image("c-tool", model=MODEL, tools=["bash"])
            await c.request("message_send_request", {"imageId": image["imageId"], "content": "tool now"})
            await c.wait_type("tool_executing", timeout=15)
            await wait_until(lambda: processes_with(TOOL_MARK))
            assert stop_serve(srv, kill=True) == -signal.SIGKILL

        assert integrity(db) == "ok"
        # the turn went to the container tier: stored running there, with the call that asked for the tool
        [(status, tier, input_tokens)] = rows(db, "SELECT status, tier, input_tokens FROM turns")
        assert (status, tier, input_tokens) == ("running", "container", 30)
        [(rid, tokens)] = rows(db, "SELECT record_id, input_tokens FROM usage_records")
        assert rid.endswith("#llm#1") and tokens == 30  # that call ended: recorded once

        with serve(data, env=env) as srv2:
            if cgroups is not None:
                await wait_until(lambda: not processes_with(TOOL_MARK), timeout=5)
            async with StockClient(srv2.url) as c:
                got = await history(c, image["imageId"])
                assert [m["subtype"] for m in got] == ["user", "tool-call", "assistant", "error"]
                assert got[-1]["content"] == RESTART_TEXT and got[-1]["errorCode"] == RESTART_CODE
                [turn] = await session_turns(srv2, image["sessionId"])
                assert (turn["status"], turn["tier"], turn["error"]["code"]) == ("failed", "container", RESTART_CODE)
                assert turn["usage"]["inputTokens"] == 30  # what was billed stays on the turn
                events = await c.turn(image["imageId"], "and now?")
                assert events[-1]["data"]["status"] == "completed"
    finally:
        stop_serve(srv)
        for pid in processes_with(TOOL_MARK):  # whatever a failure left behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    assert integrity(db) == "ok"
    assert [r[0] for r in rows(db, "SELECT status FROM turns ORDER BY created_at")] == ["failed", "completed"]
    ids = [r[0] for r in rows(db, "SELECT record_id FROM usage_records")]
    assert len(ids) == len(set(ids)) == 2  # the crashed turn's one call, the next turn's one call


# ---- cloud: a chat_turn invocation that dies mid-turn ---------------------------------------------

TENANT = "tenant-crash"
CLOUD_SCRIPT = """
rules:
  - match: "^stream"
    responses:
      - text: ["w00 ", "w01 ", "w02 ", "w03 ", "w04 ", "w05 ", "w06 ", "w07 ", "w08 ", "w09 ",
               "w10 ", "w11 ", "w12 ", "w13 ", "w14 ", "w15 ", "w16 ", "w17 ", "w18 ", "w19"]
        delay_ms: 150
"""
# `chat_turn` as Lambda runs it, in a process of its own (so that it can be killed): the handler module
# loaded from its file, invoked once with the session's payload (with the lease handed on, as JSON)
CHAT_TURN = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("chat_turn_handler", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.handler({"tenantId": sys.argv[2], "sessionId": sys.argv[3], "handoff": json.loads(sys.argv[4])}, None)
"""


class _Dispatches:
    """The Dispatcher port, recording: this test starts each `chat_turn` itself."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.handoffs: list[LeaseHandoff | None] = []

    async def start_turns(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None:
        self.started.append(session_id)
        self.handoffs.append(handoff)


def _text(log: BinaryIO) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")


def test_a_chat_turn_killed_mid_turn_is_failed_by_the_next_chat_turn(
        aws_env: None, moto_endpoint: str,  # noqa: F811  (the fixtures imported above)
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):  # nothing from the developer's shell reaches the runtimes
        if name.startswith(("AVM_", "LLM_", "ANTHROPIC_")):
            monkeypatch.delenv(name)
    script = tmp_path / "script.yaml"
    script.write_text(CLOUD_SCRIPT)
    with cloud_runtime_on(monkeypatch, moto_endpoint, AVM_SCRIPT_PATH=str(script), AVM_STREAM_FLUSH_MS="0",
                          AVM_RELIABLE_WRAPPER="false") as rt, open(tmp_path / "chat_turn.log", "wb+") as log:
        cloud_runtime.run(_chat_turn_killed_mid_turn(rt, log))


async def _chat_turn_killed_mid_turn(rt: cloud_runtime.CloudRuntime, log: BinaryIO) -> None:
    p, dispatches = Principal(TENANT), _Dispatches()

    def ws_default() -> tuple[Any, UseCases]:
        """One `ws_default` invocation's services (the sessions hosted by lease)."""
        inv = rt.invocation(TENANT, role="ws_default")
        sessions = LeasedSessions(inv.deps, fanout=inv.fanout, leases=rt.leases, dispatcher=dispatches,
                                  owner=inv.owner)
        return inv, UseCases(inv.deps, sessions)

    async def lease_record(sid: str) -> dict[str, Any]:
        got = await rt.store.client.get_item(TableName=rt.store.table_name, ConsistentRead=True,
                                             Key=_key(_session_pk(TENANT, sid), "SESS"))
        return dict(got["Item"])

    inv, s = ws_default()
    assert rt.meter is not None
    ledger, period = rt.meter.ledger, period_of(now_ms())
    await ledger.put_budget(Budget(TENANT, monthly=Decimal(5), updated_at=now_ms()))
    image = await s.images.create(p, "c-crash", ImageConfig(name="Crash", model=MODEL))
    sid = image.session_id
    conn = "crashWatcher01A="  # a subscribed client: the fan-out posts every session event to it
    await rt.registry.put_connection(ConnectionRecord(conn, TENANT, None, now_ms()))
    await rt.registry.put_subscription(TENANT, sid, Subscription(conn))
    _, _, turn1 = await s.turns.send(p, None, image.image_id, None, "stream please")
    await inv.fanout.close()
    assert dispatches.started == [sid]
    # ws_default passed its lease on to the runner it started, with the first seq it did not use
    handoff = dispatches.handoffs[0]
    assert handoff is not None and handoff.owner.endswith(f"/{turn1.turn_id}")
    assert (await lease_record(sid))["lease_owner"]["S"] == handoff.owner

    # the chat_turn invocation that message starts, in its own process, killed once it streams
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHAT_TURN, str(REPO / "functions/chat_turn/handler.py"), TENANT, sid,
        json.dumps(handoff.to_wire()), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while sum(f["type"] == "text_delta" for f in posted_frames(conn)) < 3:
            assert child.returncode is None and time.monotonic() < deadline, _text(log)
            await asyncio.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()  # SIGKILL
        await child.wait()
    assert child.returncode == -signal.SIGKILL
    seen = len(posted_frames(conn))

    # what it left: its lease (valid for up to a minute) with its runner mark, the turn still queued
    record = await lease_record(sid)
    assert record["runner"] == record["lease_owner"] and record["runner"]["S"].startswith("chat_turn:")
    assert record["queued"]["SS"] == [turn1.turn_id]
    assert [t.status for t in await rt.store.list_turns(TENANT, sid)] == [TurnStatus.QUEUED]
    held = (await ledger.spend(TENANT, None, period)).reserved
    assert held > 0  # the worst case of the call it died in
    # while that lease runs, another chat_turn of the session finds it taken and leaves at once
    inv = rt.invocation(TENANT, role="chat_turn", driver=await rt.driver())
    early = rt.worker(inv)
    assert await early.run(TENANT, sid) == [] and not early.acquired
    await inv.fanout.close()

    # past its deadline: the next message, and the chat_turn it starts
    rt.store._clock = lambda: time.time() + LEASE_TTL_MS / 1000 + 1
    inv, s = ws_default()
    _, _, turn2 = await s.turns.send(p, None, image.image_id, None, "hello again")
    await inv.fanout.close()
    inv = rt.invocation(TENANT, role="chat_turn", driver=await rt.driver())
    ran = await rt.worker(inv).run(TENANT, sid, handoff=dispatches.handoffs[-1])
    await inv.fanout.close()

    assert [(t.turn_id, t.status, t.error_code) for t in ran] == [
        (turn1.turn_id, TurnStatus.FAILED, "worker_lost"), (turn2.turn_id, TurnStatus.COMPLETED, None)]
    stored = await rt.store.list_turns(TENANT, sid)
    assert [(t.status, t.error_code, t.error_message) for t in stored] == [
        (TurnStatus.FAILED, "worker_lost", WORKER_LOST_TEXT), (TurnStatus.COMPLETED, None, None)]
    assert stored[0].ended_at
    history = [m.body for m in await s.image_sessions.messages(p, sid)]
    assert [m["subtype"] for m in history] == ["user", "error", "user", "assistant"]
    assert (history[0]["content"], history[2]["content"]) == ("stream please", "hello again")
    assert (history[1]["content"], history[1]["errorCode"]) == (WORKER_LOST_TEXT, "worker_lost")
    record = await lease_record(sid)
    assert not {"lease_owner", "runner", "queued"} & record.keys()

    # the subscriber: the dead invocation's partial stream, then the next message, the lost turn's
    # error and turn_response, then the new turn; every seq above the one before (a gap after the
    # dead holder: it may have used any seq of its block)
    frames = [f for f in posted_frames(conn) if "seq" in f]
    seqs = [f["seq"] for f in frames]
    assert seqs == sorted(set(seqs))
    after = frames[seen:]
    assert [f["type"] for f in after[:6]] == ["message_persisted", "user_message", "error_received",
                                              "error_message", "error_occurred", "turn_response"]
    assert after[4]["data"] == {"code": "worker_lost", "message": WORKER_LOST_TEXT, "recoverable": True}
    assert (after[5]["data"]["turnId"], after[5]["data"]["status"]) == (turn1.turn_id, "failed")
    assert after[-1]["type"] == "turn_response" and after[-1]["data"]["status"] == "completed"
    assert "".join(f["data"]["text"] for f in after if f["type"] == "text_delta") == "You said: hello again"

    # usage: the killed call left no record and its hold is given back; the next turn's call has a
    # record, and the month's counter is exactly its cost
    records = await ledger.list_usage(TENANT, since_ms=now_ms() - 86_400_000, until_ms=now_ms() + 1)
    assert [(r.turn_id, r.record_id.split("#", 1)[1]) for r in records] == [(turn2.turn_id, "llm#1")]
    assert await ledger.spend(TENANT, None, period) == Spend(records[0].billed_cost, Decimal(0))
    assert records[0].billed_cost > 0


async def test_the_runner_mark_names_only_a_runner_that_never_released(
        aws_env: None, moto_endpoint: str) -> None:  # noqa: F811  (the fixtures imported above)
    """Written by a runner's acquire, removed by its release (or with the queue when the agent is
    destroyed): what a later runner finds was left by one that died. A `ws_default` holder never
    writes or clears it."""
    now = [1_800_000_000.0]
    store = DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", endpoint_url=moto_endpoint, region_name=REGION,
                          clock=lambda: now[0])
    await store.open()
    try:
        await store.create_table()
        await store.create_image(Image("t1", "i1", "c1", "s1", "n", 1, 1), Session("t1", "s1", "i1", "c1", 1, 1))
        leases = DynamoDBLeases(store)

        async def take(owner: str, *, runner: bool) -> str:
            state = await leases.acquire("t1", "s1", owner, 60_000, 16, runner=runner)
            assert state is not None
            return state.dead_runner

        assert await take("chat_turn:a", runner=True) == ""
        await leases.release("t1", "s1", "chat_turn:a", runner=True)  # a clean end
        assert await take("chat_turn:b", runner=True) == ""
        assert await take("chat_turn:b", runner=True) == ""  # re-entrant: its own mark
        now[0] += 61  # b dies holding the lease
        assert await take("ws_default:c", runner=False) == "chat_turn:b"  # seen, and left in place
        await leases.release("t1", "s1", "ws_default:c")
        assert await take("chat_turn:d", runner=True) == "chat_turn:b"  # d recovers b's turn
        await leases.release("t1", "s1", "chat_turn:d", runner=True)
        assert await take("chat_turn:e", runner=True) == ""
    finally:
        await store.close()


def test_a_container_task_lost_while_resuming_a_turn_leaves_it_to_the_next_runner(
        aws_env: None, moto_endpoint: str,  # noqa: F811  (the fixtures imported above)
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn escalated (stored `running` in the container tier) and the task resuming it died with
    the lease: the next runner fails it rather than handing it to a task again."""
    for name in list(os.environ):
        if name.startswith(("AVM_", "LLM_", "ANTHROPIC_")):
            monkeypatch.delenv(name)
    with cloud_runtime_on(monkeypatch, moto_endpoint, AVM_RELIABLE_WRAPPER="false") as rt:
        cloud_runtime.run(_task_lost_while_resuming(rt))


async def _task_lost_while_resuming(rt: cloud_runtime.CloudRuntime) -> None:
    p = Principal(TENANT)
    inv = rt.invocation(TENANT, role="ws_default")
    dispatches = _Dispatches()
    s = UseCases(inv.deps, LeasedSessions(inv.deps, fanout=inv.fanout, leases=rt.leases, dispatcher=dispatches,
                                          owner=inv.owner))
    image = await s.images.create(p, "c-task", ImageConfig(name="Task"))
    sid = image.session_id
    _, _, turn = await s.turns.send(p, None, image.image_id, None, "use a tool")
    await inv.fanout.close()
    # as the function tier leaves an escalated turn (it took the lease over, handed the turn on and
    # released), then the task takes the session and dies
    (handoff,) = dispatches.handoffs
    state = await rt.leases.acquire(TENANT, sid, "chat_turn:x", LEASE_TTL_MS, 1_000, runner=True, handoff=handoff)
    assert state is not None
    turn.status, turn.tier, turn.started_at = TurnStatus.RUNNING, "container", now_ms()
    await rt.store.commit(Checkpoint(TENANT, sid, turns=[turn]))
    assert await rt.leases.release(TENANT, sid, "chat_turn:x", next_seq=state.first_seq, runner=True)
    assert await rt.leases.acquire(TENANT, sid, "task-0f3e", LEASE_TTL_MS, 10_000, runner=True) is not None
    rt.store._clock = lambda: time.time() + LEASE_TTL_MS / 1000 + 1

    inv = rt.invocation(TENANT, role="chat_turn", driver=await rt.driver())
    ran = await rt.worker(inv).run(TENANT, sid)
    await inv.fanout.close()
    assert [(t.turn_id, t.status, t.tier, t.error_code) for t in ran] == [
        (turn.turn_id, TurnStatus.FAILED, "container", "worker_lost")]
    history = [m.body for m in await s.image_sessions.messages(p, sid)]
    assert [(m["subtype"], m.get("errorCode")) for m in history] == [("user", None), ("error", "worker_lost")]
    state = await rt.leases.poll(TENANT, sid, consistent=True)
    assert not state.held and not state.queued
