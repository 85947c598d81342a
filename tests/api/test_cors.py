"""Cross-origin access (AVM_CORS_ORIGINS): off by default; for a named origin the preflight is answered
before the key gate (a browser sends no Authorization on it), and answers, errors included, carry the
headers that let that origin's page read them. Other origins get nothing."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from agentvm.config import Settings
from agentvm.drivers.scripted import ScriptedDriver
from tests.api.test_request_gate import _keys
from tests.support.servers import in_process

CONSOLE = "https://console.example.com"


def _preflight(origin: str, method: str = "POST") -> dict[str, str]:
    return {"origin": origin, "access-control-request-method": method,
            "access-control-request-headers": "authorization,content-type"}


async def test_no_origin_is_allowed_by_default(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    tokens = await _keys(data)
    async with in_process(data, driver=ScriptedDriver(), auth="keys") as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        pre = await http.options("/v1/images", headers=_preflight(CONSOLE))
        assert "access-control-allow-origin" not in pre.headers
        got = await http.get("/v1/images", headers={"origin": CONSOLE, "authorization": f"Bearer {tokens['user']}"})
        assert got.status_code == 200 and "access-control-allow-origin" not in got.headers


async def test_a_named_origin_gets_preflights_and_readable_answers_others_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    tokens = await _keys(data)
    async with in_process(data, driver=ScriptedDriver(), auth="keys", cors_origins=CONSOLE) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        pre = await http.options("/v1/images", headers=_preflight(CONSOLE))
        assert pre.status_code == 200  # not the gate's 401: a preflight carries no key
        assert pre.headers["access-control-allow-origin"] == CONSOLE
        assert set(pre.headers["access-control-allow-methods"].split(", ")) == {"GET", "POST", "PUT", "DELETE",
                                                                                "PATCH"}
        assert {"authorization", "content-type"} <= set(pre.headers["access-control-allow-headers"].split(", "))
        assert pre.headers["access-control-max-age"] == "600"

        ok = await http.get("/v1/images", headers={"origin": CONSOLE, "authorization": f"Bearer {tokens['user']}"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == CONSOLE
        denied = await http.get("/v1/images", headers={"origin": CONSOLE})
        assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == CONSOLE
        assert denied.json()["error"]["code"] == "unauthorized"

        other = await http.options("/v1/images", headers=_preflight("https://evil.example"))
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
        stranger = await http.get("/v1/images", headers={"origin": "https://evil.example",
                                                         "authorization": f"Bearer {tokens['user']}"})
        assert stranger.status_code == 200 and "access-control-allow-origin" not in stranger.headers


@pytest.mark.parametrize("value", ["*", "https://console.example.com/app", "console.example.com",
                                   "https://*.example.com"])
def test_an_origin_that_is_not_one_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(ValidationError, match="cors_origins") as err:
        Settings(cors_origins=value)
    assert "is not an origin (scheme://host[:port], no path, no wildcard)" in str(err.value)


def test_several_origins_are_accepted() -> None:
    assert Settings(cors_origins=f"{CONSOLE}, http://localhost:5173").cors_origins


async def test_a_page_may_send_and_read_an_agent_models_session_header(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    tokens = await _keys(data)
    async with in_process(data, driver=ScriptedDriver(), auth="keys", cors_origins=CONSOLE) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        pre = await http.options("/v1/chat/completions", headers={
            **_preflight(CONSOLE), "access-control-request-headers": "authorization, x-agentvm-session-id"})
        assert pre.status_code == 200, pre.text
        assert "x-agentvm-session-id" in pre.headers["access-control-allow-headers"].split(", ")
        user = {"origin": CONSOLE, "authorization": f"Bearer {tokens['user']}"}
        image = (await http.post("/v1/images", headers=user, json={"containerId": "c-cors"})).json()
        asked = {"model": f"agent/{image['imageId']}", "messages": [{"role": "user", "content": "hi"}]}
        got = await http.post("/v1/chat/completions", headers={**user, "x-agentvm-session-id": image["sessionId"]},
                              json=asked)
        assert got.status_code == 200, got.text
        assert got.headers["x-agentvm-session-id"] == image["sessionId"]
        exposed = set(got.headers["access-control-expose-headers"].split(", "))
        assert {"x-agentvm-session-id", "x-agentvm-turn-id", "x-agentvm-cost-usd"} <= exposed
