"""A WebSocket client that `avm serve` refuses learns why (issue 19, item 6): with no key, the
close (1008) carries "API key required: …"; a bad key on the upgrade (header or `?token=`) is
accepted and closed at once with 1008 and "API key not valid" (a browser's WebSocket API can read a
close's code and reason, not an HTTP refusal of the upgrade), and a command sent meanwhile gets
nothing but the close. The Python client raises `ConnectionRefused` with the reason (and does not
reconnect), and `avm chat` prints it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from agentvm.drivers.scripted import ScriptedDriver
from agentvm_client import AgentVMClient, ConnectionRefused
from avm.doctor import Doctor, StepFailed, Targets
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
        # a bad key: the upgrade is accepted and closed at once, with the reason
        bad_client = AgentVMClient(srv.url, token="avmk_000000000000.nope", connect_timeout=5)
        await bad_client.connect()
        with pytest.raises(ConnectionRefused) as bad:
            await bad_client.request_ok("container_list", {})
        assert (bad.value.code, bad.value.reason) == (1008, "API key not valid")
        assert str(bad.value) == "the server refused the connection: API key not valid (code 1008)"
        await asyncio.sleep(0.3)
        with pytest.raises(ConnectionRefused):  # given up: not reconnecting to be refused again
            await bad_client.request_ok("container_list", {})
        assert bad_client.connected is False
        await bad_client.close()

        # avm chat prints the reason, one line, exit code 1
        no_key, bad_key = await asyncio.gather(
            asyncio.to_thread(avm_chat, srv.url),
            asyncio.to_thread(avm_chat, srv.url, "--token", "avmk_000000000000.nope"))
    assert no_key.returncode == 1, no_key.stderr
    assert no_key.stderr.splitlines() == [f"avm chat: the server refused the connection: {AUTH_FIRST} (code 1008)"
                                          " (check --token or $AVM_TOKEN)"]
    assert "Traceback" not in no_key.stderr
    assert bad_key.returncode == 1, bad_key.stderr
    assert bad_key.stderr.splitlines() == ["avm chat: the server refused the connection: API key not valid (code 1008)"
                                           " (check --token or $AVM_TOKEN)"]


@pytest.mark.parametrize("how", ["header", "query"])
async def test_a_bad_key_gets_nothing_but_the_close(tmp_path: Path, how: str) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver(), auth="keys") as srv:
        token = "avmk_000000000000." + "x" * 43
        url, headers = (srv.url, {"Authorization": f"Bearer {token}"}) if how == "header" \
            else (f"{srv.url}?token={token}", None)
        async with connect(url, additional_headers=headers) as ws:
            with contextlib.suppress(ConnectionClosed):  # the close may be in already
                await ws.send(json.dumps({"type": "container_create_request", "data": {"requestId": "r1",
                                                                                       "containerId": "c1"}}))
                await ws.send(json.dumps({"type": "auth", "headers": {"Authorization": f"Bearer {token}"}}))
            got = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    got.append(await asyncio.wait_for(ws.recv(), 5))
        assert got == []
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1008, "API key not valid")


async def test_avm_doctor_names_the_refusal_of_the_websocket_step(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver(), auth="keys") as srv:
        token = "avmk_000000000000." + "x" * 43
        doctor = Doctor(Targets(srv.http, f"{srv.url}?token={token}", srv.http), token, None, 5.0, io.StringIO())
        doctor.state.image_id = "img_never_reached"
        try:
            with pytest.raises(StepFailed) as failed:
                await doctor._ws_turn()
        finally:
            await doctor._http.aclose()
    assert failed.value.reason == f"{srv.url}: the connection was refused: API key not valid"
    assert failed.value.fix.startswith("--token must be an active API key of this deployment")
    assert token not in failed.value.reason + failed.value.fix
