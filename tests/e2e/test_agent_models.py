"""Agents as models on the token API (docs/token-api.md, "Agents as models"): `model: "agent/<imageId>"`
runs a turn of the caller's image, its tools included, through the chat use case, answered to the
official `openai` and `anthropic` SDKs by a real `avm serve` (keys on, the scripted driver). The
turn's usage records, cost and session history are read back from the server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal

import anthropic
import httpx
import openai
import pytest

from tests.support.servers import ServeProcess, create_key, serve

pytestmark = pytest.mark.e2e

SCRIPT = """\
rules:
  - match: "files"
    responses:
      - text: ["Let me ", "look."]
        tool_calls: [{id: toolu_a1, name: bash, input: {command: "echo tool-ran"}}]
        usage: {input_tokens: 200, output_tokens: 20}
      - text: ["I ran ", "it."]
        usage: {input_tokens: 300, output_tokens: 10}
  - match: "break"
    responses:
      - text: ["Half ", "an answer"]
        error: {code: api_error, message: "The provider broke", after_chunks: 1}
  - match: "refuse"
    responses:
      - error: {code: invalid_request_error, message: "The provider refused"}
"""
SESSION = "x-agentvm-session-id"
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgAAIAAAUAAeIhvDMAAAAASUVORK5CYII=")  # 1×1


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, dict[str, str]]]:
    base = tmp_path_factory.mktemp("agents")
    script = base / "script.yaml"
    script.write_text(SCRIPT)
    data = base / "data"
    keys = {"user": create_key(data, "acme"), "admin": create_key(data, "acme", "admin"),
            "other": create_key(data, "globex")}
    with serve(data, "--script", str(script), env={"AVM_AUTH": "keys"}) as srv:
        yield srv, keys


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def new_image(srv: ServeProcess, key: str, **config: object) -> str:
    made = httpx.post(f"{srv.http}/v1/images", headers=bearer(key), json={"containerId": "c-sdk", "config": {
        "model": "claude-haiku-4-5", **config}})
    assert made.status_code == 201, made.text
    return str(made.json()["imageId"])


def messages_of(srv: ServeProcess, key: str, session_id: str) -> list[dict[str, object]]:
    got = httpx.get(f"{srv.http}/v1/sessions/{session_id}/messages", headers=bearer(key))
    assert got.status_code == 200, got.text
    return list(got.json()["items"])


def turn_of(srv: ServeProcess, key: str, session_id: str, turn_id: str) -> dict[str, object]:
    turns = httpx.get(f"{srv.http}/v1/sessions/{session_id}/turns", headers=bearer(key)).json()["items"]
    [turn] = [t for t in turns if t["turnId"] == turn_id]
    return dict(turn)


def test_the_openai_sdk_streams_an_agent_turn_with_its_tool_and_the_session_header_continues_it(
        keyed: tuple[ServeProcess, dict[str, str]]) -> None:
    srv, keys = keyed
    image = new_image(srv, keys["user"], tools=["bash"])
    client = openai.OpenAI(base_url=f"{srv.http}/v1", api_key=keys["user"], max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=f"agent/{image}", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "system", "content": "ignored: the image has its own"},
                  {"role": "user", "content": "list the files"}],
        extra_headers={SESSION: "new"})
    session, turn_id = raw.headers[SESSION], raw.headers["x-agentvm-turn-id"]
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Let me look.\n\nI ran it."  # the tool call is the agent's own: not shown
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert {c.model for c in chunks} == {f"agent/{image}"} and chunks[0].id == f"chatcmpl-{turn_id}"
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (500, 30)
    # the turn's own billed cost: Haiku 4.5 (1 and 5 USD per million) × 1.05
    assert Decimal(str(usage.model_extra["cost"])) == (500 * 1 + 30 * 5) * Decimal("1.05") / 1_000_000  # type: ignore[index]
    turn = turn_of(srv, keys["user"], session, turn_id)
    assert (turn["status"], turn["imageId"]) == ("completed", image)
    assert turn["billedCost"] == usage.model_extra["cost"]  # type: ignore[index]
    stored = messages_of(srv, keys["user"], session)
    assert [m["subtype"] for m in stored] == ["user", "tool-call", "assistant", "tool-result", "assistant"]
    assert stored[0]["content"] == "list the files"
    assert "tool-ran" in json.dumps(stored[3]["toolResult"])  # the bash tool ran in the sandbox
    # not streamed, the same session: it goes on with its history
    again = client.chat.completions.with_raw_response.create(
        model=f"agent/{image}", messages=[{"role": "user", "content": "and again"}], extra_headers={SESSION: session})
    done = again.parse()
    assert done.choices[0].message.content == "You said: and again" and done.model == f"agent/{image}"
    assert again.headers[SESSION] == session and again.headers["x-agentvm-cost-usd"] == done.usage.model_extra["cost"]  # type: ignore[union-attr,index]
    stored = messages_of(srv, keys["user"], session)
    assert [m["content"] for m in stored if m["subtype"] == "user"] == ["list the files", "and again"]
    # without a session: the image's primary session, untouched so far
    primary = httpx.get(f"{srv.http}/v1/images/{image}", headers=bearer(keys["user"])).json()["sessionId"]
    assert messages_of(srv, keys["user"], primary) == []
    plain = client.chat.completions.with_raw_response.create(model=f"agent/{image}",
                                                             messages=[{"role": "user", "content": "hi"}])
    assert plain.headers[SESSION] == primary and plain.parse().choices[0].message.content == "You said: hi"
    # the usage records are the turn's, as for any agent turn (no second metering path)
    period = httpx.get(f"{srv.http}/v1/budgets", headers=bearer(keys["admin"])).json()["period"]
    export = httpx.get(f"{srv.http}/v1/usage/export", params={"period": period, "format": "jsonl"},
                       headers=bearer(keys["admin"])).text
    records = [json.loads(line) for line in export.splitlines() if turn_id in line]
    assert {(r["sessionId"], r["imageId"], r["status"], r["keyId"]) for r in records} == {
        (session, image, "completed", keys["user"].split(".")[0])}
    # two model calls (before the tool, and after it in the container tier the bash tool moved the turn
    # to) and the tool sandbox's time
    assert [(r["recordId"].removeprefix(turn_id), r["kind"], r["tier"]) for r in records] == [
        ("#llm#1", "llm", "function"), ("#llm#2", "llm", "container"), ("#sandbox", "sandbox", "container")]
    assert sum(Decimal(r["billedCost"]) for r in records) == Decimal(str(usage.model_extra["cost"]))  # type: ignore[index]


def test_the_anthropic_sdk_talks_to_an_agent_and_metadata_user_id_names_the_session(
        keyed: tuple[ServeProcess, dict[str, str]]) -> None:
    srv, keys = keyed
    image = new_image(srv, keys["user"], tools=["bash"])
    session = httpx.post(f"{srv.http}/v1/images/{image}/sessions", headers=bearer(keys["user"]), json={}).json()
    sid = session["sessionId"]
    client = anthropic.Anthropic(base_url=srv.http, api_key=keys["user"], max_retries=0)
    with client.messages.stream(model=f"agent/{image}", max_tokens=512, metadata={"user_id": sid},
                                messages=[{"role": "user", "content": "which files?"}]) as stream:
        assert "".join(stream.text_stream) == "Let me look.\n\nI ran it."
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 30
    message = client.messages.create(model=f"agent/{image}", max_tokens=512, metadata={"user_id": sid}, messages=[
        {"role": "user", "content": "earlier turns are the session's"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "continue"}]}])
    assert [b.text for b in message.content if b.type == "text"] == ["You said: continue"]
    assert message.usage.model_extra is not None
    assert turn_of(srv, keys["user"], sid, message.id.removeprefix("msg_"))["billedCost"] == (
        message.usage.model_extra["cost"])
    stored = messages_of(srv, keys["user"], sid)
    assert [m["content"] for m in stored if m["subtype"] == "user"] == ["which files?", "continue"]
    # the turns ran with the caller's max_tokens
    turns = httpx.get(f"{srv.http}/v1/sessions/{sid}/turns", headers=bearer(keys["user"])).json()["items"]
    assert len(turns) == 2 and all(t["status"] == "completed" for t in turns)
    with httpx.stream("POST", f"{srv.http}/v1/messages", headers={"x-api-key": keys["user"], SESSION: sid}, json={
            "model": f"agent/{image}", "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": "a b"}]}) as raw:
        assert raw.headers[SESSION] == sid
        lines = list(raw.iter_lines())
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    delta = next(json.loads(line[6:]) for line in lines if line.startswith("data: ") and '"message_delta"' in line)
    assert Decimal(delta["usage"]["cost"]) > 0 and delta["usage"]["output_tokens"] > 0
    assert names[:2] == ["message_start", "content_block_start"] and names[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}


def test_another_tenants_image_or_session_is_not_found_and_client_tools_are_refused(
        keyed: tuple[ServeProcess, dict[str, str]]) -> None:
    srv, keys = keyed
    image = new_image(srv, keys["user"])
    theirs = openai.OpenAI(base_url=f"{srv.http}/v1", api_key=keys["other"], max_retries=0)
    with pytest.raises(openai.NotFoundError) as missing:
        theirs.chat.completions.create(model=f"agent/{image}", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body == {  # the same answer as for an image that does not exist
        "message": f"model: agent/{image} is not an image of yours (GET /v1/images lists them)",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
    with pytest.raises(openai.NotFoundError) as nowhere:
        theirs.chat.completions.create(model="agent/img_nothing", messages=[{"role": "user", "content": "hi"}])
    assert nowhere.value.body["message"] == (  # type: ignore[index]
        "model: agent/img_nothing is not an image of yours (GET /v1/images lists them)")
    with pytest.raises(anthropic.NotFoundError) as gone:
        anthropic.Anthropic(base_url=srv.http, api_key=keys["other"], max_retries=0).messages.create(
            model=f"agent/{image}", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert gone.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    mine = openai.OpenAI(base_url=f"{srv.http}/v1", api_key=keys["user"], max_retries=0)
    their_image = new_image(srv, keys["other"])
    their_session = httpx.get(f"{srv.http}/v1/images/{their_image}", headers=bearer(keys["other"])).json()["sessionId"]
    with pytest.raises(openai.NotFoundError) as foreign:
        mine.chat.completions.create(model=f"agent/{image}", messages=[{"role": "user", "content": "hi"}],
                                     extra_headers={SESSION: their_session})
    assert foreign.value.param == SESSION
    with pytest.raises(openai.NotFoundError) as by_user:
        mine.chat.completions.create(model=f"agent/{image}", messages=[{"role": "user", "content": "hi"}],
                                     user="sess_nope")
    assert by_user.value.param == "user"
    # a `user` that is not a session id is the end user's id, as OpenAI means it: the primary session
    assert mine.chat.completions.create(model=f"agent/{image}", user="end-user-42", messages=[
        {"role": "user", "content": "hello"}]).choices[0].message.content == "You said: hello"
    with pytest.raises(openai.BadRequestError) as tools:
        mine.chat.completions.create(model=f"agent/{image}", messages=[{"role": "user", "content": "hi"}],
                                     tools=[{"type": "function", "function": {"name": "f"}}])
    assert tools.value.param == "tools"
    with pytest.raises(openai.BadRequestError) as last:
        mine.chat.completions.create(model=f"agent/{image}", messages=[
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    assert last.value.param == "messages"
    assert messages_of(srv, keys["user"], httpx.get(f"{srv.http}/v1/images/{image}", headers=bearer(
        keys["user"])).json()["sessionId"])[0]["content"] == "hello"  # nothing refused was stored


def test_a_budget_stops_an_agent_turn_with_the_sdks_rate_limit_error(
        keyed: tuple[ServeProcess, dict[str, str]]) -> None:
    srv, keys = keyed
    image = new_image(srv, keys["user"])
    as_admin = bearer(keys["admin"])
    spent = Decimal(httpx.get(f"{srv.http}/v1/budgets", headers=as_admin).json()["spent"])
    # less than one model call's worst case (max_tokens 4096 at Haiku's 5 USD per million output, × 1.05)
    put = httpx.put(f"{srv.http}/v1/budgets", headers=as_admin, json={"monthlyBudget": str(spent + Decimal("0.001"))})
    assert put.status_code == 200, put.text
    try:
        client = openai.OpenAI(base_url=f"{srv.http}/v1", api_key=keys["user"])  # default retries: told not to
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model=f"agent/{image}", stream=True,
                                           messages=[{"role": "user", "content": "go"}])
        assert refused.value.code == "insufficient_quota" and refused.value.type == "insufficient_quota"
        assert "monthly budget" in refused.value.message
        with pytest.raises(anthropic.RateLimitError):
            anthropic.Anthropic(base_url=srv.http, api_key=keys["user"]).messages.create(
                model=f"agent/{image}", max_tokens=4096, messages=[{"role": "user", "content": "go"}])
        primary = httpx.get(f"{srv.http}/v1/images/{image}", headers=bearer(keys["user"])).json()["sessionId"]
        turns = httpx.get(f"{srv.http}/v1/sessions/{primary}/turns", headers=bearer(keys["user"])).json()["items"]
        # two turns (each SDK once: not retried), failed by the budget, nothing spent
        assert [(t["status"], t["error"]["code"], Decimal(t["billedCost"])) for t in turns] == [
            ("failed", "quota_exceeded", Decimal(0))] * 2
        assert Decimal(httpx.get(f"{srv.http}/v1/budgets", headers=as_admin).json()["spent"]) == spent
    finally:
        httpx.delete(f"{srv.http}/v1/budgets", headers=as_admin)



def test_a_turn_that_fails_is_an_error_status_before_any_words_and_an_error_event_after(
        keyed: tuple[ServeProcess, dict[str, str]]) -> None:
    srv, keys = keyed
    image = new_image(srv, keys["user"])
    client = openai.OpenAI(base_url=f"{srv.http}/v1", api_key=keys["user"], max_retries=0)
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model=f"agent/{image}", stream=True,
                                       messages=[{"role": "user", "content": "refuse this"}])
    assert refused.value.status_code == 502 and refused.value.body == {
        "message": "The provider refused", "type": "upstream_error", "param": None, "code": "invalid_request_error"}
    stream = client.chat.completions.create(model=f"agent/{image}", stream=True,
                                            messages=[{"role": "user", "content": "break it"}])
    seen: list[str] = []
    with pytest.raises(openai.APIError) as broke:
        for c in stream:
            seen.append(c.choices[0].delta.content or "" if c.choices else "")
    assert "".join(seen) == "Half " and broke.value.message == "The provider broke"
    # not streamed: a failed turn is its error, whatever it said first
    with pytest.raises(anthropic.InternalServerError) as whole:
        anthropic.Anthropic(base_url=srv.http, api_key=keys["user"], max_retries=0).messages.create(
            model=f"agent/{image}", max_tokens=64, messages=[{"role": "user", "content": "break again"}])
    assert whole.value.status_code == 502 and whole.value.body == {
        "type": "error", "error": {"type": "api_error", "message": "The provider broke"}}
    primary = httpx.get(f"{srv.http}/v1/images/{image}", headers=bearer(keys["user"])).json()["sessionId"]
    turns = httpx.get(f"{srv.http}/v1/sessions/{primary}/turns", headers=bearer(keys["user"])).json()["items"]
    assert [(t["status"], t["error"]["code"]) for t in turns] == [("failed", "invalid_request_error"),
                                                                  ("failed", "api_error"), ("failed", "api_error")]


def test_an_image_part_reaches_the_agents_session(keyed: tuple[ServeProcess, dict[str, str]]) -> None:
    srv, keys = keyed
    image = new_image(srv, keys["user"])
    client = openai.OpenAI(base_url=f"{srv.http}/v1", api_key=keys["user"], max_retries=0)
    parts = [{"type": "text", "text": "what is it?"},
             {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]
    raw = client.chat.completions.with_raw_response.create(model=f"agent/{image}", messages=[
        {"role": "user", "content": parts}])  # type: ignore[misc,list-item]
    assert raw.parse().choices[0].message.content == "You said: what is it?"
    [user] = [m for m in messages_of(srv, keys["user"], raw.headers[SESSION]) if m["subtype"] == "user"]
    assert user["content"] == [{"type": "text", "text": "what is it?"},
                               {"type": "image", "data": PNG, "mediaType": "image/png"}]
