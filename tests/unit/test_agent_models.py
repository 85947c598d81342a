"""The pure parts of agents as models (services/agent_models.py): which session a request names, the
last user message as the agent's, a failed turn's error class; and the vendor streams of a followed
turn's chat events (api/agent_http.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from agentvm.api.agent_http import _anthropic_events, _openai_chunks
from agentvm.errors import InvalidRequest, QuotaExceeded, RateLimited, UpstreamError
from agentvm.services.agent_models import (
    SESSION_HEADER,
    AgentCall,
    AgentText,
    _Reader,
    is_agent_model,
    session_of,
    turn_error,
    user_content,
)
from agentvm.services.chat import ChatEvent

PNG = "iVBORw0KGgo="


def test_the_header_wins_a_user_field_names_a_session_only_when_it_is_a_session_id() -> None:
    assert session_of(" sess_a ", "sess_b", "user") == ("sess_a", SESSION_HEADER)
    assert session_of("new", None, "user") == ("new", SESSION_HEADER)
    assert session_of(None, "sess_b", "metadata.user_id") == ("sess_b", "metadata.user_id")
    assert session_of("", "end-user-42", "user") == (None, SESSION_HEADER)  # the end user's id: not a session
    assert session_of(None, 42, "user") == (None, SESSION_HEADER)


def test_agent_models_are_named_agent_slash_an_image_id() -> None:
    assert is_agent_model("agent/img_1") and is_agent_model("agent/")
    assert not is_agent_model("anthropic/claude-haiku-4-5") and not is_agent_model(None)


def test_the_last_user_message_is_sent_text_alone_as_text_images_inline() -> None:
    assert user_content([{"role": "user", "content": "old"}, {"role": "assistant", "content": "x"},
                         {"role": "user", "content": [{"type": "text", "text": "new"}]}]) == "new"
    parts = [{"type": "text", "text": "what is this?"},
             {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]
    assert user_content([{"role": "user", "content": parts}]) == [  # the AgentX wire form
        {"type": "text", "text": "what is this?"}, {"type": "image", "data": PNG, "mediaType": "image/png"}]


@pytest.mark.parametrize(("messages", "problem"), [
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
     "messages: the last message must be the user's"),
    ([{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}],
     "messages: an agent takes images inline (base64 data), not by URL"),
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}],
     "messages: the last user message has a tool_result part"),
    ([{"role": "user", "content": "   "}], "messages: the last user message is empty"),
    ([{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/bmp",
                                                                "data": PNG}}]}],
     "messages: the last user message: "),
])
def test_what_an_agent_cannot_take_is_refused_naming_messages(messages: list[dict[str, object]],
                                                              problem: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        user_content(messages)
    assert refused.value.field == "messages" and refused.value.message.startswith(problem)


def test_a_failed_turns_code_maps_to_its_error_class() -> None:
    assert type(turn_error("quota_exceeded", "budget")) is QuotaExceeded
    assert type(turn_error("rate_limited", "slow down")) is RateLimited
    other = turn_error("overloaded_error", "busy")
    assert type(other) is UpstreamError and other.code == "overloaded_error" and other.message == "busy"


# ---- the stream translation (api/agent_http.py) over a followed turn's chat events ----------------

class _Feed:
    def __init__(self) -> None:
        self.closed = 0

    async def __aexit__(self, *_exc: object) -> None:
        self.closed += 1


def _call(events: list[ChatEvent | None]) -> tuple[AgentCall, _Feed]:
    feed = _Feed()

    async def follow() -> AsyncIterator[ChatEvent | None]:
        for event in events:
            yield event

    turn = SimpleNamespace(feed=feed)
    return AgentCall("agent/img_1", "img_1", "sess_1", "turn_1", turn, follow(), _Reader()), feed  # type: ignore[arg-type]


def _done(status: str = "completed") -> ChatEvent:
    return ChatEvent("done", {"turn_id": "turn_1", "status": status, "cost": {"billed": "0.00012000"},
                              "usage": {"inputTokens": 10, "outputTokens": 4}})


def _data(frames: list[bytes]) -> list[str]:
    return [f.decode() for f in frames]


async def test_the_openai_stream_shows_words_pings_while_a_tool_runs_and_ends_with_the_turns_usage() -> None:
    call, feed = _call([ChatEvent("thought", {"kind": "thinking"}), ChatEvent("message", {"content": "Let me look."}),
                        ChatEvent("thought", {"kind": "tool_call", "tool": "bash"}), None,
                        ChatEvent("thought", {"kind": "tool_result"}), ChatEvent("message", {"content": "Done."}),
                        _done()])
    frames = _data([f async for f in _openai_chunks(call, "chatcmpl-turn_1", True)])
    assert frames[2] == ": ping\n\n" and frames[-1] == "data: [DONE]\n\n"
    bodies = [json.loads(f[6:]) for f in frames if f.startswith("data: {")]
    assert [b["choices"][0]["delta"].get("content") for b in bodies if b["choices"]] == [
        "", "Let me look.", "\n\nDone.", None]  # the tool is not shown; a blank line after it
    assert bodies[-2]["choices"][0]["finish_reason"] == "stop"
    assert bodies[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
                                   "prompt_tokens_details": {"cached_tokens": 0}, "cost": "0.00012000"}
    assert feed.closed == 1


async def test_a_failure_after_the_first_words_is_an_error_event_in_either_shape() -> None:
    events: list[ChatEvent | None] = [ChatEvent("message", {"content": "Half"}),
                                      ChatEvent("error", {"code": "overloaded_error", "message": "busy"}),
                                      _done("failed")]
    call, feed = _call(list(events))
    frames = _data([f async for f in _openai_chunks(call, "chatcmpl-turn_1", False)])
    assert json.loads(frames[-1][6:]) == {"error": {"message": "busy", "type": "agent_error", "param": None,
                                                    "code": "overloaded_error"}}
    assert "[DONE]" not in "".join(frames) and feed.closed == 1
    call, feed = _call([None, *events])
    frames = _data([f async for f in _anthropic_events(call, "msg_turn_1")])
    assert [f.split("\n")[0] for f in frames] == ["event: message_start", "event: ping", "event: content_block_start",
                                                  "event: content_block_delta", "event: error"]
    assert json.loads(frames[-1].split("data: ")[1]) == {"type": "error", "error": {"type": "api_error",
                                                                                    "message": "busy"}}
    assert feed.closed == 1


async def test_a_turn_that_outlasts_a_whole_answers_time_limit_is_a_timeout_naming_how_to_follow_it() -> None:
    feed = _Feed()

    async def follow() -> AsyncIterator[ChatEvent | None]:
        yield ChatEvent("message", {"content": "still"})
        raise TimeoutError("the turn turn_1 did not end within 600 s")

    call = AgentCall("agent/img_1", "img_1", "sess_1", "turn_1", SimpleNamespace(feed=feed),  # type: ignore[arg-type]
                     follow(), _Reader())
    seen: list[object] = []
    with pytest.raises(UpstreamError) as late:
        async for event in call.events():
            seen.append(event)
    assert seen == [AgentText("still")] and late.value.code == "timeout"
    assert late.value.message == ("the turn turn_1 did not end within 600 s; it goes on: follow it with "
                                  "GET /api/v1/chat/stream?session_id=sess_1")
