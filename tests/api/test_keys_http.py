"""API keys on `avm serve`: `avm keys` writes the local database, `AVM_AUTH=keys` requires a key on
every HTTP request and WebSocket upgrade, `/v1/auth/keys` lets a tenant's admin key manage its keys,
and another tenant's ids answer as not found."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from agentvm.drivers.scripted import ScriptedDriver
from avm.cli import main
from tests.support.servers import in_process
from tests.support.stock_client import StockClient


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    # the command's own lines (log handlers left by other tests may write to stderr too)
    return code, out, "".join(f"{line}\n" for line in err.splitlines() if line.startswith("avm keys:"))


def token_of(out: str) -> str:
    return out.split("token (shown once, keep it secret): ")[1].split()[0]


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_keys_guard_every_request_and_tenants_manage_their_own(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    code, out, _ = await asyncio.to_thread(cli, capsys, "keys", "create", "--tenant", "acme", "--scope", "admin",
                                           "--name", "ops", "--data-dir", str(data))
    assert code == 0 and "scopes: admin" in out
    acme_admin = token_of(out)
    code, out, _ = await asyncio.to_thread(cli, capsys, "keys", "create", "--tenant", "bob", "--data-dir", str(data))
    bob = token_of(out)
    code, out, _ = await asyncio.to_thread(cli, capsys, "keys", "list", "--tenant", "acme", "--data-dir", str(data))
    assert code == 0 and out.split()[1:4] == ["active", "admin", "ops"]

    async with in_process(data, driver=ScriptedDriver(), auth="keys") as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        # no key, a bad key: refused on HTTP and at the WebSocket upgrade
        missing = await http.get("/v1/images")
        assert (missing.status_code, missing.json()["error"]["code"]) == (401, "unauthorized")
        assert (await http.get("/v1/images", headers=bearer("avmk_nope.nope"))).status_code == 401
        assert (await http.post("/api/v1/chat/completions", json={"agent_type": "chat_basic", "message": "x"})
                ).status_code == 401
        # a bad key on the upgrade: accepted, then closed at once with 1008 and the reason
        async with connect(f"{srv.url}?token=avmk_000000000000.nope") as refused:
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(refused.recv(), 5)
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1008, "API key not valid")

        # acme works over the WebSocket (token in the URL) and over HTTP (header)
        async with StockClient(f"{srv.url}?token={acme_admin}") as ws:
            image = await ws.new_image("c-acme")
            await ws.turn(image["imageId"], "acme's secret plan")
        assert [i["imageId"] for i in (await http.get("/v1/images", headers=bearer(acme_admin))).json()["items"]] \
            == [image["imageId"]]

        # bob sees none of it: every id of acme answers as not found
        assert (await http.get("/v1/images", headers=bearer(bob))).json()["items"] == []
        for path in (f"/v1/images/{image['imageId']}", f"/v1/sessions/{image['sessionId']}",
                     f"/v1/sessions/{image['sessionId']}/messages", f"/v1/sessions/{image['sessionId']}/export"):
            res = await http.get(path, headers=bearer(bob))
            assert res.status_code == 404, path
        history = await http.get("/api/v1/chat/history", params={"session_id": image["sessionId"]},
                                 headers=bearer(bob))
        assert history.json()["error"]["message"] == f"Session not found: {image['sessionId']}"
        assert (await http.get("/v1/sessions/search", params={"q": "secret"}, headers=bearer(bob))
                ).json()["items"] == []
        assert (await http.get("/v1/turns", headers=bearer(bob))).json()["items"] == []
        async with StockClient(f"{srv.url}?token={bob}") as ws:
            res = await ws.request("image_messages_request", {"imageId": image["imageId"]})
            assert res["data"]["error"] == f"Image not found: {image['imageId']}"

        # an admin key manages its tenant's keys; the token is in the creation answer only
        created = await http.post("/v1/auth/keys", json={"scopes": ["user"], "name": "app", "expiresDays": 30},
                                  headers=bearer(acme_admin))
        assert created.status_code == 201, created.text
        user = created.json()
        assert (user["tenantId"], user["scopes"], user["status"]) == ("acme", ["user"], "active")
        listed = (await http.get("/v1/auth/keys", headers=bearer(acme_admin))).json()["items"]
        assert [k["name"] for k in listed] == ["app", "ops"]
        assert "token" not in str(listed) and "salt" not in str(listed) and user["token"] not in str(listed)
        assert (await http.get("/v1/images", headers=bearer(user["token"]))).status_code == 200
        # a user key may not make or revoke keys, and sees only its own tenant's
        forbidden = await http.post("/v1/auth/keys", json={}, headers=bearer(user["token"]))
        assert (forbidden.status_code, forbidden.json()["error"]["message"]) == (
            403, "Only an admin key may create keys")
        assert [k["tenantId"] for k in (await http.get("/v1/auth/keys", headers=bearer(bob))).json()["items"]] == [
            "bob"]
        assert (await http.delete(f"/v1/auth/keys/{user['keyId']}", headers=bearer(bob))).status_code == 403
        # revoked: refused at once
        assert (await http.delete(f"/v1/auth/keys/{user['keyId']}", headers=bearer(acme_admin))).status_code == 204
        revoked = await http.get("/v1/images", headers=bearer(user["token"]))
        assert revoked.status_code == 401 and "revoked" in revoked.json()["error"]["message"]
        assert (await http.delete("/v1/auth/keys/avmk_000000000000", headers=bearer(acme_admin))).status_code == 404
        bad = await http.post("/v1/auth/keys", json={"scopes": ["root"]}, headers=bearer(acme_admin))
        assert (bad.status_code, bad.json()["error"]["field"]) == (400, "scopes[0]")

    code, out, err = await asyncio.to_thread(cli, capsys, "keys", "revoke", "--tenant", "bob", "avmk_nope",
                                             "--data-dir", str(data))
    assert (code, err) == (1, "avm keys: API key not found: avmk_nope (tenant bob)\n")


async def test_the_open_local_mode_needs_no_key(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver()) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        assert (await http.get("/v1/images")).status_code == 200
        created = await http.post("/v1/auth/keys", json={"scopes": ["admin"]})  # the operator, as tenant local
        assert created.status_code == 201 and created.json()["tenantId"] == "local"


async def test_a_browser_authenticates_with_a_first_auth_frame(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    data = tmp_path / "data"
    _code, out, _ = await asyncio.to_thread(cli, capsys, "keys", "create", "--tenant", "acme", "--data-dir", str(data))
    token = token_of(out)
    async with in_process(data, driver=ScriptedDriver(), auth="keys", auth_timeout_s=0.5) as srv:
        async with connect(srv.url) as ws:  # no header, no ?token=: the first frame authenticates
            await ws.send(orjson.dumps({"type": "auth", "headers": {"Authorization": f"Bearer {token}"}}).decode())
            await ws.send(orjson.dumps({"type": "container_list_request", "timestamp": 1,
                                        "data": {"requestId": "r1"}}).decode())
            answer = orjson.loads(await ws.recv())
            answer = orjson.loads(answer["__payload"]) if "__payload" in answer else answer  # the ACK wrapper
            assert answer["type"] == "container_list_response" and answer["data"]["requestId"] == "r1"
        for first, reason in [
            ({"type": "auth", "headers": {"Authorization": "Bearer avmk_000000000000.nope"}}, "API key not valid"),
            ({"type": "container_list_request", "data": {"requestId": "r1"}}, 'API key required: send {"type": "auth"'),
            (None, "API key required: no auth frame within 0.5 s"),
        ]:
            async with connect(srv.url) as ws:
                if first is not None:
                    await ws.send(orjson.dumps(first).decode())
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 5)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
                assert closed.value.rcvd.reason.startswith(reason), closed.value.rcvd.reason
