"""The pure parts of agents as models (services/agent_models.py): which session a request names, the
last user message as the agent's, and a failed turn's error class."""

from __future__ import annotations

import pytest

from agentvm.errors import InvalidRequest, QuotaExceeded, RateLimited, UpstreamError
from agentvm.services.agent_models import SESSION_HEADER, is_agent_model, session_of, turn_error, user_content

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
