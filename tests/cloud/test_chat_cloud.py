"""`avm chat` against the cloud's shape (as `avm doctor` is in test_doctor_cloud.py): the AgentX WebSocket
is the emulated API Gateway edge, with the API key as `?token=` in its URL (how README tells a stack's
users to connect), and the sessions API is the streaming app (`--http-url`, a stack's ChatStreamUrl).
The chat runs as a process with piped stdin: the plain mode, one reply per message."""

from __future__ import annotations

import asyncio
import os
import re
import sys

import tests.cloud.test_doctor_cloud as doctor_cloud
from tests.support.servers import REPO

stack = doctor_cloud.stack  # the same fixture: moto, the edge in front of the handlers, the stream app
ID = r"[a-z0-9_]+"


async def chat(stdin: str, *argv: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AVM_", "LLM_", "ANTHROPIC_"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "avm.cli", "chat", "--container", "user-cloud", "--history", "", *argv, cwd=REPO,
        env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 120)
    return int(proc.returncode or 0), out.decode(), err.decode()


async def test_chat_on_a_stack_with_the_key_in_the_websocket_url(stack: doctor_cloud.Stack) -> None:
    ws = f"{stack.edge.url}?token={stack.token}"
    code, out, err = await chat("hello\n/new\nagain\n/sessions\n/images\n/history\n/exit\n", "--url", ws,
                                "--http-url", stack.stream)
    assert (code, err.count("\n")) == (0, 1), out + err
    m = re.fullmatch(rf"new session (sess_{ID}) of image (img_{ID})\n", err)
    assert m, err
    new_session, image = m[1], m[2]
    lines = out.splitlines()
    assert lines[:3] == [f"image: {image}", "You said: hello", "You said: again"], out
    assert len(lines) == 8 and re.fullmatch(rf"  sess_{ID}  [-0-9 :]+  primary", lines[3]), out
    assert re.fullmatch(rf"\* {new_session}  [-0-9 :]+", lines[4]), out
    assert re.fullmatch(rf"\* {image}  [-0-9 :]+  New Conversation(  online)?", lines[5]), out
    assert lines[6:] == ["you: again", "assistant: You said: again"], out  # the new session's conversation
    assert stack.token not in out + err


async def test_a_refused_key_is_one_line_without_the_key(stack: doctor_cloud.Stack) -> None:
    code, out, err = await chat("hello\n", "--url", f"{stack.edge.url}?token=avm_wrong", "--http-url", stack.stream)
    assert (code, out) == (1, ""), err
    # the URL is shown without its query: the key never reaches the terminal
    assert err == (f"avm chat: {stack.edge.url} refused the connection (HTTP 401): API key not valid "
                   "(check --token or $AVM_TOKEN)\n")
