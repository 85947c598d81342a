"""Operator input is validated like user input (issue 15, point 6), end to end: `PUT /v1/config/{key}`
and `PUT /v1/budgets` answer 400 in the one error shape naming the key for NaN, ±Infinity, negative,
absurdly large and boolean values (before: a 500 for "NaN"); `avm serve` with such a value in the
environment or the config file stops with one line naming the variable and exit code 2 (before:
`AVM_MARKUP=NaN` started, and every turn then hung without a `turn_response`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from avm import cli
from tests.support.servers import REPO, in_process

NUMERIC_KEYS = ("llm.maxTokens", "system.maxToolIterations", "system.streamFlushMs", "system.streamMaxFlushMs",
                "defaults.markup", "billing.prices")
# JSON bodies as sent on the wire: Python's json (FastAPI's parser) reads the NaN and Infinity literals
RAW_BAD = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "-1", "1e30", "true", "false", '"NaN"', '"Infinity"',
           '"-1"', '"1e30"']


def row(raw: str) -> str:
    return f'{{"claude-sonnet-4": {{"input": {raw}, "output": "1", "cacheWrite": "1", "cacheRead": "1"}}}}'


async def test_config_api_refuses_bad_numbers_with_a_400_naming_the_key(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data") as srv, httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        before = (await http.get("/v1/config")).json()
        for key in NUMERIC_KEYS:
            for raw in RAW_BAD:
                value = row(raw) if key == "billing.prices" else raw
                res = await http.put(f"/v1/config/{key}", content=f'{{"value": {value}}}',
                                     headers={"content-type": "application/json"})
                assert res.status_code == 400, (key, raw, res.text)
                error = res.json()["error"]
                assert set(error) == {"code", "message", "field"}, error
                assert error["code"] == "invalid_request" and error["field"] == key
                assert error["message"].startswith(f"{key}: "), error
        # the case, exactly
        nan = await http.put("/v1/config/defaults.markup", json={"value": "NaN"})
        assert (nan.status_code, nan.json()) == (400, {"error": {
            "code": "invalid_request", "message": "defaults.markup: must be a decimal number such as 1.05",
            "field": "defaults.markup"}})
        assert (await http.get("/v1/config")).json() == before
        assert (await http.get("/v1/config/audit")).json()["changes"] == []
        # and turns are billed with the markup as it was
        done = (await http.post("/api/v1/agents/chat_basic/execute", json={"task": "hello"})).json()
        assert done["status"] == "completed", done


async def test_budgets_refuse_bad_amounts_and_boolean_counts(tmp_path: Path) -> None:
    cases: list[tuple[str, str]] = [
        *[("monthlyBudget", raw) for raw in ("NaN", "Infinity", "-Infinity", "1e999", '"NaN"', '"Infinity"',
                                             '"sNaN"', "-1", '"-0.01"', '"1000000000.01"', "1e30", "true", "false")],
        *[("requestsPerMinute", raw) for raw in ("true", "false", "NaN", "Infinity", "0", "-1", "1000001", "1e30",
                                                 "2.5", "5.0", '"5"')]]
    async with in_process(tmp_path / "data") as srv, httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
        for field, raw in cases:
            res = await http.put("/v1/budgets", content=f'{{"{field}": {raw}}}',
                                 headers={"content-type": "application/json"})
            assert res.status_code == 400, (field, raw, res.text)
            error = res.json()["error"]
            assert error["code"] == "invalid_request" and error["field"] == field, (raw, error)
            assert error["message"].startswith(f"{field}: "), error
        assert (await http.get("/v1/budgets")).json()["budgets"] == []
        rpm = await http.put("/v1/budgets", json={"requestsPerMinute": True})
        assert rpm.json()["error"]["message"] == "requestsPerMinute: must be a whole number"
        amount = await http.put("/v1/budgets", content='{"monthlyBudget": NaN}',
                                headers={"content-type": "application/json"})
        assert amount.json()["error"]["message"] == "monthlyBudget: must be from 0 to 1000000000 USD"
        ok = await http.put("/v1/budgets", json={"monthlyBudget": "25.00", "requestsPerMinute": 60})
        assert ok.status_code == 200, ok.text


def serve(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AVM_", "LLM_", "ANTHROPIC_"))}
    return subprocess.run([sys.executable, "-m", "avm.cli", "serve", "--port", "0", "--data-dir",
                           str(tmp_path / "data")], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**clean, **env})


@pytest.mark.parametrize(("env", "line"), [
    ({"AVM_MARKUP": "NaN"},
     "avm: invalid setting defaults.markup (AVM_MARKUP): must be a decimal number such as 1.05"),
    ({"AVM_PRICES": row('"Infinity"')}, "avm: invalid setting billing.prices (AVM_PRICES): "
     "claude-sonnet-4.input: must be a decimal number (USD per million tokens)"),
    ({"AVM_LLM_TIMEOUT_S": "inf"}, "avm: invalid setting llm_timeout_s (AVM_LLM_TIMEOUT_S): "
     "Input should be a finite number"),
    ({"AVM_MAX_TOOL_ITERATIONS": "1000000"}, "avm: invalid setting max_tool_iterations (AVM_MAX_TOOL_ITERATIONS): "
     "Input should be less than or equal to 1000"),
])
def test_avm_serve_stops_with_one_line_for_a_bad_variable(tmp_path: Path, env: dict[str, str], line: str) -> None:
    out = serve(tmp_path, env)
    assert (out.returncode, out.stderr) == (2, line + "\n")


def test_a_bad_number_in_the_config_file_stops_avm_serve_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for name in [n for n in os.environ if n.startswith("AVM_")]:
        monkeypatch.delenv(name)
    cases: list[tuple[str, Any]] = [
        ("defaults:\n  markup: .nan\n", "defaults.markup: must be a decimal number such as 1.05"),
        ("system:\n  maxToolIterations: true\n", "system.maxToolIterations: must be an integer from 1 to 1000"),
        ("llm:\n  maxTokens: 1e30\n", "llm.maxTokens: must be an integer from 1 to 200000"),
        ("billing:\n  prices:\n    x:\n      input: -.inf\n      output: 1\n      cacheWrite: 1\n      cacheRead: 1\n",
         "billing.prices: x.input: must be a decimal number (USD per million tokens)")]
    for text, message in cases:
        (data / "config.yaml").write_text(text)
        assert cli.main(["serve", "--port", "0", "--data-dir", str(data)]) == 2
        assert capsys.readouterr().err == f"avm: {data / 'config.yaml'}: {message}\n"
