"""The token API's HTTP edges on an in-process `avm serve`: a client that leaves mid-stream is still
billed (one record, status interrupted), and the token API's own body limit."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from agentvm.drivers.scripted import ScriptedDriver, parse_script
from agentvm.ids import now_ms
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
