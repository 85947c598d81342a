"""The token API (docs/token-api.md) against a real `avm serve` process, with the official `openai`
and `anthropic` SDKs as clients: offline over the scripted model, and over the Anthropic driver
against the fake Anthropic upstream (its real wire format), metered and billed."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.fakes.fake_anthropic import ErrorReply, FakeAnthropic, FakeUsage, Reply, Text, ToolUse
from tests.support.servers import REPO, ServeProcess, serve

pytestmark = pytest.mark.e2e

# 1×1 transparent PNG
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082")).decode()
HAIKU = "anthropic/claude-haiku-4-5"


def avm(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "avm.cli", *argv], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def create_key(data: Path, tenant: str, *scopes: str) -> str:
    args = [a for s in scopes for a in ("--scope", s)]
    out = avm("keys", "create", "--tenant", tenant, "--data-dir", str(data), *args)
    return out.split("token (shown once, keep it secret): ")[1].split()[0]


# ---- offline: no key configured ------------------------------------------------------------------

@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with serve(tmp_path_factory.mktemp("offline") / "data") as srv:
        yield srv


def test_without_a_key_the_models_list_the_scripted_model_and_the_openai_sdk_streams_from_it(
        offline: ServeProcess) -> None:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{offline.port}/v1", api_key="anything")
    assert [m.id for m in client.models.list()] == ["scripted/echo"]
    stream = client.chat.completions.create(model="scripted/echo", stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "hello there"}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "You said: hello there"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens > 0
    assert last.usage.model_extra == {"cost": "0.00000000"}  # the scripted model is free
    # not streamed; the bare alias `scripted` is the same model
    done = client.chat.completions.create(model="scripted", messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "once more"}])
    assert done.choices[0].message.content == "You said: once more" and done.model == "scripted/echo"


def test_the_anthropic_sdk_over_the_scripted_model_and_the_exact_stream_event_names(offline: ServeProcess) -> None:
    client = anthropic.Anthropic(base_url=offline.http, api_key="anything")
    message = client.messages.create(model="scripted/echo", max_tokens=64,
                                     messages=[{"role": "user", "content": "ping"}])
    assert message.content[0].type == "text" and message.content[0].text == "You said: ping"
    with client.messages.stream(model="scripted/echo", max_tokens=64,
                                messages=[{"role": "user", "content": "stream this"}]) as stream:
        assert "".join(stream.text_stream) == "You said: stream this"
        assert stream.get_final_message().stop_reason == "end_turn"
    with httpx.stream("POST", f"{offline.http}/v1/messages", json={
            "model": "scripted/echo", "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": "a b"}]}) as raw:
        names = [line.removeprefix("event: ") for line in raw.iter_lines() if line.startswith("event: ")]
    assert names == ["message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_delta", "content_block_delta", "content_block_stop", "message_delta",
                     "message_stop"]
    counted = client.messages.count_tokens(model="scripted/echo", messages=[{"role": "user", "content": "x" * 400}])
    assert 100 <= counted.input_tokens <= 120


def test_the_responses_api_answers_and_streams_its_events(offline: ServeProcess) -> None:
    client = openai.OpenAI(base_url=f"{offline.http}/v1", api_key="anything", max_retries=0)
    done = client.responses.create(model="scripted/echo", instructions="be brief", input="hi there")
    assert (done.status, done.output_text, done.model) == ("completed", "You said: hi there", "scripted/echo")
    assert done.usage is not None and done.usage.model_extra == {"cost": "0.00000000"}
    events = list(client.responses.create(model="scripted/echo", stream=True, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "a b"}]}]))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * 4, "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    with client.responses.stream(model="scripted/echo", input="the helper") as stream:
        assert stream.get_final_response().output_text == "You said: the helper"
    with pytest.raises(openai.BadRequestError) as stateful:
        client.responses.create(model="scripted/echo", input="x", previous_response_id="resp_1")
    assert stateful.value.param == "previous_response_id"


def test_one_config_entry_adds_a_provider_and_its_priced_models_to_the_catalog(offline: ServeProcess) -> None:
    entry = {"deepseek": {"type": "openai", "baseUrl": "http://127.0.0.1:9/v1", "apiKeyEnv": "AVM_TEST_UNSET_KEY",
                          "models": {"deepseek-chat": {"input": "0.27", "output": "1.10", "cacheRead": "0.07",
                                                       "cacheWrite": "0.27", "maxOutput": 8192}}}}
    put = httpx.put(f"{offline.http}/v1/config/llm.providers", json={"value": entry})
    assert put.status_code == 200, put.text
    try:
        client = openai.OpenAI(base_url=f"{offline.http}/v1", api_key="k", max_retries=0)
        models = {m.id: m for m in client.models.list()}
        assert list(models) == ["scripted/echo", "deepseek/deepseek-chat"]
        assert models["deepseek/deepseek-chat"].owned_by == "deepseek"
        assert models["deepseek/deepseek-chat"].model_extra["pricing"]["output"] == "1.10"  # type: ignore[index]
        # its key's variable is not set on this server: refused naming the provider and the variable
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="deepseek/deepseek-chat", messages=[{"role": "user", "content": "x"}])
        assert refused.value.status_code == 503
        assert refused.value.body["message"] == (  # type: ignore[index]
            "model: provider deepseek's key (AVM_TEST_UNSET_KEY) is not set")
    finally:
        httpx.delete(f"{offline.http}/v1/config/llm.providers")
    assert [m.id for m in openai.OpenAI(base_url=f"{offline.http}/v1", api_key="k").models.list()] == ["scripted/echo"]


def test_errors_raise_the_sdks_own_exception_types(offline: ServeProcess) -> None:
    oa = openai.OpenAI(base_url=f"{offline.http}/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.NotFoundError) as missing:
        oa.chat.completions.create(model="nobody/nothing", messages=[{"role": "user", "content": "x"}])
    assert missing.value.body == {"message": "model: nobody/nothing is not in this server's catalog (GET /v1/models "
                                             "lists: scripted/echo)", "type": "invalid_request_error",
                                  "param": "model", "code": "model_not_found"}
    with pytest.raises(openai.BadRequestError) as two:
        oa.chat.completions.create(model="scripted/echo", n=2, messages=[{"role": "user", "content": "x"}])
    assert two.value.param == "n" and two.value.body["message"] == "n: only 1 is supported"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad_part:
        oa.chat.completions.create(model="scripted/echo", messages=[
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}])
    assert bad_part.value.param == "messages[0].content[0]"
    an = anthropic.Anthropic(base_url=offline.http, api_key="k", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as gone:
        an.messages.create(model="nobody/nothing", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert gone.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as think:
        an.messages.create(model="scripted/echo", max_tokens=5, messages=[{"role": "user", "content": "x"}],
                           thinking={"type": "enabled", "budget_tokens": 1024})
    assert think.value.body == {"type": "error", "error": {  # type: ignore[comparison-overlap]
        "type": "invalid_request_error",
        "message": "thinking: not supported by this server (docs/token-api.md lists what is passed through)"}}


# ---- over the Anthropic driver, against the fake Anthropic API ----------------------------------

@pytest.fixture(scope="module")
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(api_key="upstream-key") as server:
        yield server


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, fake: FakeAnthropic) -> Iterator[tuple[ServeProcess, str, str]]:
    data = tmp_path_factory.mktemp("keyed") / "data"
    user, admin = create_key(data, "acme"), create_key(data, "acme", "admin")
    env = {"AVM_AUTH": "keys", "LLM_API_KEY": "upstream-key", "AVM_LLM_BASE_URL": fake.base_url,
           "AVM_LLM_MAX_RETRIES": "0"}
    with serve(data, env=env) as srv:
        yield srv, user, admin


@pytest.fixture
def srv(keyed: tuple[ServeProcess, str, str], fake: FakeAnthropic) -> tuple[ServeProcess, str, str]:
    fake.reset()
    return keyed


def period(srv: ServeProcess, admin: str) -> str:
    return str(httpx.get(f"{srv.http}/v1/budgets", headers={"authorization": f"Bearer {admin}"}).json()["period"])


def usage_records(srv: ServeProcess, admin: str) -> list[dict[str, object]]:
    export = httpx.get(f"{srv.http}/v1/usage/export", params={"period": period(srv, admin), "format": "jsonl"},
                       headers={"authorization": f"Bearer {admin}"})
    assert export.status_code == 200, export.text
    return [json.loads(line) for line in export.text.splitlines() if line.strip()]


def test_a_priced_call_is_billed_at_list_times_1_05_exactly_and_recorded_once(
        srv: tuple[ServeProcess, str, str], fake: FakeAnthropic) -> None:
    server, user, admin = srv
    usage = FakeUsage(input_tokens=1000, output_tokens=200, cache_read_input_tokens=3000,
                      cache_creation_input_tokens=400)
    fake.enqueue(Reply([Text(["Bonjour", " !"])], usage=usage))
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=user, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=HAIKU, max_tokens=300, messages=[{"role": "user", "content": "say hi"}])
    done = raw.parse()
    # Haiku 4.5 list prices, USD per million tokens: input 1, output 5, cache read 0.10, cache write 1.25
    list_cost = (1000 * Decimal(1) + 200 * Decimal(5) + 3000 * Decimal("0.10") + 400 * Decimal("1.25")) / 1_000_000
    billed = list_cost * Decimal("1.05")
    assert billed == Decimal("0.00294")
    assert done.choices[0].message.content == "Bonjour !"
    assert done.usage is not None and done.usage.model_extra == {"cost": "0.00294000"}
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (4400, 200)
    assert raw.headers["x-agentvm-cost-usd"] == "0.00294000"
    sent = fake.last_request
    assert (sent.body["model"], sent.body["max_tokens"], sent.api_key) == ("claude-haiku-4-5", 300, "upstream-key")
    assert sent.body["stream"] is False  # a non-streamed request: one message from upstream, not its stream
    call = raw.headers["x-agentvm-call-id"]
    [record] = [r for r in usage_records(server, admin) if r["turnId"] == call]
    assert (record["provider"], record["model"], record["tier"], record["status"]) == (
        "anthropic", "claude-haiku-4-5", "api", "completed")
    assert (record["listCost"], record["billedCost"]) == ("0.00280000", "0.00294000")
    focus = httpx.get(f"{server.http}/v1/usage/export", params={"period": period(server, admin)},
                      headers={"authorization": f"Bearer {admin}"}).text
    rows = [line for line in focus.splitlines() if call in line]
    assert len(rows) == 4 and all("anthropic/claude-haiku-4/" in row for row in rows)


def test_a_tool_call_round_trip_and_an_image_through_the_openai_sdk(
        srv: tuple[ServeProcess, str, str], fake: FakeAnthropic) -> None:
    server, user, _ = srv
    fake.enqueue(Reply([Text("Let me look."), ToolUse("toolu_w1", "weather", {"city": "Oslo"})],
                       stop_reason="tool_use"),
                 Reply([Text("It is sunny in Oslo.")]))
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=user, max_retries=0)
    tools = [{"type": "function", "function": {"name": "weather", "description": "the weather of a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    messages: list[dict[str, object]] = [{"role": "user", "content": [
        {"type": "text", "text": "weather in the city of this picture?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}]
    first = client.chat.completions.create(model=HAIKU, messages=messages, tools=tools,  # type: ignore[arg-type]
                                           tool_choice="required")
    assert first.choices[0].finish_reason == "tool_calls"
    [call] = first.choices[0].message.tool_calls or []
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (  # type: ignore[union-attr]
        "toolu_w1", "weather", {"city": "Oslo"})
    sent = fake.requests[0].body
    assert sent["tools"] == [{"name": "weather", "input_schema": tools[0]["function"]["parameters"],  # type: ignore[index]
                              "description": "the weather of a city"}]
    assert sent["tool_choice"] == {"type": "any"}
    assert sent["messages"][0]["content"][1] == {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": PNG}}
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": "toolu_w1", "content": "sunny, 21 °C"}]
    # streamed this time: the answer after the tool result
    stream = client.chat.completions.create(model=HAIKU, messages=messages, tools=tools,  # type: ignore[arg-type]
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "It is sunny in Oslo."
    assert (fake.requests[0].body["stream"], fake.requests[1].body["stream"]) == (False, True)
    second = fake.requests[1].body["messages"]
    assert second[1] == {"role": "assistant", "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_w1", "name": "weather", "input": {"city": "Oslo"}}]}
    assert second[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_w1", "content": "sunny, 21 °C"}]}


def test_a_function_call_round_trip_through_the_responses_api(srv: tuple[ServeProcess, str, str],
                                                              fake: FakeAnthropic) -> None:
    server, user, _ = srv
    fake.enqueue(Reply([ToolUse("toolu_r1", "weather", {"city": "Bergen"})], stop_reason="tool_use"),
                 Reply([Text(["Rain", " in Bergen."])]))
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=user, max_retries=0)
    tools = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
    first = client.responses.create(model=HAIKU, input="weather in Bergen?", tools=tools)  # type: ignore[arg-type]
    [call] = first.output
    assert (call.type, call.call_id, call.name, json.loads(call.arguments)) == (  # type: ignore[union-attr]
        "function_call", "toolu_r1", "weather", {"city": "Bergen"})
    events = list(client.responses.create(model=HAIKU, stream=True, tools=tools, input=[  # type: ignore[arg-type]
        {"role": "user", "content": "weather in Bergen?"},
        {"type": "function_call", "call_id": "toolu_r1", "name": "weather", "arguments": call.arguments},  # type: ignore[union-attr]
        {"type": "function_call_output", "call_id": "toolu_r1", "output": "rain"}]))
    final = events[-1]
    assert final.type == "response.completed" and final.response.output_text == "Rain in Bergen."  # type: ignore[union-attr]
    assert fake.requests[1].body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "weather in Bergen?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_r1", "name": "weather",
                                           "input": {"city": "Bergen"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_r1", "content": "rain"}]}]


def test_a_streamed_openai_tool_call_arrives_in_pieces(srv: tuple[ServeProcess, str, str],
                                                       fake: FakeAnthropic) -> None:
    server, user, _ = srv
    fake.enqueue(Reply([ToolUse("toolu_s1", "lookup", {"query": "tides of Bergen"}, chunks=3)],
                       stop_reason="tool_use"))
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=user, max_retries=0)
    chunks = list(client.chat.completions.create(
        model=HAIKU, stream=True, messages=[{"role": "user", "content": "tides?"}],
        tools=[{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id == "toolu_s1" and deltas[0].function.name == "lookup"  # type: ignore[union-attr]
    arguments = "".join(d.function.arguments or "" for d in deltas)  # type: ignore[union-attr]
    assert json.loads(arguments) == {"query": "tides of Bergen"} and len(deltas) >= 3
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_the_anthropic_sdk_passes_cache_control_through_and_pays_cache_prices(
        srv: tuple[ServeProcess, str, str], fake: FakeAnthropic) -> None:
    server, user, _ = srv
    usage = FakeUsage(input_tokens=10, output_tokens=20, cache_read_input_tokens=0, cache_creation_input_tokens=5000)
    fake.enqueue(Reply([Text(["Cached", "."])], usage=usage))
    client = anthropic.Anthropic(base_url=server.http, api_key=user, max_retries=0)  # sent as x-api-key
    system = [{"type": "text", "text": "a long manual " * 50, "cache_control": {"type": "ephemeral"}}]
    with client.messages.stream(model=HAIKU, max_tokens=100, system=system,  # type: ignore[arg-type]
                                messages=[{"role": "user", "content": [
                                    {"type": "text", "text": "what is in it?"},
                                    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                 "data": PNG}}]}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Cached."
    sent = fake.last_request.body
    assert sent["system"] == system and sent["messages"][0]["content"][1]["type"] == "image"
    assert final.usage.cache_creation_input_tokens == 5000
    # 10 × 1 + 20 × 5 + 5000 × 1.25 (the cache write price) = 6360 per million, × 1.05
    assert (Decimal(6360) / 1_000_000 * Decimal("1.05")) == Decimal("0.006678")
    fake.enqueue(Reply([Text("ok")], usage=usage))
    with httpx.stream("POST", f"{server.http}/v1/messages", headers={"x-api-key": user}, json={
            "model": "claude-haiku-4-5", "max_tokens": 100, "stream": True,
            "messages": [{"role": "user", "content": "again"}]}) as raw:
        lines = list(raw.iter_lines())
    delta = next(json.loads(line[6:]) for line in lines if line.startswith("data: ") and '"message_delta"' in line)
    assert delta["usage"]["cost"] == "0.00667800"
    # not streamed (one message from upstream): the same usage, cache counts and cost, a tool_use block
    fake.enqueue(Reply([Text("Looking."), ToolUse("toolu_c", "lookup", {"q": "manual"})], stop_reason="tool_use",
                       usage=FakeUsage(input_tokens=10, output_tokens=20, cache_read_input_tokens=5000)))
    raw_message = client.messages.with_raw_response.create(model=HAIKU, max_tokens=100, system=system,  # type: ignore[arg-type]
                                                           messages=[{"role": "user", "content": "look it up"}])
    message = raw_message.parse()
    assert fake.last_request.body["stream"] is False
    assert [b.model_dump(exclude_none=True) for b in message.content] == [
        {"type": "text", "text": "Looking."}, {"type": "tool_use", "id": "toolu_c", "name": "lookup",
                                                "input": {"q": "manual"}}]
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens, message.usage.cache_read_input_tokens,
            message.usage.cache_creation_input_tokens) == (10, 20, 5000, 0)
    # 10 × 1 + 20 × 5 + 5000 × 0.10 (the cache read price) = 610 per million, × 1.05 = 0.0006405
    assert message.usage.model_extra == {"cost": "0.00064050"}
    assert raw_message.headers["x-agentvm-cost-usd"] == "0.00064050"


def test_bad_keys_are_refused_with_each_sdks_authentication_error(srv: tuple[ServeProcess, str, str]) -> None:
    server, _, _ = srv
    with pytest.raises(openai.AuthenticationError) as oa:
        openai.OpenAI(base_url=f"{server.http}/v1", api_key="avmk_000000000000.nope", max_retries=0).models.list()
    assert oa.value.body["type"] == "invalid_request_error" and oa.value.code == "invalid_api_key"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError) as an:
        anthropic.Anthropic(base_url=server.http, api_key="wrong", max_retries=0).messages.create(
            model=HAIKU, max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert an.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert httpx.get(f"{server.http}/v1/models").json() == {"error": {
        "message": "API key required: send `Authorization: Bearer <key>` or `x-api-key: <key>`",
        "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}


def test_an_upstream_failure_before_the_stream_is_an_error_status_and_nothing_is_billed(
        srv: tuple[ServeProcess, str, str], fake: FakeAnthropic) -> None:
    server, user, admin = srv
    fake.enqueue(ErrorReply.invalid_request("messages: too many images"))
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=user, max_retries=0)
    before = len(usage_records(server, admin))
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model=HAIKU, stream=True, messages=[{"role": "user", "content": "x"}])
    assert failed.value.status_code == 502 and failed.value.body["code"] == "invalid_request_error"  # type: ignore[index]
    assert len(usage_records(server, admin)) == before
    budgets = httpx.get(f"{server.http}/v1/budgets", headers={"authorization": f"Bearer {admin}"}).json()
    assert Decimal(budgets["reserved"]) == 0


def test_a_budget_stops_the_next_call_with_the_sdks_rate_limit_error(
        srv: tuple[ServeProcess, str, str], fake: FakeAnthropic) -> None:
    server, user, admin = srv
    as_admin = {"authorization": f"Bearer {admin}"}
    spent = Decimal(httpx.get(f"{server.http}/v1/budgets", headers=as_admin).json()["spent"])
    # room for one call of up to 2000 output tokens (10.5 milli-USD at Haiku's price × 1.05) and not two
    budget = spent + Decimal("0.0125")
    put = httpx.put(f"{server.http}/v1/budgets", headers=as_admin, json={"monthlyBudget": str(budget)})
    assert put.status_code == 200, put.text
    try:
        fake.enqueue(Reply([Text("spent")], usage=FakeUsage(input_tokens=100, output_tokens=1990)))
        client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=user)  # default retries: told not to retry
        assert client.chat.completions.create(model=HAIKU, max_tokens=2000, messages=[
            {"role": "user", "content": "go"}]).choices[0].message.content == "spent"
        calls = len(fake.requests)
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model=HAIKU, max_tokens=2000, messages=[{"role": "user", "content": "go"}])
        assert refused.value.code == "insufficient_quota" and refused.value.type == "insufficient_quota"
        assert "monthly budget" in refused.value.message
        with pytest.raises(anthropic.RateLimitError):
            anthropic.Anthropic(base_url=server.http, api_key=user).messages.create(
                model=HAIKU, max_tokens=2000, messages=[{"role": "user", "content": "go"}])
        assert len(fake.requests) == calls  # refused before the upstream call, and not retried
    finally:
        httpx.delete(f"{server.http}/v1/budgets", headers=as_admin)
