"""The token API over a configured OpenAI-compatible provider (`llm.providers`), against a fake upstream
speaking the real Chat Completions stream: an Anthropic-SDK client calls an OpenAI-compatible model, and
an OpenAI-SDK client streams from it; the key is read from the named variable, and the call is billed at
the configured list prices × 1.05 exactly (docs/token-api.md, docs/providers.md)."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.fakes import fake_openai as oa
from tests.fakes.http_stub import StubServer
from tests.support.servers import ServeProcess, serve

pytestmark = pytest.mark.e2e

PRICES = {"input": "0.27", "output": "1.10", "cacheRead": "0.07", "cacheWrite": "0.27", "maxOutput": 8192}


@pytest.fixture(scope="module")
def upstream() -> Iterator[StubServer]:
    with StubServer() as server:
        yield server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, upstream: StubServer) -> Iterator[ServeProcess]:
    data: Path = tmp_path_factory.mktemp("providers") / "data"
    with serve(data, env={"AVM_TEST_DEEPSEEK_KEY": "sk-upstream-secret"}) as srv:
        entry = {"deepseek": {"type": "openai", "baseUrl": f"{upstream.base_url}/v1",
                              "apiKeyEnv": "AVM_TEST_DEEPSEEK_KEY", "models": {"deepseek-chat": PRICES}}}
        put = httpx.put(f"{srv.http}/v1/config/llm.providers", json={"value": entry})
        assert put.status_code == 200, put.text
        yield srv


def test_an_anthropic_sdk_client_calls_an_openai_compatible_model(server: ServeProcess, upstream: StubServer) -> None:
    upstream.enqueue(oa.text_reply(["Bonjour", " le monde"], prompt=1200, completion=300))
    client = anthropic.Anthropic(base_url=server.http, api_key="k", max_retries=0)
    done = client.messages.create(model="deepseek/deepseek-chat", max_tokens=100, system="Answer in French.",
                                  messages=[{"role": "user", "content": "say hello"}])
    assert [b.text for b in done.content if b.type == "text"] == ["Bonjour le monde"]
    assert (done.usage.input_tokens, done.usage.output_tokens, done.stop_reason) == (1200, 300, "end_turn")
    billed = (1200 * Decimal("0.27") + 300 * Decimal("1.10")) / 1_000_000 * Decimal("1.05")
    assert billed == Decimal("0.0006867")
    assert done.usage.model_extra is not None and done.usage.model_extra["cost"] == "0.00068670"
    # what reached the upstream: its own model name and wire format, the key from the named variable
    sent = upstream.requests[-1]
    assert (sent.path, sent.headers["authorization"]) == ("/v1/chat/completions", "Bearer sk-upstream-secret")
    assert sent.json["model"] == "deepseek-chat" and sent.json["stream"] is True
    assert sent.json["messages"] == [{"role": "system", "content": "Answer in French."},
                                     {"role": "user", "content": "say hello"}]


def test_an_openai_sdk_client_streams_from_it(server: ServeProcess, upstream: StubServer) -> None:
    upstream.enqueue(oa.text_reply(["one", " two", " three"], prompt=10, completion=3))
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key="k", max_retries=0)
    chunks = list(client.chat.completions.create(model="deepseek/deepseek-chat", stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": "count"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three"
    last = chunks[-1]
    assert last.usage is not None and (last.usage.prompt_tokens, last.usage.completion_tokens) == (10, 3)
    assert last.usage.model_extra == {"cost": "0.00000630"}  # (10 × 0.27 + 3 × 1.10) / 1e6 × 1.05
