"""JSON answers on the OpenAI-compatible routes (`response_format`, `text.format`; api/json_mode.py) with
the official `openai` SDK against a real `avm serve`: the Anthropic upstream gets the schema as a forced
tool and the client a JSON message; the offline scripted model answers an instance of the schema."""

from __future__ import annotations

import json

import httpx
import openai
import pydantic
import pytest

from tests.e2e.test_token_api import HAIKU, fake, keyed, offline, srv, usage_records
from tests.fakes.fake_anthropic import FakeAnthropic, FakeUsage, Reply, Text, ToolUse
from tests.support.servers import ServeProcess

__all__ = ["fake", "keyed", "offline", "srv"]  # the token API tests' servers, reused

pytestmark = pytest.mark.e2e


class City(pydantic.BaseModel):
    name: str
    population: int
    coastal: bool


CITY_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "population": {"type": "integer"},
                                                "coastal": {"type": "boolean"}},
               "required": ["name", "population", "coastal"], "additionalProperties": False}
OSLO = {"name": "Oslo", "population": 709000, "coastal": True}


def test_a_json_schema_answer_is_the_forced_tools_input_streamed_and_whole(
        srv: tuple[ServeProcess, str, str], fake: FakeAnthropic) -> None:
    server, user, admin = srv
    fake.enqueue(Reply([ToolUse("toolu_j1", "city", OSLO, chunks=4)], stop_reason="tool_use",
                       usage=FakeUsage(input_tokens=400, output_tokens=30)),
                 Reply([ToolUse("toolu_j2", "city", OSLO)], stop_reason="tool_use"))
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=user, max_retries=0)
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}}
    raw = client.chat.completions.with_raw_response.create(
        model=HAIKU, max_tokens=200, messages=[{"role": "user", "content": "the capital of Norway"}],
        response_format=response_format)  # type: ignore[arg-type]
    done = raw.parse()
    assert json.loads(done.choices[0].message.content or "") == OSLO
    assert done.choices[0].finish_reason == "stop" and not done.choices[0].message.tool_calls
    sent = fake.requests[0].body
    assert sent["tools"] == [{"name": "city", "input_schema": CITY_SCHEMA, "description": (
        "Give your answer as this tool's input: a JSON document of the requested schema.")}]
    assert sent["tool_choice"] == {"type": "tool", "name": "city"}
    # billed as any call: list × 1.05 (Haiku 4.5: 1 and 5 USD per million)
    assert raw.headers["x-agentvm-cost-usd"] == "0.00057750"  # (400 × 1 + 30 × 5) / 1e6 × 1.05
    [record] = [r for r in usage_records(server, admin) if r["turnId"] == raw.headers["x-agentvm-call-id"]]
    assert record["billedCost"] == "0.00057750"
    # streamed: the tool's input pieces arrive as content
    stream = client.chat.completions.create(model=HAIKU, messages=[{"role": "user", "content": "again"}],
                                            response_format=response_format, stream=True)  # type: ignore[arg-type]
    chunks = [c for c in stream if c.choices]
    pieces = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == OSLO
    assert all(not c.choices[0].delta.tool_calls for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_the_sdks_parse_helper_gets_a_pydantic_object(srv: tuple[ServeProcess, str, str],
                                                       fake: FakeAnthropic) -> None:
    server, user, _ = srv
    fake.enqueue(Reply([ToolUse("toolu_p1", "City", OSLO)], stop_reason="tool_use"))
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=user, max_retries=0)
    parsed = client.chat.completions.parse(model=HAIKU, response_format=City,
                                           messages=[{"role": "user", "content": "Oslo, please"}])
    assert parsed.choices[0].message.parsed == City(**OSLO)
    tool = fake.requests[0].body["tools"][0]
    assert tool["name"] == "City" and tool["input_schema"]["required"] == ["name", "population", "coastal"]


def test_json_object_and_the_callers_own_tools_beside_it(srv: tuple[ServeProcess, str, str],
                                                         fake: FakeAnthropic) -> None:
    server, user, _ = srv
    # the model's words beside the document are not part of the answer
    fake.enqueue(Reply([Text("Here you go."), ToolUse("toolu_o1", "json_object", {"answer": 42})],
                       stop_reason="tool_use"),
                 Reply([ToolUse("toolu_w1", "weather", {"city": "Oslo"})], stop_reason="tool_use"))
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=user, max_retries=0)
    done = client.chat.completions.create(model=HAIKU, response_format={"type": "json_object"},
                                          messages=[{"role": "user", "content": "answer in JSON"}])
    assert json.loads(done.choices[0].message.content or "") == {"answer": 42}  # as the upstream streamed it
    assert fake.requests[0].body["tool_choice"] == {"type": "tool", "name": "json_object"}
    # with tools of its own the model may call one of them (any tool) or answer in JSON
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    done = client.chat.completions.create(model=HAIKU, response_format={"type": "json_object"},  # type: ignore[arg-type]
                                          tools=tools, messages=[{"role": "user", "content": "weather?"}])
    assert done.choices[0].finish_reason == "tool_calls" and done.choices[0].message.content is None
    [call] = done.choices[0].message.tool_calls or []
    assert call.function.name == "weather"  # type: ignore[union-attr]
    sent = fake.requests[1].body
    assert [t["name"] for t in sent["tools"]] == ["weather", "json_object"] and sent["tool_choice"] == {"type": "any"}


def test_bad_formats_are_refused_naming_the_param(srv: tuple[ServeProcess, str, str]) -> None:
    server, user, _ = srv
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=user, max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    cases = [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}},
         {}, "response_format.json_schema.schema", "must be the JSON Schema of an object"),
        ({"type": "json_schema", "json_schema": {"schema": CITY_SCHEMA}}, {}, "response_format.json_schema.name",
         "required"),
        ({"type": "yaml"}, {}, "response_format.type", "must be text, json_object or json_schema"),
        ({"type": "json_object"}, {"tools": [{"type": "function", "function": {"name": "f"}}],
                                   "tool_choice": "required"}, "tool_choice", "cannot require a tool"),
    ]
    for response_format, extra, param, words in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=HAIKU, messages=messages,  # type: ignore[arg-type, call-overload]
                                           response_format=response_format, **extra)
        assert err.value.status_code == 400 and err.value.param == param
        assert words in err.value.message


def test_the_offline_model_answers_an_instance_of_the_schema(offline: ServeProcess) -> None:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{offline.port}/v1", api_key="anything")
    parsed = client.chat.completions.parse(model="scripted/echo", response_format=City,
                                           messages=[{"role": "user", "content": "a city"}])
    assert parsed.choices[0].message.parsed == City(name="You said: a city", population=0, coastal=False)
    done = client.chat.completions.create(model="scripted/echo", response_format={"type": "json_object"},
                                          messages=[{"role": "user", "content": "anything"}])
    assert json.loads(done.choices[0].message.content or "") == {"reply": "You said: anything"}
    # the Responses API's text.format, streamed and whole
    response = client.responses.create(model="scripted/echo", input="a city", text={"format": {
        "type": "json_schema", "name": "city", "schema": CITY_SCHEMA, "strict": True}})
    assert json.loads(response.output_text) == {"name": "You said: a city", "population": 0, "coastal": False}
    assert response.text is not None and response.text.format.type == "json_schema"
    with client.responses.stream(model="scripted/echo", input="a city", text_format=City) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.output_text.delta" in events and "response.function_call_arguments.delta" not in events
    assert final.output_parsed == City(name="You said: a city", population=0, coastal=False)
    # an agent model does not take a response_format
    bad = httpx.post(f"{offline.http}/v1/chat/completions", json={
        "model": "agent/img_nope", "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_object"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format"
