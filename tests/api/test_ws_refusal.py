"""A WebSocket client that `avm serve` refuses learns why (issue 19, item 6): with no key, the
close (1008) carries "API key required: …"; a bad key on the upgrade gets HTTP 403 with "API key
not valid" in the API's error shape. The Python client raises `ConnectionRefused` / `ConnectError`
with the reason (and does not reconnect), and `avm chat` prints it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentvm.drivers.scripted import ScriptedDriver
from agentvm_client import AgentVMClient, ConnectError, ConnectionRefused
from tests.support.servers import REPO, in_process

AUTH_FIRST = 'API key required: send {"type": "auth", "headers": {"Authorization": "Bearer <key>"}} first'


def avm_chat(url: str, *token: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AVM_")}
    env["PYTHONPATH"] = os.pathsep.join(str(REPO / d) for d in ("shared", "local", "client"))
    return subprocess.run([sys.executable, "-c", "import sys; from avm.cli import main; sys.exit(main())", "chat",
                           "--url", url, *token], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60, env=env, check=False)


async def test_a_refused_websocket_client_is_told_why(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver(), auth="keys") as srv:
        # no key: the upgrade is accepted (a browser sends its key in a first frame), the request closes it
        client = AgentVMClient(srv.url, connect_timeout=5)
        await client.connect()
        with pytest.raises(ConnectionRefused) as refused:
            await client.request_ok("container_list", {})
        assert (refused.value.code, refused.value.reason) == (1008, AUTH_FIRST)
        assert str(refused.value) == f"the server refused the connection: {AUTH_FIRST} (code 1008)"
        await asyncio.sleep(0.3)
        with pytest.raises(ConnectionRefused):  # given up: not reconnecting to be refused again
            await client.request_ok("container_list", {})
        await client.close()
        # a bad key: refused at the upgrade, with the reason
        with pytest.raises(ConnectError) as bad:
            await AgentVMClient(srv.url, token="avmk_000000000000.nope", connect_timeout=5).connect()
        assert bad.value.status == 403
        assert str(bad.value) == f"{srv.url} refused the connection (HTTP 403): API key not valid"

        # avm chat prints the reason, one line, exit code 1
        no_key, bad_key = await asyncio.gather(
            asyncio.to_thread(avm_chat, srv.url),
            asyncio.to_thread(avm_chat, srv.url, "--token", "avmk_000000000000.nope"))
    assert no_key.returncode == 1, no_key.stderr
    assert f"the server refused the connection: {AUTH_FIRST} (code 1008)" in no_key.stderr
    assert "Traceback" not in no_key.stderr
    assert bad_key.returncode == 1, bad_key.stderr
    assert "refused the connection (HTTP 403): API key not valid" in bad_key.stderr
