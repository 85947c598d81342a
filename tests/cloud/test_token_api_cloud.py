"""The token API on the cloud's streaming application (`agentvm.cloud.stream_app`, the Function URL)
against DynamoDB on moto, served by uvicorn as the Lambda Web Adapter would: the official `openai` SDK
lists the catalog and streams a reply of the scripted model (no key configured), the call is metered
into the tenant's DynamoDB ledger, and keys are checked in the vendor's error shape."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from agentvm.cloud import runtime as cloud_runtime
from agentvm.ids import now_ms
from tests.support.stream_server import stream_server


@pytest.fixture
async def stream(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[tuple[str, dict[str, str]]]:
    async with stream_server(moto_endpoint, monkeypatch, ("alice", "bob")) as served:
        yield served


async def test_the_openai_sdk_streams_from_the_cloud_and_the_call_is_metered(
        stream: tuple[str, dict[str, str]]) -> None:
    base, tokens = stream
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=tokens["alice"], max_retries=0)
    assert [m.id async for m in client.models.list()] == ["scripted/echo"]
    chunks = [c async for c in await client.chat.completions.create(
        model="scripted/echo", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "hello cloud"}])]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "You said: hello cloud"
    assert chunks[-1].usage is not None and chunks[-1].usage.model_extra == {"cost": "0.00000000"}
    ledger = cloud_runtime.runtime().meter.ledger
    alice = await ledger.list_usage("alice", since_ms=now_ms() - 86_400_000, until_ms=now_ms() + 1000)
    assert [(r.provider, r.model, r.tier, r.status, r.key_id) for r in alice] == [
        ("scripted", "scripted", "api", "completed", tokens["alice"].split(".")[0])]
    assert await ledger.list_usage("bob", since_ms=now_ms() - 86_400_000, until_ms=now_ms() + 1000) == []
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="avmk_000000000000.nope", max_retries=0
                                 ).models.list()
    async with httpx.AsyncClient(base_url=base) as http:
        refused = await http.post("/v1/messages", json={"model": "scripted/echo", "max_tokens": 5, "messages": []})
    assert (refused.status_code, refused.json()["error"]["type"]) == (401, "authentication_error")


async def test_an_agent_model_runs_a_turn_of_the_callers_image_in_the_cloud(
        stream: tuple[str, dict[str, str]]) -> None:
    base, tokens = stream
    async with httpx.AsyncClient(base_url=base) as http:
        made = await http.post("/v1/images", headers={"authorization": f"Bearer {tokens['alice']}"},
                               json={"containerId": "c-cloud"})
    assert made.status_code == 201, made.text
    image, primary = made.json()["imageId"], made.json()["sessionId"]
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=tokens["alice"], max_retries=0)
    raw = await client.chat.completions.with_raw_response.create(
        model=f"agent/{image}", stream=True, messages=[{"role": "user", "content": "hello agent"}])
    assert raw.headers["x-agentvm-session-id"] == primary
    chunks = [c async for c in raw.parse()]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "You said: hello agent"
    turn_id = raw.headers["x-agentvm-turn-id"]
    # the runner streams turn_response live, then stores the turn in that step's checkpoint: on a loaded
    # machine the answer can end a moment before the row is final
    for _ in range(200):  # 10 s at most
        turn = await cloud_runtime.runtime().store.get_turn("alice", turn_id)
        if turn is None or turn.status != "queued":
            break
        await asyncio.sleep(0.05)
    assert turn is not None and (turn.status, turn.session_id, turn.image_id) == ("completed", primary, image)
    with pytest.raises(openai.NotFoundError) as theirs:
        await openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=tokens["bob"], max_retries=0
                                 ).chat.completions.create(model=f"agent/{image}",
                                                           messages=[{"role": "user", "content": "hi"}])
    assert theirs.value.param == "model"
