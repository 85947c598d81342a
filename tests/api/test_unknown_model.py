"""An unknown model is refused at image build, on every surface that builds images (issue 19,
item 6): `unknown_model`, the field, and the list of known models (the price table's, with the
offline scripted driver's names only while that driver runs turns)."""

from __future__ import annotations

from pathlib import Path

import httpx

from agentvm.definitions import register_agent
from agentvm.drivers.scripted import ScriptedDriver
from agentvm.money import DEFAULT_PRICES, is_known_model, known_models
from tests.support.servers import in_process
from tests.support.stock_client import StockClient

PRICED = ["claude-3-5-haiku", "claude-3-haiku", "claude-haiku-4", "claude-opus-4", "claude-opus-4-5",
          "claude-opus-4-6", "claude-sonnet-4"]


@register_agent("test-gpt")
def _gpt_agent() -> dict[str, str]:
    return {"description": "Names a model nobody serves.", "systemPrompt": "Hi.", "model": "gpt-4o"}


def test_the_known_models_are_the_price_tables_and_the_offline_drivers_only_while_it_runs() -> None:
    assert known_models() == PRICED
    assert known_models(offline=True) == sorted([*PRICED, "scripted"])
    assert set(DEFAULT_PRICES) == {*PRICED, "scripted"}
    assert is_known_model("claude-sonnet-4-5-20250929", PRICED)
    assert not is_known_model("gpt-4o", PRICED) and not is_known_model("scripted", PRICED)
    assert not is_known_model("claude", PRICED)  # a prefix of a name is not a name


async def test_avm_serve_refuses_an_unknown_model_over_http_and_the_websocket(tmp_path: Path) -> None:
    known = ", ".join(sorted([*PRICED, "scripted"]))
    async with in_process(tmp_path / "data", driver=ScriptedDriver()) as srv, \
            httpx.AsyncClient(base_url=srv.http) as http, StockClient(srv.url) as ws:
        res = await http.post("/v1/images", json={"containerId": "c1", "config": {"model": "gpt-4o"}})
        assert res.status_code == 400
        assert res.json() == {"error": {
            "code": "unknown_model", "field": "config.model",
            "message": f"config.model: unknown model 'gpt-4o'; known models: {known} (a name may go on, as in "
                       "claude-sonnet-4-5-20250929)"}}
        # a definition naming one: refused too, the field is the agent
        res = await http.post("/v1/images", json={"containerId": "c1", "agent": "test-gpt"})
        assert (res.status_code, res.json()["error"]["code"], res.json()["error"]["field"]) == \
            (400, "unknown_model", "agent")
        assert f"known models: {known} " in res.json()["error"]["message"]
        # the WebSocket's image_create: the same refusal
        reply = await ws.request("image_create_request", {"containerId": "c1", "config": {"model": "gpt-4o"}})
        assert reply["data"]["errorCode"] == "unknown_model", reply
        assert reply["data"]["error"].startswith("config.model: unknown model 'gpt-4o'; known models: claude-3-5")
        # nothing was stored
        assert (await http.get("/v1/images")).json()["items"] == []
        # known ones are built: a priced model with a date, and the offline driver's own name
        for model in ("claude-sonnet-4-5-20250929", "scripted"):
            built = await http.post("/v1/images", json={"containerId": "c1", "config": {"model": model}})
            assert built.status_code == 201, built.text
            assert built.json()["model"] == model


async def test_the_offline_drivers_names_are_unknown_when_a_real_driver_runs(tmp_path: Path) -> None:
    from agentvm.drivers.anthropic_sdk import AnthropicDriver

    driver = AnthropicDriver("sk-ant-test", base_url="http://127.0.0.1:9")  # never called: no turn runs
    async with in_process(tmp_path / "data", driver=driver) as srv, httpx.AsyncClient(base_url=srv.http) as http:
        res = await http.post("/v1/images", json={"containerId": "c1", "config": {"model": "scripted"}})
        assert res.status_code == 400
        assert res.json()["error"]["code"] == "unknown_model"
        assert f"known models: {', '.join(PRICED)} " in res.json()["error"]["message"]
