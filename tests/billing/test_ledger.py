"""A scripted month of traffic through `avm serve`: the ledger equals the provider-reported tokens ×
list price × 1.05 to the cent (cache tokens, tool loops and failed turns included), every total
agrees (turns, ledger records, budgets' spent counter, /v1/usage, both exports), and each LLM call
is one idempotent record."""

from __future__ import annotations

import csv
import io
from collections import Counter
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import httpx
import orjson

from agentvm.domain.models import Usage
from agentvm.domain.usage import period_of
from agentvm.drivers.scripted import ScriptedDriver, parse_script
from agentvm.ids import now_ms
from agentvm.money import MILLION, price_for
from tests.support.focus import assert_valid_focus
from tests.support.servers import in_process

SCRIPT = """
rules:
  - match: "^sonnet"
    responses:
      - {model: claude-sonnet-4-5-20250929, text: ["Sure."],
         usage: {input_tokens: 1200, output_tokens: 340, cache_read_tokens: 5000, cache_write_tokens: 800}}
  - match: "^haiku"
    responses:
      - {model: claude-haiku-4-5, text: ["Yes."], usage: {input_tokens: 301, output_tokens: 45}}
  - match: "^opus"
    responses:
      - {model: claude-opus-4-1, text: ["Well."],
         usage: {input_tokens: 2000, output_tokens: 901, cache_write_tokens: 10007}}
  - match: "^tools"
    responses:
      - model: claude-sonnet-4-5
        text: ["Checking."]
        tool_calls: [{id: toolu_1, name: Bash, input: {command: ls}, result: "a.txt"}]
        usage: {input_tokens: 900, output_tokens: 77, cache_read_tokens: 333}
      - {model: claude-sonnet-4-5, text: ["One file."], usage: {input_tokens: 1010, output_tokens: 12}}
  - match: "^fails"
    responses:
      - model: claude-sonnet-4-5
        text: ["partial ", "answer"]
        usage: {input_tokens: 777, output_tokens: 999}
        error: {code: overloaded_error, message: Overloaded, after_chunks: 1}
  - match: "^refused"
    responses:
      - error: {code: rate_limit_error, message: Rate limit exceeded}
"""
# what the provider reported for each call of each kind of turn; a stream cut after its start has
# reported the input tokens and 1 output token (Anthropic's message_start), and the output streamed
# before the cut ("partial ", 8 bytes) is billed on top, one token per byte, marked estimated
REPORTED: dict[str, list[tuple[str, Usage]]] = {
    "sonnet": [("claude-sonnet-4-5-20250929", Usage(1200, 340, 5000, 800))],
    "haiku": [("claude-haiku-4-5", Usage(301, 45))],
    "opus": [("claude-opus-4-1", Usage(2000, 901, 0, 10007))],
    "tools": [("claude-sonnet-4-5", Usage(900, 77, 333)), ("claude-sonnet-4-5", Usage(1010, 12))],
    "fails": [("claude-sonnet-4-5", Usage(777, 1 + 8))],
    "refused": [],
}
TRAFFIC = {"sonnet": 7, "haiku": 11, "opus": 3, "tools": 4, "fails": 2, "refused": 2}
CENT = Decimal("0.01")


def expected_billed() -> Decimal:
    """Σ tokens × list price × 1.05, straight from the price table, rounded once at the end."""
    total = Decimal(0)
    for kind, n in TRAFFIC.items():
        for model, u in REPORTED[kind]:
            p = price_for(model)
            total += n * (u.input_tokens * p.input + u.output_tokens * p.output
                          + u.cache_read_tokens * p.cache_read + u.cache_write_tokens * p.cache_write)
    return total / MILLION * Decimal("1.05")


def cents(d: Decimal) -> Decimal:
    return d.quantize(CENT, rounding=ROUND_HALF_UP)


async def test_a_month_of_traffic_bills_reported_tokens_at_list_price_times_markup(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver(parse_script(SCRIPT))) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=30) as http:
        statuses: Counter[str] = Counter()
        turn_billed = Decimal(0)
        for kind, n in TRAFFIC.items():
            for i in range(n):
                r = (await http.post("/api/v1/agents/chat_basic/execute", json={"task": f"{kind} {i}"})).json()
                statuses[f"{kind}:{r['status']}"] += 1
                turn_billed += Decimal(r["cost"]["billed"])  # what turn_response / `done` told the user
        assert statuses == Counter({"sonnet:completed": 7, "haiku:completed": 11, "opus:completed": 3,
                                    "tools:completed": 4, "fails:failed": 2, "refused:failed": 2})
        period = period_of(now_ms())
        ledger = srv.runtime.services.deps.meter
        assert ledger is not None
        records = await ledger.ledger.list_usage("local", since_ms=now_ms() - 86_400_000, until_ms=now_ms() + 1)
        calls = sum(n * len(REPORTED[k]) for k, n in TRAFFIC.items())
        assert len(records) == calls == 7 + 11 + 3 + 8 + 2  # one record per LLM call that reported usage
        assert len({r.record_id for r in records}) == calls
        assert Counter(r.status for r in records) == Counter({"completed": 29, "failed": 2})
        ledger_billed = sum((r.billed_cost for r in records), Decimal(0))
        ledger_list = sum((r.list_cost for r in records), Decimal(0))

        expected = expected_billed()
        assert cents(ledger_billed) == cents(expected) == Decimal("1.04")
        assert abs(ledger_billed - expected) <= Decimal("0.00000001") * calls  # each record rounds to 1e-8
        assert cents(ledger_list * Decimal("1.05")) == cents(expected)
        assert cents(turn_billed) == cents(expected)

        budgets = (await http.get("/v1/budgets")).json()
        assert Decimal(budgets["spent"]) == ledger_billed and budgets["period"] == period
        usage = (await http.get("/v1/usage", params={"period": period, "groupBy": "model"})).json()
        assert Decimal(usage["total"]["billedCost"]) == ledger_billed
        assert usage["total"]["usage"] == {"inputTokens": 7 * 1200 + 11 * 301 + 3 * 2000 + 4 * 1910 + 2 * 777,
                                           "outputTokens": 7 * 340 + 11 * 45 + 3 * 901 + 4 * 89 + 2 * 9,
                                           "cacheReadTokens": 7 * 5000 + 4 * 333,
                                           "cacheWriteTokens": 7 * 800 + 3 * 10007}
        assert [row["model"] for row in usage["rows"]] == [
            "claude-haiku-4-5", "claude-opus-4-1", "claude-sonnet-4-5", "claude-sonnet-4-5-20250929"]
        # a range wider than a year is refused: each of its months is a ledger read on DynamoDB
        year = 366 * 86_400_000
        assert (await http.get("/v1/usage", params={"since": now_ms() - year, "until": now_ms()})).status_code == 200
        wide = await http.get("/v1/usage", params={"since": 0})
        assert (wide.status_code, wide.json()) == (400, {"error": {
            "code": "invalid_request", "field": "since", "message": "since: a range of at most 366 days (ask one "
            "year at a time, or export months with /v1/usage/export)"}})

        jsonl = await http.get("/v1/usage/export", params={"period": period, "format": "jsonl"})
        lines = [orjson.loads(line) for line in jsonl.text.splitlines()]
        assert len(lines) == calls and sum(Decimal(x["billedCost"]) for x in lines) == ledger_billed
        assert [x["status"] for x in lines if x["estimated"]] == ["failed", "failed"]

        focus = await http.get("/v1/usage/export", params={"period": period})
        assert focus.status_code == 200 and focus.headers["content-type"].startswith("text/csv")
        assert focus.headers["content-disposition"] == f'attachment; filename="agentvm-usage-{period}.csv"'
        rows = assert_valid_focus(focus.text, tmp_path / "focus.csv")
        assert sum(Decimal(r["BilledCost"]) for r in rows) == ledger_billed
        assert sum(Decimal(r["ListCost"]) for r in rows) == ledger_list
        assert {r["BillingAccountId"] for r in rows} == {"local"}
        estimated = {orjson.loads(r["Tags"])["agentvm/turn"] for r in rows
                     if orjson.loads(r["Tags"]).get("agentvm/usage-estimated") == "true"}
        assert estimated == {x["turnId"] for x in lines if x["estimated"]} and len(estimated) == 2


async def test_configured_prices_replace_the_shipped_rows_for_the_next_turn(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", driver=ScriptedDriver(parse_script(SCRIPT))) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=30) as http:
        shipped = (await http.get("/v1/config/billing.prices")).json()
        assert shipped["value"]["claude-sonnet-4"] == {"input": "3", "output": "15", "cacheWrite": "3.75",
                                                       "cacheRead": "0.30"}
        bad = await http.put("/v1/config/billing.prices", json={"value": {"claude-sonnet-4": {"input": "x"}}})
        assert bad.status_code == 400 and bad.json()["error"]["message"] == (
            "billing.prices: claude-sonnet-4: needs exactly input, output, cacheWrite and cacheRead")
        bad = await http.put("/v1/config/billing.prices", json={"value": {"claude-sonnet-4": {
            "input": "-1", "output": "1", "cacheWrite": "1", "cacheRead": "1"}}})
        assert bad.json()["error"]["message"] == "billing.prices: claude-sonnet-4.input: must be zero or more"
        ok = await http.put("/v1/config/billing.prices", json={"value": {"claude-sonnet-4": {
            "input": "6", "output": "30", "cacheWrite": "7.5", "cacheRead": "0.6"}}})
        assert ok.status_code == 200, ok.text
        r = (await http.post("/api/v1/agents/chat_basic/execute", json={"task": "haiku"})).json()
        assert r["cost"] == {"list": "0.00052600", "billed": "0.00055230", "currency": "USD"}  # shipped row
        r = (await http.post("/api/v1/agents/chat_basic/execute", json={"task": "tools"})).json()
        # (900 × 6 + 77 × 30 + 333 × 0.6 + 1010 × 6 + 12 × 30) / 1e6 = 0.0143298; × 1.05
        assert r["cost"] == {"list": "0.01432980", "billed": "0.01504629", "currency": "USD"}


TOOL_SCRIPT = """
rules:
  - match: "^list"
    responses:
      - model: claude-haiku-4-5
        text: ["Looking."]
        tool_calls: [{id: toolu_ls, name: bash, input: {command: "ls"}}]
        usage: {input_tokens: 400, output_tokens: 30}
      - {model: claude-haiku-4-5, text: ["Three folders."], usage: {input_tokens: 520, output_tokens: 6}}
"""


async def test_a_container_tier_turn_records_its_calls_and_its_free_sandbox_time(tmp_path: Path) -> None:
    from tests.support.stock_client import StockClient

    async with in_process(tmp_path / "data", driver=ScriptedDriver(parse_script(TOOL_SCRIPT))) as srv, \
            StockClient(srv.url) as client, httpx.AsyncClient(base_url=srv.http, timeout=30) as http:
        image = await client.new_image("c-tools", tools=["bash"])
        events = await client.turn(image["imageId"], "list the workspace")
        done = events[-1]["data"]
        assert (done["status"], done["tier"]) == ("completed", "container")
        meter = srv.runtime.services.deps.meter
        assert meter is not None
        records = await meter.ledger.list_usage("local", since_ms=now_ms() - 86_400_000, until_ms=now_ms() + 1)
        llm = [r for r in records if r.kind == "llm"]
        [sandbox] = [r for r in records if r.kind == "sandbox"]
        # the first call ran in the function tier and escalated; the second in the container tier
        assert [(r.record_id.split("#", 1)[1], r.tier, r.usage) for r in llm] == [
            ("llm#1", "function", Usage(400, 30)), ("llm#2", "container", Usage(520, 6))]
        assert (sandbox.record_id, sandbox.billed_cost, sandbox.tier) == (f"{done['turnId']}#sandbox", 0, "container")
        assert 0 <= sandbox.sandbox_ms <= done["durationMs"]
        assert Decimal(done["cost"]["billed"]) == sum(r.billed_cost for r in llm)
        focus = await http.get("/v1/usage/export", params={"period": period_of(now_ms())})
        rows = list(csv.DictReader(io.StringIO(focus.text)))
        [seconds] = [r for r in rows if r["ConsumedUnit"] == "Seconds"]
        assert (seconds["SkuId"], Decimal(seconds["BilledCost"])) == ("agentvm/sandbox/container-time", 0)


async def test_prices_from_the_config_file_are_a_nested_mapping(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("billing:\n  prices:\n    claude-haiku-4:\n      input: 2\n      output: '10'\n"
                      "      cacheWrite: 2.5\n      cacheRead: 0.2\n")
    async with in_process(tmp_path / "data", driver=ScriptedDriver(parse_script(SCRIPT)), config_file=config) as srv, \
            httpx.AsyncClient(base_url=srv.http, timeout=30) as http:
        got = (await http.get("/v1/config/billing.prices")).json()
        assert got["source"] == "file" and got["value"] == {
            "claude-haiku-4": {"input": "2", "output": "10", "cacheWrite": "2.5", "cacheRead": "0.2"}}
        r = (await http.post("/api/v1/agents/chat_basic/execute", json={"task": "haiku"})).json()
        # (301 × 2 + 45 × 10) / 1e6 = 0.001052; × 1.05
        assert r["cost"] == {"list": "0.00105200", "billed": "0.00110460", "currency": "USD"}
