"""The config center on `avm serve`: layers in order, secrets never shown, invalid updates refused
without a change, audited updates that the next turn uses without a restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentvm.drivers.scripted import ScriptedDriver
from avm import cli
from tests.support.scripts import RecordingDriver
from tests.support.servers import InProcess, in_process
from tests.support.stock_client import StockClient

SECRET = "sk-ant-api03-config-secret-never-shown"


@pytest.fixture
async def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[InProcess]:
    data = tmp_path / "data"
    data.mkdir()
    (data / "config.yaml").write_text(
        "llm:\n  model: model-from-file\n  apiKey: ${TEST_LLM_KEY}\n"
        "system:\n  maxToolIterations: 7\n  streamFlushMs: 40\n")
    monkeypatch.setenv("TEST_LLM_KEY", SECRET)
    monkeypatch.setenv("AVM_MAX_TOOL_ITERATIONS", "9")  # the environment beats the file
    async with in_process(data, driver=RecordingDriver(ScriptedDriver())) as server:
        yield server


async def test_layers_resolve_in_order_and_secrets_stay_masked(srv: InProcess) -> None:
    async with httpx.AsyncClient(base_url=srv.http) as http:
        res = await http.get("/v1/config")
        assert SECRET not in res.text
        values = res.json()["values"]
        assert values["llm.model"]["value"] == "model-from-file"
        assert values["llm.model"]["source"] == "file"
        assert values["llm.apiKey"] == {"value": "********", "source": "file", "layers": {"file": "********"},
                                        "secret": True, "appliesAt": "restart", "description": "Anthropic API key."}
        assert values["system.maxToolIterations"]["layers"] == {"default": 25, "file": 7, "env": 9}
        assert values["system.maxToolIterations"]["source"] == "env"
        assert values["system.streamFlushMs"]["layers"] == {"default": 0, "file": 40}
        assert values["defaults.markup"]["value"] == "1.05"

        put = await http.put("/v1/config/system.maxToolIterations", json={"value": 12})
        assert put.status_code == 200
        assert put.json()["layers"] == {"default": 25, "file": 7, "env": 9, "runtime": 12}
        assert put.json()["source"] == "runtime"
        secret_put = await http.put("/v1/config/llm.apiKey", json={"value": "sk-ant-new-secret"})
        assert "sk-ant-new-secret" not in secret_put.text and secret_put.json()["value"] == "********"
        audit = (await http.get("/v1/config/audit")).json()["changes"]
        assert [(c["key"], c["old"], c["new"], c["actor"]) for c in audit] == [
            ("llm.apiKey", None, '"********"', "local"), ("system.maxToolIterations", None, "12", "local")]
        unset = await http.delete("/v1/config/system.maxToolIterations")
        assert unset.json()["source"] == "env"


async def test_an_invalid_update_is_refused_and_changes_nothing(srv: InProcess) -> None:
    async with httpx.AsyncClient(base_url=srv.http) as http:
        before = (await http.get("/v1/config")).json()
        cases: list[tuple[str, Any, int, str]] = [
            ("system.maxToolIterations", 0, 400, "system.maxToolIterations: must be an integer from 1 to 1000"),
            ("llm.model", "", 400, "llm.model: must be a non-empty string"),
            ("defaults.markup", "cheap", 400, "defaults.markup: must be a decimal number such as 1.05"),
            ("defaults.markup", "0.5", 400, "defaults.markup: must be from 1 to 10 (a price multiplier)"),
            ("llm.baseUrl", "ftp://x", 400, "llm.baseUrl: must be an http(s) URL"),
            ("llm.providers", {"deepseek": {"type": "openai", "models": {"deepseek-chat": {}}}}, 400,
             "llm.providers: deepseek.baseUrl: an OpenAI-compatible provider needs its base URL"),
            ("llm.providers", {"ds": {"type": "openai", "baseUrl": "https://api.deepseek.com", "apiKey": "sk-1",
                                      "models": {"c": {}}}}, 400,
             "llm.providers: ds.apiKey: unknown field (known: type, baseUrl, apiKeyEnv, region, models; a key "
             "itself never goes here: apiKeyEnv names the variable that holds it)"),
            ("llm.providers", {"ds": {"type": "openai", "baseUrl": "https://api.deepseek.com",
                                      "models": {"c": {"input": "1", "output": "2", "cacheRead": "0.1"}}}}, 400,
             "llm.providers: ds.models.c.cacheWrite: missing (USD per million tokens; every model is priced)"),
            ("llm.providers", {"anthropic": {"type": "anthropic", "models": {}}}, 400,
             "llm.providers: anthropic: this provider name is built in"),
            ("no.such.key", 1, 404, "Unknown config key: no.such.key (known: llm.model, llm.maxTokens, llm.apiKey, "
             "llm.baseUrl, llm.providers, system.maxToolIterations, system.streamFlushMs, system.streamMaxFlushMs, "
             "defaults.markup, billing.prices)"),
        ]
        for key, value, status, message in cases:
            res = await http.put(f"/v1/config/{key}", json={"value": value})
            assert res.status_code == status, (key, res.text)
            assert res.json()["error"]["message"] == message
        missing = await http.put("/v1/config/llm.model", json={})
        assert missing.status_code == 400 and missing.json()["error"]["field"] == "value"
        assert (await http.get("/v1/config")).json() == before
        assert (await http.get("/v1/config/audit")).json()["changes"] == []


async def test_a_changed_model_is_used_by_the_next_turn(srv: InProcess) -> None:
    recorder = srv.runtime.driver
    assert isinstance(recorder, RecordingDriver)
    async with httpx.AsyncClient(base_url=srv.http) as http, StockClient(srv.url) as ws:
        image = await ws.new_image("c-config")
        await ws.turn(image["imageId"], "one")
        assert (await http.put("/v1/config/llm.model", json={"value": "claude-haiku-4-5"})).status_code == 200
        await ws.turn(image["imageId"], "two")
        assert (await http.put("/v1/config/defaults.markup", json={"value": "1.5"})).status_code == 200
        done = (await ws.turn(image["imageId"], "three"))[-1]["data"]
    assert [r.model for r in recorder.requests] == ["model-from-file", "claude-haiku-4-5", "claude-haiku-4-5"]
    assert done["model"] == "claude-haiku-4-5"


async def test_avm_config_commands(srv: InProcess, capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    def avm(*argv: str) -> tuple[int, str, str]:
        code = cli.main(["config", "--url", srv.url, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = await asyncio.to_thread(avm, "set", "llm.maxTokens", "2048")
    assert (code, out) == (0, "llm.maxTokens = 2048  (runtime; applies at next turn)\n")
    code, out, _ = await asyncio.to_thread(avm, "get", "llm.apiKey")
    assert (code, out) == (0, 'llm.apiKey = "********"  (file; applies at restart)\n')
    code, _, err = await asyncio.to_thread(avm, "set", "llm.maxTokens", "0")
    assert (code, err) == (1, "avm config: llm.maxTokens: must be an integer from 1 to 200000\n")
    code, out, _ = await asyncio.to_thread(avm, "get")
    assert code == 0 and SECRET not in out and len(out.splitlines()) == 10


def test_a_bad_config_file_stops_avm_serve_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for text, message in (
            ("llm:\n  maxTokens: lots\n", "llm.maxTokens: must be an integer from 1 to 200000"),
            ("llm:\n  apiKey: ${NOT_SET_ANYWHERE}\n", "llm.apiKey: ${NOT_SET_ANYWHERE} is not set in the environment"),
            ("llm:\n  colour: blue\n", "llm.colour: unknown key (known: llm.model, "),
            ("- a list\n", "must be a mapping with llm, system, defaults and billing sections"),
            ("llm:\n  apiKey: sk-ant-in-the-file: x\n",
             "not valid YAML at line 2, column 29: mapping values are not allowed here")):
        (data / "config.yaml").write_text(text)
        monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
        assert cli.main(["serve", "--port", "0", "--data-dir", str(data)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"avm: {data / 'config.yaml'}: ") and message in err, err
        assert err.count("\n") == 1
        assert "sk-ant-in-the-file" not in err
