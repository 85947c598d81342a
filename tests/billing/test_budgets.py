"""Budgets cannot be overrun: every LLM call holds its worst case before it starts, so 50 concurrent
turns against a budget that covers 10 end at or below it, and refused turns never reach the model
(`quota_exceeded`, no tokens). Rate limits refuse with `rate_limited`."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

from agentvm.domain.models import Usage
from agentvm.drivers.base import LLMRequest
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from agentvm.money import cost_of
from agentvm.services.metering import worst_cost
from tests.support.scripts import RecordingDriver
from tests.support.servers import in_process

MODEL = "claude-sonnet-4-5"
SCRIPT = """
rules:
  - match: "^work"
    responses:
      - text: ["done"]
        usage: {input_tokens: 20, output_tokens: 50}
        delay_ms: 30
"""
ONE = cost_of(Usage(20, 50), MODEL).billed  # 0.0008505 USD: (20 × 3 + 50 × 15) / 1e6 × 1.05


async def execute(http: httpx.AsyncClient, task: str) -> dict[str, Any]:
    r = await http.post("/api/v1/agents/chat_basic/execute", json={"task": task, "config": {"max_tokens": 60}})
    assert r.status_code == 200, r.text
    return dict(r.json())


def refused(result: dict[str, Any]) -> bool:
    if result["status"] == "completed":
        assert Decimal(result["cost"]["billed"]) == ONE
        return False
    assert result["status"] == "failed" and result["error"]["code"] == "quota_exceeded", result
    assert "monthly budget of 0.00850500 USD" in result["error"]["message"]
    assert result["usage"] == Usage().to_wire() and Decimal(result["cost"]["billed"]) == 0
    return True


async def test_fifty_concurrent_turns_cannot_overrun_a_budget_that_covers_ten(tmp_path: Path) -> None:
    driver = RecordingDriver(ScriptedDriver(parse_script(SCRIPT)))
    budget = ONE * 10
    async with in_process(tmp_path / "data", driver=driver, llm_model=MODEL) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=30) as http:
        r = await http.put("/v1/budgets", json={"monthlyBudget": str(budget)})
        assert r.status_code == 200 and r.json()["monthlyBudget"] == "0.00850500", r.text

        results = await asyncio.gather(*(execute(http, f"work {i}") for i in range(50)))
        done = [r for r in results if not refused(r)]
        assert 1 <= len(done) <= 10 and len(results) - len(done) >= 40
        # a refused turn never reached the model: one request per completed turn
        assert len(driver.requests) == len(done)

        # then one at a time until the budget refuses: what is left cannot hold one more call
        while not refused(await execute(http, "work more")):
            pass
        report = (await http.get("/v1/budgets")).json()
        spent = Decimal(report["spent"])
        assert spent <= budget and Decimal(report["reserved"]) == 0
        assert spent == ONE * len(driver.requests)
        worst = worst_cost(driver.requests[-1], markup=Decimal("1.05"), prices=None)
        assert budget - spent < worst
        assert report["budgets"][0]["spent"] == report["spent"]

        usage = (await http.get("/v1/usage", params={"groupBy": "model"})).json()
        assert Decimal(usage["total"]["billedCost"]) == spent
        assert usage["rows"] == [{"model": MODEL, "calls": len(driver.requests), **usage["total"]}]

        # raising the budget lets turns run again at once (this process forgets its cached budget)
        assert (await http.put("/v1/budgets", json={"monthlyBudget": "1"})).status_code == 200
        assert not refused(await execute(http, "work again"))


async def test_requests_per_minute_refuse_with_rate_limited(tmp_path: Path) -> None:
    driver = ScriptedDriver(parse_script(SCRIPT))
    async with in_process(tmp_path / "data", driver=driver, llm_model=MODEL) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=30) as http:
        meter = srv.runtime.services.deps.meter
        assert meter is not None
        meter._clock = lambda: 1_795_000_000_000  # one minute for the whole test
        assert (await http.put("/v1/budgets", json={"requestsPerMinute": 2})).status_code == 200
        first = [await execute(http, f"work {i}") for i in range(3)]
        assert [r["status"] for r in first] == ["completed", "completed", "failed"]
        assert first[2]["error"] == {
            "code": "rate_limited",
            "message": "Rate limit reached: this tenant may start 2 turns per minute. Try again in a minute."}
        meter._clock = lambda: 1_795_000_060_000  # the next minute
        assert (await execute(http, "work on"))["status"] == "completed"


async def test_budget_requests_are_checked_and_admin_only(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", llm_model=MODEL) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=30) as http:
        bad = await http.put("/v1/budgets", json={"monthlyBudget": "ten"})
        assert bad.status_code == 400 and bad.json()["error"] == {
            "code": "invalid_request", "field": "monthlyBudget",
            "message": 'monthlyBudget: must be a decimal amount in USD, such as "25.00"'}
        neg = await http.put("/v1/budgets", json={"monthlyBudget": "-1"})
        assert neg.status_code == 400 and neg.json()["error"]["field"] == "monthlyBudget"
        empty = await http.put("/v1/budgets", json={})
        assert empty.status_code == 400 and empty.json()["error"]["field"] == "monthlyBudget"
        rpm = await http.put("/v1/budgets", json={"requestsPerMinute": 0})
        assert rpm.status_code == 400 and rpm.json()["error"]["field"] == "requestsPerMinute"
        key = await http.put("/v1/budgets", json={"keyId": "avmk_nope", "monthlyBudget": "5"})
        assert key.status_code == 404 and key.json()["error"]["message"] == "API key not found: avmk_nope"
        gone = await http.delete("/v1/budgets")
        assert gone.status_code == 404 and gone.json()["error"]["message"] == "Budget not found: this tenant"
        assert (await http.get("/v1/budgets")).json()["budgets"] == []


def test_the_worst_case_bounds_input_by_bytes_and_media_by_block() -> None:
    text = LLMRequest(MODEL, [{"role": "user", "content": "é" * 100}], max_tokens=10)
    image = LLMRequest(MODEL, [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 1_000_000}}]}],
        max_tokens=10)
    from agentvm.services.metering import BLOCK_TOKENS, worst_input_tokens

    assert worst_input_tokens(text) >= 200  # two UTF-8 bytes per é: never fewer tokens than bytes
    assert BLOCK_TOKENS <= worst_input_tokens(image) < BLOCK_TOKENS + 100
    # at the dearer of input (3) and cache write (3.75), plus max_tokens at output (15), × 1.05, rounded up:
    # (247 × 3.75 + 10 × 15) / 1e6 × 1.05 = 0.0011300625
    assert worst_input_tokens(text) == 247
    assert worst_cost(text, markup=Decimal("1.05"), prices=None) == Decimal("0.00113007")


async def test_a_keys_budget_limits_that_key_only(tmp_path: Path) -> None:
    from agentvm.adapters.local.sqlite_keys import SqliteKeys
    from agentvm.auth.api_keys import new_key

    async with in_process(tmp_path / "data", driver=ScriptedDriver(parse_script(SCRIPT)), llm_model=MODEL,
                          auth="keys") as srv, httpx.AsyncClient(base_url=srv.http, timeout=30) as http:
        keys = SqliteKeys(srv.runtime.store)
        tokens = {}
        for name, scope in (("admin", "admin"), ("intern", "user"), ("staff", "user")):
            key, tokens[name] = new_key("acme", [scope], name=name)
            await keys.put_key(key)
        intern_id = tokens["intern"].split(".")[0]

        def as_(who: str) -> dict[str, str]:
            return {"authorization": f"Bearer {tokens[who]}"}

        # the intern's key may spend what two turns cost; the tenant has no budget
        r = await http.put("/v1/budgets", headers=as_("admin"),
                           json={"keyId": intern_id, "monthlyBudget": str(ONE * 2)})
        assert r.status_code == 200 and r.json()["keyId"] == intern_id
        assert (await http.put("/v1/budgets", headers=as_("intern"), json={"monthlyBudget": "1"})).status_code == 403

        async def run(who: str) -> dict[str, Any]:
            res = await http.post("/api/v1/agents/chat_basic/execute", headers=as_(who),
                                  json={"task": "work", "config": {"max_tokens": 60}})
            return dict(res.json())

        intern = [await run("intern") for _ in range(3)]
        # the first hold fits (worst case ≤ 2 turns' cost), then what is left cannot hold another
        statuses = [r["status"] for r in intern]
        assert statuses[0] == "completed" and statuses[-1] == "failed", statuses
        refusal = next(r for r in intern if r["status"] == "failed")["error"]
        assert refusal["code"] == "quota_exceeded" and "this API key's monthly budget" in refusal["message"]
        assert [(await run("staff"))["status"] for _ in range(3)] == ["completed"] * 3  # other keys go on
        report = (await http.get("/v1/budgets", headers=as_("admin"))).json()
        [intern_budget] = report["budgets"]
        done = statuses.count("completed")
        assert Decimal(intern_budget["spent"]) == ONE * done <= ONE * 2
        assert Decimal(report["spent"]) == ONE * (done + 3)  # the tenant's month counts every key
