"""`avm doctor` against the cloud's shape: three addresses, as a stack's outputs give them. The AgentX
WebSocket is the emulated API Gateway edge in front of the real handler modules (`ws_connect`,
`ws_default`, `chat_turn` by asynchronous invoke), the stream URL is the cloud's streaming app
(`agentvm.cloud.stream_app`, what `chat_stream` runs) under uvicorn, and `--url` (health, usage)
is that app too (it serves `/health` and `/v1/usage` like `http_api`); all on DynamoDB (moto). The
doctor runs as a process with an API key of the table."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from agentvm import __version__
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.cloud import runtime as cloud_runtime
from tests.aws_fixtures import moto_table, put_new_key, without_agentvm_env
from tests.support.cloud_edge import CloudEdge, cloud_edge
from tests.support.servers import REPO, free_port
from tests.support.stream_server import serving_stream_app

ID = r"[a-z0-9_]+"


@dataclass
class Stack:
    edge: CloudEdge
    store: DynamoDBStore
    stream: str
    token: str


@pytest.fixture
async def stack(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stack]:
    without_agentvm_env(monkeypatch)
    async with moto_table(moto_endpoint) as store:
        _, token = await put_new_key(store, "smoke")
        async with cloud_edge(moto_endpoint=moto_endpoint, token=None, table_name=store.table_name) as edge:
            for name, value in {**edge.handler_env(), "AVM_CHAT_TURN_FUNCTION": "agentvm-chat-turn:live",
                                "AVM_RELIABLE_WRAPPER": "false"}.items():
                monkeypatch.setenv(name, value)
            cloud_runtime.reset()
            try:
                async with serving_stream_app() as url:
                    yield Stack(edge, store, url, token)
            finally:
                cloud_runtime.reset()


async def doctor(*argv: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AVM_", "LLM_", "ANTHROPIC_"))}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "avm.cli", "doctor", *argv, cwd=REPO, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return int(proc.returncode or 0), out.decode(), err.decode()


async def test_every_step_passes_on_the_three_addresses_of_a_stack(stack: Stack) -> None:
    ws = stack.edge.url  # ws://127.0.0.1:<port>/ws: the key goes in the Authorization header
    code, out, err = await doctor("--url", f"{stack.stream}/", "--ws-url", ws, "--stream-url", f"{stack.stream}/",
                                  "--token", stack.token)
    assert (code, err) == (0, ""), out + err
    turn = rf"turn ({ID}) completed: 17 characters from claude-haiku-4-5, \d+ ms, (\d+\.\d{{8}}) USD billed"
    lines = out.splitlines()
    patterns = [
        rf"PASS  health          {re.escape(stack.stream)}/health: ok, version {re.escape(__version__)}",
        r"PASS  auth            /v1/usage answered with this key",
        rf"PASS  image           image ({ID}) in container avm-doctor, model claude-haiku-4-5",
        rf"PASS  websocket turn  {turn}",
        rf"PASS  sse turn        {turn}",
        r"PASS  usage           2 records of 2 turns: \d+ input and \d+ output tokens, (\d+\.\d{8}) USD billed "
        r"\(provider scripted\)",
        rf"PASS  cleanup         deleted image ({ID}) \(the usage records stay: they are the bill\)",
        r"avm doctor: all 7 steps passed; the test turns cost (\d+\.\d{8}) USD billed",
    ]
    assert len(lines) == len(patterns), out
    matches = [re.fullmatch(p, line) for p, line in zip(patterns, lines, strict=True)]
    assert all(matches), [line for line, m in zip(lines, matches, strict=True) if not m]
    # the WebSocket turn ran in chat_turn behind the edge (an asynchronous invoke), the SSE one in the app
    invoked = [label for label, _ in stack.edge.invocations]
    assert set(invoked) == {"ws_connect", "ws_default", "chat_turn", "ws_disconnect"}
    assert invoked.count("chat_turn") == 1, invoked
    image = matches[2][1] if matches[2] else ""
    async with httpx.AsyncClient(base_url=stack.stream, timeout=10) as http:
        gone = await http.get(f"/v1/images/{image}", headers={"authorization": f"Bearer {stack.token}"})
    assert gone.status_code == 404


async def test_a_wrong_ws_url_fails_the_websocket_turn_and_the_rest_goes_on(stack: Stack) -> None:
    nowhere = f"ws://127.0.0.1:{free_port()}/prod"
    code, out, err = await doctor("--url", stack.stream, "--ws-url", f"{nowhere}?token=s3cr3t", "--token", stack.token)
    assert (code, err) == (1, "") and "s3cr3t" not in out  # a key in a URL is never printed
    lines = out.splitlines()
    assert re.fullmatch(rf"FAIL  websocket turn  cannot reach {re.escape(nowhere)}: \[Errno \d+\] Connection refused"
                        r" — fix: is --ws-url right \(a stack: its WebSocketUrl output\)\?", lines[3]), lines[3]
    assert [line[:20] for line in lines[4:7]] == ["PASS  sse turn      ", "PASS  usage         ",
                                                  "PASS  cleanup       "]
    assert re.fullmatch(r"PASS  usage           1 record of 1 turn: .*", lines[5]), lines[5]
    assert lines[7] == "avm doctor: 1 of 7 steps failed (websocket turn)"
