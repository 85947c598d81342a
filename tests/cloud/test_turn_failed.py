"""chat_turn's OnFailure destination (functions/turn_failed, hosting/turn_failure.py) behind the emulated
edge: `chat_turn` runs in a child process (as Lambda runs it) and is killed with SIGKILL mid-turn; the edge
sends Lambda's invocation record to `turn_failed`, which fails the turn at once. The client gets
`worker_lost` and the failed `turn_response` within 10 s (not after the 60 s lease and the next sweep),
the budget hold is given back, nothing is sent twice, the sweep finds nothing left, and the session's next
message runs normally. A failure record naming another invocation never breaks a live runner's lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import pytest

from agentvm.adapters.aws.dynamodb_leases import DynamoDBLeases
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.dynamodb_usage import DynamoDBUsageLedger
from agentvm.cloud.runtime import CloudRuntime
from agentvm.config import Settings
from agentvm.domain.models import Checkpoint, LeaseHandoff, LeaseState, Turn, TurnStatus
from agentvm.domain.usage import Budget, period_of
from agentvm.errors import InvalidRequest
from agentvm.hosting.session_worker import WORKER_LOST_TEXT, DeadRunner
from agentvm.hosting.turn_failure import FailedInvocation, handle_failed_invocation, parse_failure
from agentvm.hosting.turn_sweep import SWEEP_GRACE_MS, sweep
from agentvm.ids import now_ms
from tests.aws_fixtures import REGION, put_new_key, without_agentvm_env
from tests.support.cloud_edge import CloudEdge
from tests.support.lambda_process import ProcessEnvironments
from tests.support.scripts import slow_reply_script
from tests.support.stock_client import StockClient

REPO = Path(__file__).resolve().parents[2]
TENANT = "t-failed"
MODEL = "claude-haiku-4-5"  # priced: each LLM call holds its worst case on the budget
SCRIPT = slow_reply_script("^slow", delay_ms=200)
TOLD_WITHIN_S = 10.0


@dataclass
class Stack:
    edge: CloudEdge
    store: DynamoDBStore
    processes: ProcessEnvironments


@contextlib.asynccontextmanager
async def _stack(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *,
                 processes: bool) -> AsyncIterator[Stack]:
    without_agentvm_env(monkeypatch)
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    table = f"agentvm-{uuid.uuid4().hex[:16]}"
    store = DynamoDBStore(table, endpoint_url=moto_endpoint, region_name=REGION)
    await store.open()
    await store.create_table()
    _key, token = await put_new_key(store, TENANT)
    edge = CloudEdge(moto_endpoint=moto_endpoint, token=token, table_name=table)
    env = {"AVM_CHAT_TURN_FUNCTION": "agentvm-chat-turn:live", "AVM_RELIABLE_WRAPPER": "false",
           "AVM_SCRIPT_PATH": str(script), **edge.handler_env()}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # chat_turn in child processes (killable mid-turn), or in threads like the other functions
    children = ProcessEnvironments({**os.environ, "PYTHONPATH": os.pathsep.join(
        str(REPO / part) for part in ("shared", "local", "client"))})
    if processes:
        edge.processes["chat_turn"] = children
    try:
        async with edge.running():
            yield Stack(edge, store, children)
    finally:
        await store.close()


@pytest.fixture
async def stack(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch,
                tmp_path: Path) -> AsyncIterator[Stack]:
    async with _stack(moto_endpoint, monkeypatch, tmp_path, processes=True) as s:
        yield s


@pytest.fixture
async def thread_stack(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch,
                       tmp_path: Path) -> AsyncIterator[Stack]:
    async with _stack(moto_endpoint, monkeypatch, tmp_path, processes=False) as s:
        yield s


async def _streaming(c: StockClient, image: dict[str, Any], content: str, deltas: int = 3) -> int:
    """Send a message and wait until its turn has streamed `deltas` text deltas; the index to read from."""
    seen = len(c.events)
    res = await c.request("message_send_request", {"imageId": image["imageId"], "content": content})
    assert "error" not in res["data"], res["data"]
    deadline = time.monotonic() + 30
    while sum(e.get("type") == "text_delta" for e in c.events[seen:]) < deltas:
        assert time.monotonic() < deadline, c.events[seen:]
        await asyncio.sleep(0.02)
    return seen


async def test_chat_turn_killed_mid_turn_tells_the_client_within_10_s_and_releases_the_hold(stack: Stack) -> None:
    ledger, period = DynamoDBUsageLedger(stack.store), period_of(now_ms())
    await ledger.put_budget(Budget(TENANT, monthly=Decimal(5), updated_at=now_ms()))
    async with StockClient(stack.edge.url) as c:
        image = await c.new_image("c-kill", model=MODEL)
        sid = image["sessionId"]
        await _streaming(c, image, "slow, killed")
        assert (await ledger.spend(TENANT, None, period)).reserved > 0  # the streaming call's hold
        seen = len(c.events)
        assert stack.processes.kill_running() == 1
        killed_at = time.monotonic()
        failed = await c.wait_for(lambda e: e.get("type") == "turn_response", TOLD_WITHIN_S, seen)
        told_s = time.monotonic() - killed_at
        assert told_s < TOLD_WITHIN_S, told_s
        assert failed["data"]["status"] == "failed"
        errors = [e for e in c.events[seen:] if e.get("type") == "error_occurred"]
        assert [e["data"] for e in errors] == [{"code": "worker_lost", "message": WORKER_LOST_TEXT,
                                                "recoverable": True}]
        await stack.edge.settle(include_invokes=True)
        assert (await ledger.spend(TENANT, None, period)).reserved == 0  # the hold is given back

        # Lambda's record, as the destination got it
        [record] = stack.edge.failure_records
        assert record["requestContext"]["condition"] == "RetriesExhausted"
        payload = dict(record["requestPayload"])
        handoff = LeaseHandoff.from_wire(payload.pop("handoff"))  # the lease ws_default handed on to it
        assert payload == {"tenantId": TENANT, "sessionId": sid}
        assert handoff is not None and handoff.owner.startswith("ws_default:"), handoff
        assert record["responseContext"]["functionError"] == "Unhandled"
        assert record["responsePayload"]["errorType"] == "Runtime.ExitError"
        assert stack.edge.calls("turn_failed") == [record]
        assert [e.function for e in stack.edge.errors] == ["chat_turn"]  # the killed invocation, once
        assert "environment process exited" in stack.edge.errors[0].error

        # nothing left for the sweep: the turn is failed once, no runner is started again
        rt = await CloudRuntime(Settings()).ready()
        try:
            report = await sweep(rt.store, rt.leases, rt.dispatcher, now_ms=now_ms() + SWEEP_GRACE_MS)
        finally:
            await rt.store.close()
        assert (report.unfinished, report.dispatched) == (0, 0)
        assert [e["sessionId"] for e in stack.edge.calls("chat_turn")] == [sid]

        after = await c.turn(image["imageId"], "hello again", timeout=30)  # the session goes on
        await stack.edge.settle(include_invokes=True)
        assert after[-1]["type"] == "turn_response" and after[-1]["data"]["status"] == "completed"
        assert len(stack.edge.calls("chat_turn")) == 2 and len(stack.edge.calls("turn_failed")) == 1

    seqs = [e["seq"] for e in c.events if "seq" in e and e["context"].get("sessionId", sid) == sid]
    assert seqs == sorted(set(seqs))  # none twice, in order
    assert sum(e.get("type") == "turn_response" for e in c.events) == 2
    turns = await stack.store.list_turns(TENANT, sid)
    assert [(t.status, t.error_code, t.error_message) for t in turns] == [
        (TurnStatus.FAILED, "worker_lost", WORKER_LOST_TEXT), (TurnStatus.COMPLETED, None, None)]
    history = await stack.store.list_messages(TENANT, sid)
    assert [m.body.get("subtype") for m in history][-3:] == ["error", "user", "assistant"]
    assert (await ledger.spend(TENANT, None, period)).reserved == 0


async def test_a_chat_turn_that_raises_mid_turn_keeps_its_mark_and_its_client_is_told(
        thread_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error escaping the runner (here the turn's final write fails) is a failed invocation too: the
    lease is released with the runner's mark kept, and turn_failed fails the unsettled turn at once."""
    stack = thread_stack
    commit = DynamoDBStore.commit
    failed: list[str] = []

    async def failing_commit(self: DynamoDBStore, checkpoint: Checkpoint) -> None:
        if not failed and any(t.status == TurnStatus.COMPLETED for t in checkpoint.turns):
            failed.append(checkpoint.turns[0].turn_id)
            raise RuntimeError("injected: the table refused the turn's last write")
        await commit(self, checkpoint)

    monkeypatch.setattr(DynamoDBStore, "commit", failing_commit)
    async with StockClient(stack.edge.url) as c:
        image = await c.new_image("c-raise", model=MODEL)
        sid = image["sessionId"]
        seen = await _streaming(c, image, "slow, then the write fails", deltas=1)
        await c.wait_for(lambda e: e.get("type") == "error_occurred", 20, seen)
        await stack.edge.settle(include_invokes=True)
    [record] = stack.edge.failure_records
    assert record["responsePayload"] == {"errorType": "RuntimeError",
                                         "errorMessage": "injected: the table refused the turn's last write"}
    assert [e.function for e in stack.edge.errors] == ["chat_turn"]
    errors = [e["data"] for e in c.events[seen:] if e.get("type") == "error_occurred"]
    assert errors == [{"code": "worker_lost", "message": WORKER_LOST_TEXT, "recoverable": True}]
    turns = await stack.store.list_turns(TENANT, sid)
    assert [(t.turn_id, t.status, t.error_code) for t in turns] == [(failed[0], TurnStatus.FAILED, "worker_lost")]
    state = await DynamoDBLeases(stack.store).poll(TENANT, sid, consistent=True)
    assert (state.held, state.dead_runner, state.queued) == (False, "", frozenset())


async def test_a_failure_record_of_another_invocation_never_breaks_a_live_runner(stack: Stack) -> None:
    rt = await CloudRuntime(Settings()).ready()
    try:
        async with StockClient(stack.edge.url) as c:
            image = await c.new_image("c-live", model=MODEL)
            seen = await _streaming(c, image, "slow and alive")
            failure = FailedInvocation(request_id=str(uuid.uuid4()), tenant_id=TENANT, session_id=image["sessionId"],
                                       condition="RetriesExhausted", error="Runtime.ExitError")
            report = await handle_failed_invocation(failure, rt.leases, rt.fail_dead_runner, rt.dispatcher)
            assert (report.outcome, report.turn_id) == ("left", None)
            done = await c.wait_for(lambda e: e.get("type") == "turn_response", 30, seen)
            assert done["data"]["status"] == "completed"
            assert not [e for e in c.events[seen:] if e.get("type") == "error_occurred"]
            await stack.edge.settle(include_invokes=True)
    finally:
        await rt.store.close()
    assert stack.edge.errors == [] and stack.edge.calls("turn_failed") == []
    assert len(stack.edge.calls("chat_turn")) == 1


@pytest.mark.parametrize(("record", "field"), [
    ([], "record"),
    ({"requestPayload": {"tenantId": "t", "sessionId": "s"}}, "requestContext.requestId"),
    ({"requestContext": {"requestId": "r"}, "requestPayload": "x"}, "requestPayload"),
    ({"requestContext": {"requestId": "r"}, "requestPayload": {"tenantId": "t"}}, "requestPayload.sessionId"),
    ({"requestContext": {"requestId": "r"}, "requestPayload": {"tenantId": "", "sessionId": "s"}},
     "requestPayload.tenantId"),
])
def test_a_malformed_record_names_the_field(record: Any, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_failure(record)
    assert caught.value.field == field


def test_the_record_lambda_sends_is_read() -> None:
    record = {"version": "1.0", "requestContext": {"requestId": "r-1", "condition": "EventAgeExceeded",
                                                   "approximateInvokeCount": 0},
              "requestPayload": {"tenantId": "t", "sessionId": "s"}}
    assert parse_failure(record) == FailedInvocation("r-1", "t", "s", "EventAgeExceeded", "")
    record["responsePayload"] = {"errorType": "Sandbox.Timedout", "errorMessage": "Task timed out after 900.00 seconds"}
    assert parse_failure(record).error == "Sandbox.Timedout"


class _Leases:
    def __init__(self, state: LeaseState) -> None:
        self.state = state

    async def poll(self, tenant_id: str, session_id: str, *, consistent: bool = False) -> LeaseState:
        assert consistent, "the decision to start a runner reads the record consistently"
        return self.state


class _Dispatcher:
    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []

    async def start_turns(self, tenant_id: str, session_id: str, *, handoff: object = None) -> None:
        self.started.append((tenant_id, session_id))


QUEUED = LeaseState(queued=frozenset({"turn-2"}))


@pytest.mark.parametrize(("condition", "dead", "state", "outcome", "dispatched"), [
    # it died holding the session: its turn failed, the turns behind it get a runner
    ("RetriesExhausted", DeadRunner(Turn("t", "turn-1", "s", "i", "c", "m", TurnStatus.FAILED, 1), more=True),
     LeaseState(), ("failed_turn", "turn-1"), True),
    ("RetriesExhausted", DeadRunner(None, more=False), LeaseState(), ("released", None), False),  # between turns
    # it never ran (throttled past its age): a queue nobody runs gets a runner now
    ("EventAgeExceeded", None, QUEUED, ("dispatched", None), True),
    ("EventAgeExceeded", None, LeaseState(queued=QUEUED.queued, held=True), ("left", None), False),  # a runner has it
    ("EventAgeExceeded", None, LeaseState(), ("left", None), False),  # nothing queued
    # it failed without the lease: left to the sweep (a failure that repeats must not loop at Lambda's pace)
    ("RetriesExhausted", None, QUEUED, ("left", None), False),
])
async def test_what_a_failure_record_leads_to(condition: str, dead: DeadRunner | None, state: LeaseState,
                                              outcome: tuple[str, Any], dispatched: bool) -> None:
    asked: list[tuple[str, str, str]] = []

    async def fail_dead_runner(tenant_id: str, session_id: str, owner: str) -> DeadRunner | None:
        asked.append((tenant_id, session_id, owner))
        return dead

    dispatcher = _Dispatcher()
    failure = FailedInvocation("req-9", "t", "s", condition, "Runtime.ExitError")
    report = await handle_failed_invocation(failure, cast(Any, _Leases(state)), fail_dead_runner,
                                            cast(Any, dispatcher))
    assert (report.outcome, report.turn_id) == outcome
    assert asked == [("t", "s", "chat_turn:req-9")]  # the lease owner chat_turn used: its request id
    assert dispatcher.started == ([("t", "s")] if dispatched else [])
