"""Billing is exact on real Anthropic streams: each recorded stream of `tests/fixtures/anthropic_streams`
(the official SDK's test fixtures, the API docs' examples, and streams recorded by vercel/ai; see its
README) is replayed byte for byte by the fake upstream to `avm serve` with each real driver (the
anthropic SDK, and the SDK-free one of the function tier), and the usage record the turn's call wrote
to the ledger is checked: the final usage reported is authoritative (a final `output_tokens: 0` bills 0,
a `message_delta` revising input or cache counts wins), and a stream that breaks after output was
streamed bills that output (one token per UTF-8 byte on top of the last count reported, marked
estimated)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from agentvm.domain.models import Usage
from agentvm.domain.usage import UsageRecord
from agentvm.ids import now_ms
from agentvm.money import cost_of
from tests.fakes.fake_anthropic import FakeAnthropic, RawStream, Reply, Text
from tests.support.servers import InProcess, with_anthropic_driver

pytestmark = pytest.mark.asyncio(loop_scope="module")

API_KEY = "sk-ant-recorded-Jx72mQp4"
STREAMS = Path(__file__).resolve().parents[1] / "fixtures" / "anthropic_streams"
MAX_TOKENS = 4096

# A call that started but never reported an input count is billed its request's input bound
# (drivers/token_bounds.worst_input_tokens: these turns' system prompt and task at a token per byte)
INPUT_BOUND = 140
# fixture -> (billed usage: input, output, cache read, cache write; estimated; how the call ended; model)
COMPLETE: dict[str, tuple[Usage, bool, str]] = {
    "sdk_basic_response": (Usage(11, 6), False, "claude-3-opus-latest"),
    "sdk_tool_use_response": (Usage(377, 65), False, "claude-sonnet-4-20250514"),
    "sdk_incomplete_partial_json_response": (Usage(450, 124), False, "claude-3-7-sonnet-20250219"),
    "sdk_compaction_response": (Usage(30, 8), False, "claude-opus-4-7"),
    # the final output_tokens is 0: billed 0, not message_start's 1
    "sdk_refusal_response": (Usage(20, 0), False, "claude-opus-4-7"),
    "sdk_fable_thinking_refusal": (Usage(28, 106), False, "claude-fable-5"),
    "docs_basic": (Usage(25, 15), False, "claude-opus-4-8"),
    "docs_tool_use": (Usage(472, 89), False, "claude-opus-4-8"),
    # message_delta's cumulative input (10682) replaces message_start's (2679)
    "docs_web_search": (Usage(10682, 510), False, "claude-opus-4-8"),
    # no usage in any event (as the docs print it): the streamed output, 4 thinking deltas (174 bytes)
    # and one text delta (54), is billed, estimated, and the input the request's bound (INPUT_BOUND)
    "docs_thinking": (Usage(INPUT_BOUND, 228), True, "claude-opus-4-8"),
    "vercel_web_search_citations": (Usage(15665, 795), False, "claude-sonnet-4-20250514"),
    "vercel_prompt_cache": (Usage(6, 198, 6289, 3337), False, "claude-sonnet-5"),
    "vercel_message_delta_input_tokens": (Usage(61, 2), False, "claude-opus-4-5-20251101"),
}

# streams that break: (fixture, deltas sent before the connection drops, or None: the stream's own
# error event) -> billed usage: the last reported counts + the bytes streamed since (estimated)
BROKEN: dict[str, tuple[str, int | None, Usage]] = {
    # "Hello" (5 bytes) then the docs' overloaded_error event
    "docs-error-event": ("docs_error_after_delta", None, Usage(25, 1 + 5)),
    # the server tool's input, 0 + 12 + 12 + 11 + 11 bytes, then "Here" (4)
    "web-search-cut": ("vercel_web_search_citations", 6, Usage(2037, 1 + 50)),
    # text 1 + 47 bytes, the tool's name get_weather (11) and its input so far, 0 + 8
    "tool-use-cut": ("sdk_tool_use_response", 4, Usage(377, 1 + 67)),
    # two thinking deltas (92 + 20 bytes); no usage reported at all: the input is the request's bound
    "thinking-cut": ("docs_thinking", 2, Usage(INPUT_BOUND, 112)),
}


def _stream(name: str, cut_after: int | None = None) -> RawStream:
    return RawStream((STREAMS / f"{name}.sse").read_bytes(), cut_after=cut_after)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(api_key=API_KEY) as f:
        yield f


def _serve(data_dir: Path, kind: str, base_url: str) -> contextlib.AbstractAsyncContextManager[InProcess]:
    return with_anthropic_driver(data_dir, kind, {
        "llm_api_key": API_KEY, "llm_base_url": base_url, "llm_model": "claude-sonnet-4-6", "llm_timeout_s": 10.0,
        "llm_max_retries": 0})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory, fake: FakeAnthropic) -> AsyncIterator[dict[str, InProcess]]:
    async with _serve(tmp_path_factory.mktemp("sdk"), "sdk", fake.base_url) as sdk, \
            _serve(tmp_path_factory.mktemp("lite"), "lite", fake.base_url) as lite:
        yield {"sdk": sdk, "lite": lite}


async def _turn(srv: InProcess, fake: FakeAnthropic, stream: RawStream) -> tuple[dict[str, Any], UsageRecord]:
    """One turn whose first LLM call is answered by `stream` (a tool call is answered by a short reply);
    the usage record of that call."""
    marker = f"m{uuid.uuid4().hex}"
    fake.enqueue(stream, Reply([Text("Done.")]), match=marker)
    async with httpx.AsyncClient(base_url=srv.http, timeout=30) as http:
        r = await http.post("/api/v1/agents/chat_basic/execute",
                            json={"task": f"{marker} go", "config": {"max_tokens": MAX_TOKENS}})
    assert r.status_code == 200, r.text
    result = dict(r.json())
    meter = srv.runtime.services.deps.meter
    assert meter is not None
    records = await meter.ledger.list_usage("local", since_ms=now_ms() - 86_400_000, until_ms=now_ms() + 1)
    [record] = [x for x in records if x.record_id == f"{result['turn_id']}#llm#1"]
    return result, record


def _billed(record: UsageRecord, usage: Usage, estimated: bool) -> None:
    assert (record.usage, record.estimated) == (usage, estimated)
    assert record.to_wire()["estimated"] is estimated
    assert model_cost(record) == (record.list_cost, record.billed_cost)


def model_cost(record: UsageRecord) -> tuple[Decimal, Decimal]:
    assert record.model is not None
    cost = cost_of(record.usage, record.model)
    return cost.list, cost.billed


@pytest.mark.parametrize("name", list(COMPLETE))
@pytest.mark.parametrize("kind", ["sdk", "lite"])
async def test_a_recorded_stream_bills_its_final_usage(servers: dict[str, InProcess], fake: FakeAnthropic,
                                                       kind: str, name: str) -> None:
    usage, estimated, model = COMPLETE[name]
    result, record = await _turn(servers[kind], fake, _stream(name))
    assert result["status"] == "completed", result
    assert (record.status, record.model, record.provider) == ("completed", model, "anthropic")
    _billed(record, usage, estimated)


@pytest.mark.parametrize("case", list(BROKEN))
@pytest.mark.parametrize("kind", ["sdk", "lite"])
async def test_a_stream_that_breaks_bills_the_output_already_streamed(servers: dict[str, InProcess],
                                                                      fake: FakeAnthropic, kind: str,
                                                                      case: str) -> None:
    name, cut_after, usage = BROKEN[case]
    result, record = await _turn(servers[kind], fake, _stream(name, cut_after))
    assert result["status"] == "failed", result
    expected_code = "overloaded_error" if cut_after is None else "connection_error"
    assert result["error"]["code"] == expected_code
    assert record.status == "failed"
    _billed(record, usage, True)
    # what the turn reports is what the ledger holds
    assert Decimal(result["cost"]["billed"]) == record.billed_cost
    assert result["usage"]["outputTokens"] == usage.output_tokens
