"""Budgets cannot be overrun: every LLM call holds its worst case before it starts, so 50 concurrent
turns against a budget that covers 10 end at or below it, and refused turns never reach the model
(`quota_exceeded`, no tokens). Rate limits refuse with `rate_limited`."""

from __future__ import annotations

import asyncio
import json
import logging
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentvm.domain.models import Usage
from agentvm.drivers.base import LLMRequest
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from agentvm.ids import now_ms
from agentvm.money import cost_of, money_text
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
    from agentvm.drivers.token_bounds import IMAGE_TOKENS, worst_input_tokens

    assert worst_input_tokens(text) >= 200  # two UTF-8 bytes per é: never fewer tokens than bytes
    assert IMAGE_TOKENS <= worst_input_tokens(image) < IMAGE_TOKENS + 100
    # at the dearer of input (3) and cache write (3.75), plus max_tokens at output (15), × 1.05, rounded up:
    # (245 × 3.75 + 10 × 15) / 1e6 × 1.05 = 0.0011221875
    assert worst_input_tokens(text) == 245
    assert worst_cost(text, markup=Decimal("1.05"), prices=None) == Decimal("0.00112219")


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


# ---- the hold is an upper bound; an upstream that bills above it ---------------------------------

class MeteredDriver:
    """A model that answers "done" and reports usage as Anthropic would for the request it got: input
    tokens about one per 4 bytes of the request's text (Claude's tokenizers average 3.5 to 4 bytes a
    token), output tokens the same for its answer. `over` (a call index, or "all") reports instead
    `factor` × the input tokens that would cost the whole hold (the input bound plus max_tokens at the
    output price, 5 × the input price): an upstream billing more than the hold assumed."""

    name = "anthropic"

    def __init__(self, over: int | str | None = None, factor: int = 3, delay_s: float = 0.03,
                 over_delay_s: float = 0.03) -> None:
        self.over = over
        self.factor = factor
        self.over_delay_s = over_delay_s
        self.delay_s = delay_s
        self.requests: list[LLMRequest] = []
        self.billed: list[tuple[LLMRequest, Usage]] = []

    async def stream(self, request: LLMRequest) -> Any:
        from agentvm.drivers.base import MessageStart, MessageStop, TextDelta
        from agentvm.drivers.token_bounds import worst_input_tokens

        index = len(self.requests)
        self.requests.append(request)
        text = json.dumps([request.system, request.messages, request.tools])
        input_tokens = -(-len(text.encode()) // 4)
        overrun = self.over == "all" or self.over == index
        if overrun:
            input_tokens = self.factor * (worst_input_tokens(request) + 5 * request.max_tokens)
        usage = Usage(input_tokens, 2)
        self.billed.append((request, usage))
        yield MessageStart(f"msg_{index}", MODEL, Usage(input_tokens, 1))
        await asyncio.sleep(self.over_delay_s if overrun else self.delay_s)
        yield TextDelta("done")
        yield MessageStop("end_turn", usage)


async def _ledger_total(srv: Any) -> Decimal:
    meter = srv.runtime.services.deps.meter
    records = await meter.ledger.list_usage("local", since_ms=now_ms() - 86_400_000, until_ms=now_ms() + 1)
    return sum((r.billed_cost for r in records), Decimal(0))


def _quota_refused(result: dict[str, Any]) -> bool:
    if result["status"] == "completed":
        return False
    assert result["status"] == "failed" and result["error"]["code"] == "quota_exceeded", result
    assert result["usage"] == Usage().to_wire() and Decimal(result["cost"]["billed"]) == 0
    return True


async def test_fifty_concurrent_turns_with_realistic_usage_stay_within_a_tiny_budget(tmp_path: Path) -> None:
    driver = MeteredDriver()
    async with in_process(tmp_path / "data", driver=driver, llm_model=MODEL) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=30) as http:
        # two holds' worth: a call costs about a sixteenth of its hold, so 50 of them do not fit
        budget = 2 * worst_cost(LLMRequest(MODEL, [{"role": "user", "content": "work 10"}], max_tokens=60),
                                markup=Decimal("1.05"), prices=None)
        assert (await http.put("/v1/budgets", json={"monthlyBudget": str(budget)})).status_code == 200
        results = await asyncio.gather(*(execute(http, f"work {i}") for i in range(50)))
        done = [r for r in results if not _quota_refused(r)]
        assert 1 <= len(done) < 50 and len(driver.requests) == len(done)
        while not _quota_refused(await execute(http, "work more")):
            pass
        report = (await http.get("/v1/budgets")).json()
        spent = Decimal(report["spent"])
        # exactly what the ledger's records add up to, and never past the budget
        assert spent == await _ledger_total(srv) <= budget and Decimal(report["reserved"]) == 0
        assert spent == sum((cost_of(u, MODEL).billed for _, u in driver.billed), Decimal(0))
        # every call's hold covered its cost
        for request, usage in driver.billed:
            assert cost_of(usage, MODEL).billed <= worst_cost(request, markup=Decimal("1.05"), prices=None)


async def test_an_upstream_billing_above_the_hold_overshoots_by_at_most_that_calls_excess(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    driver = MeteredDriver(over="all")
    async with in_process(tmp_path / "data", driver=driver, llm_model=MODEL) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=30) as http:
        probe = await execute(http, "work probe")  # no budget yet: learn one call's hold
        assert probe["status"] == "completed"
        hold = worst_cost(driver.requests[0], markup=Decimal("1.05"), prices=None)
        budget = (hold * Decimal("1.5")).quantize(Decimal("0.00000001"))  # one hold fits, two do not
        base = await _ledger_total(srv)
        assert (await http.put("/v1/budgets", json={"monthlyBudget": str(budget + base)})).status_code == 200
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="agentvm.services.metering"):
            results = await asyncio.gather(*(execute(http, f"work {i}") for i in range(50)))
            done = [r for r in results if not _quota_refused(r)]
            assert len(done) == 1  # one hold at a time fits; it overran, so none started after it
            calls = len(driver.requests)
            assert _quota_refused(await execute(http, "work after"))  # spent > budget: refused ...
            assert len(driver.requests) == calls  # ... before reaching the model
        [(request, usage)] = driver.billed[1:]
        billed = cost_of(usage, MODEL).billed
        excess = billed - worst_cost(request, markup=Decimal("1.05"), prices=None)
        assert excess > 0
        report = (await http.get("/v1/budgets")).json()
        spent = Decimal(report["spent"]) - base
        assert Decimal(report["spent"]) == await _ledger_total(srv)  # billed as reported
        assert spent == billed and 0 < spent - budget <= excess
        [line] = [r for r in caplog.records if r.getMessage().startswith("budget hold exceeded")]
        assert line.levelno == logging.WARNING and line.billed == money_text(billed)  # type: ignore[attr-defined]
        assert line.excess == money_text(excess)  # type: ignore[attr-defined]
        metrics = text_string_to_metric_families((await http.get("/metrics")).text)
        assert [(s.name, s.labels, s.value) for f in metrics if f.name == "avm_budget_overruns" for s in f.samples] == [
            ("avm_budget_overruns_total", {"model_family": "claude-sonnet"}, 1.0)]


async def test_one_overrun_among_concurrent_turns_overshoots_by_at_most_its_excess(tmp_path: Path) -> None:
    # the first call after the probe over-reports 20-fold; the others report realistic usage
    driver = MeteredDriver(over=1, factor=20, over_delay_s=1.0)
    async with in_process(tmp_path / "data", driver=driver, llm_model=MODEL) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=30) as http:
        assert (await execute(http, "work probe"))["status"] == "completed"
        base = await _ledger_total(srv)
        budget = 10 * worst_cost(driver.requests[0], markup=Decimal("1.05"), prices=None)  # ten holds fit
        assert (await http.put("/v1/budgets", json={"monthlyBudget": str(budget + base)})).status_code == 200
        results = await asyncio.gather(*(execute(http, f"work {i}") for i in range(50)))
        assert 2 <= len([r for r in results if not _quota_refused(r)]) < 50
        request, usage = driver.billed[1]
        excess = cost_of(usage, MODEL).billed - worst_cost(request, markup=Decimal("1.05"), prices=None)
        report = (await http.get("/v1/budgets")).json()
        spent = Decimal(report["spent"]) - base
        assert spent + base == await _ledger_total(srv) and Decimal(report["reserved"]) == 0
        assert spent > budget  # the overrun passed the budget: calls running then finished within their holds
        assert spent - budget <= excess
        calls = len(driver.requests)
        assert _quota_refused(await execute(http, "work after")) and len(driver.requests) == calls


def test_the_input_bound_per_block_type() -> None:
    from agentvm.drivers.token_bounds import IMAGE_TOKENS, TOOL_SYSTEM_TOKENS, context_window, worst_input_tokens

    def bound(content: Any, model: str = MODEL, **kw: Any) -> int:
        return worst_input_tokens(LLMRequest(model, [{"role": "user", "content": content}], max_tokens=10, **kw))

    base = bound([])
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}}
    # a PDF's pages are rendered by the provider: the whole context window (200k for Sonnet 4.5, 1M for 4.6)
    assert bound([pdf]) == context_window(MODEL) == 200_000
    assert bound([pdf], "claude-sonnet-4-6") == context_window("claude-sonnet-4-6") == 1_000_000
    assert bound([{**pdf, "source": {"type": "url", "url": "https://example.com/a.pdf"}}]) == 200_000
    # a plain-text document: its bytes
    text_doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x" * 5000}}
    assert 5000 < bound([text_doc]) - base < 5100
    # an image inside a tool result counts as an image; the result's text by its bytes
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [
        {"type": "text", "text": "ü" * 1000},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 10_000_000}}]}
    assert IMAGE_TOKENS + 2000 < bound([result]) - base < IMAGE_TOKENS + 2100
    # tools add their definitions and the tool-use system prompt
    tool = {"name": "bash", "description": "d" * 300, "input_schema": {"type": "object"}}
    assert TOOL_SYSTEM_TOKENS + 300 < bound([], tools=[tool]) - base < TOOL_SYSTEM_TOKENS + 400
    # never more than the context window
    assert bound("z" * 300_000) == 200_000
