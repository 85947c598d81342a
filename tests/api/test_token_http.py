"""The token API's HTTP edges on an in-process `avm serve`: a client that leaves mid-stream is still
billed (one record, status interrupted), the token API's own body limit, and a configured provider's
model billed at its list price and exported with it."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import time
from pathlib import Path

import httpx
import pytest

from agentvm.drivers.scripted import ScriptedDriver, parse_script
from agentvm.ids import now_ms
from tests.fakes import fake_openai as oa
from tests.fakes.http_stub import StubServer
from tests.support.servers import in_process

SLOW = """
rules:
  - match: slow
    responses:
      - text: "one two three four five six seven eight nine ten"
        delay_ms: 150
        usage: {input_tokens: 12, output_tokens: 30}
"""


async def test_a_client_that_leaves_mid_stream_is_billed_once_as_interrupted(tmp_path: Path) -> None:
    driver = ScriptedDriver(parse_script(SLOW))
    async with in_process(tmp_path / "data", driver=driver) as srv, httpx.AsyncClient(base_url=srv.http) as http:
        for path, body in (("/v1/chat/completions", {"model": "scripted/echo", "stream": True}),
                           ("/v1/messages", {"model": "scripted/echo", "stream": True, "max_tokens": 100})):
            async with http.stream("POST", path, json={**body, "messages": [{"role": "user", "content": "slow"}]}) as r:
                assert r.status_code == 200
                call = r.headers["x-agentvm-call-id"]
                async for line in r.aiter_lines():
                    if "one" in line:
                        break  # the client leaves after the first word
            records: list[dict[str, object]] = []
            for _ in range(100):
                ledger = srv.runtime.services.deps.meter.ledger  # type: ignore[union-attr]
                found = await ledger.list_usage(None, since_ms=now_ms() - 86_400_000, until_ms=now_ms() + 1000)
                records = [r.to_wire() for r in found if r.turn_id == call]
                if records:
                    break
                await asyncio.sleep(0.05)
            assert len(records) == 1, (path, records)
            [record] = records
            assert (record["status"], record["provider"], record["tier"]) == ("interrupted", "scripted", "api")
            assert record["usage"]["inputTokens"] == 12  # type: ignore[index]
            reserved = (await http.get("/v1/budgets")).json()["reserved"]
            assert reserved == "0"


async def test_the_token_api_has_its_own_body_limit(tmp_path: Path) -> None:
    async with in_process(tmp_path / "data", token_api_max_body_bytes=4096, http_max_body_bytes=2048) as srv, \
            httpx.AsyncClient(base_url=srv.http) as http:
        text = "x" * 3000  # over the management API's limit, under the token API's
        ok = await http.post("/v1/chat/completions", json={"model": "scripted/echo",
                                                           "messages": [{"role": "user", "content": text}]})
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == f"You said: {text}"
        too_big = {"model": "scripted/echo", "max_tokens": 5, "messages": [{"role": "user", "content": "y" * 5000}]}
        big = await http.post("/v1/messages", content=json.dumps(too_big), headers={"content-type": "application/json"})
        assert big.status_code == 413
        assert big.json()["error"]["message"] == ("body: larger than this server's limit of 4096 bytes for the token "
                                                  "API (AVM_TOKEN_API_MAX_BODY_BYTES)")
        other = await http.post("/v1/resources", content=b"{" + b" " * 3000 + b"}",
                                headers={"content-type": "application/json"})
        assert other.status_code == 413


async def test_a_configured_openai_model_is_billed_at_its_list_price_and_exported_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model of an openai-type provider configured with gpt-4o-mini's list prices (a stub is no
    api.openai.com: the shipped table does not price it), called through the token API against a stub
    speaking OpenAI's stream: the usage record keeps the prices it was billed at, and `/v1/usage` and the
    FOCUS export show them and the exact totals."""
    monkeypatch.setenv("AVM_TEST_OA_KEY", "sk-test-Jf72")
    with StubServer() as upstream:
        upstream.enqueue(oa.text_reply(["Hel", "lo"], prompt=1200, completion=7, cached=1024))
        async with in_process(tmp_path / "data") as srv, httpx.AsyncClient(base_url=srv.http) as http:
            providers = {"oa": {"type": "openai", "baseUrl": upstream.base_url + "/v1", "apiKeyEnv": "AVM_TEST_OA_KEY",
                                "models": {"gpt-4o-mini": {"input": "0.15", "output": "0.60", "cacheRead": "0.075",
                                                           "cacheWrite": "0.15"}}}}
            assert (await http.put("/v1/config/llm.providers", json={"value": providers})).status_code == 200
            res = await http.post("/v1/chat/completions", json={"model": "oa/gpt-4o-mini",
                                                                "messages": [{"role": "user", "content": "Hi"}]})
            assert res.status_code == 200, res.text
            assert res.json()["choices"][0]["message"]["content"] == "Hello"
            period = time.strftime("%Y-%m", time.gmtime())
            totals = (await http.get("/v1/usage", params={"period": period, "groupBy": "model"})).json()
            jsonl = (await http.get("/v1/usage/export", params={"period": period, "format": "jsonl"})).text
            focus = (await http.get("/v1/usage/export", params={"period": period, "format": "focus"})).text
    # 176 input × 0.15 + 7 output × 0.60 + 1024 cache read × 0.075 = 107.4 per million; × 1.05 = 112.77
    [record] = [json.loads(line) for line in jsonl.splitlines()]
    assert (record["provider"], record["model"], record["usage"], record["listCost"], record["billedCost"],
            record["estimated"]) == ("oa", "oa/gpt-4o-mini",
                                     {"inputTokens": 176, "outputTokens": 7, "cacheReadTokens": 1024,
                                      "cacheWriteTokens": 0}, "0.00010740", "0.00011277", False)
    assert record["prices"] == {"input": "0.15", "output": "0.60", "cacheWrite": "0.15", "cacheRead": "0.075",
                                "markup": "1.05"}
    assert [(g["model"], g["calls"], g["listCost"], g["billedCost"]) for g in totals["rows"]] == [
        ("oa/gpt-4o-mini", 1, "0.00010740", "0.00011277")]
    rows = list(csv.DictReader(io.StringIO(focus)))
    columns = ("SkuId", "PublisherName", "ConsumedQuantity", "PricingQuantity", "ListUnitPrice",
               "ContractedUnitPrice", "ListCost", "BilledCost", "ChargeDescription")
    assert [tuple(r[c] for c in columns) for r in rows] == [
        ("oa/gpt-4o-mini/input", "oa", "176.0", "0.000176", "0.15", "0.1575", "0.00002640", "0.00002772",
         "gpt-4o-mini input tokens (oa) at 0.15 USD per 1M tokens list price"),
        ("oa/gpt-4o-mini/output", "oa", "7.0", "0.000007", "0.60", "0.6300", "0.00000420", "0.00000441",
         "gpt-4o-mini output tokens (oa) at 0.60 USD per 1M tokens list price"),
        ("oa/gpt-4o-mini/cache-read", "oa", "1024.0", "0.001024", "0.075", "0.07875", "0.00007680", "0.00008064",
         "gpt-4o-mini cache-read tokens (oa) at 0.075 USD per 1M tokens list price"),
    ]
