from __future__ import annotations

from agentvm.domain.models import StoredMessage
from agentvm.engine.context import build_context, conversation_order
from agentvm.protocol import messages as m


def sm(body: dict[str, object], turn: str) -> StoredMessage:
    return StoredMessage("s", str(body["id"]), dict(body), turn)


def test_queued_message_is_ordered_after_the_answer_of_the_turn_before_it() -> None:
    history = [
        sm(m.user_message("u1", "first", 1), "t1"),
        sm(m.user_message("u2", "second", 2), "t2"),  # stored while t1 was running
        sm(m.assistant_message("a1", "answer one", 3), "t1"),
    ]
    assert [x.message_id for x in conversation_order(history)] == ["u1", "a1", "u2"]
    ctx = build_context(history, until_message_id="u2")
    assert [c["role"] for c in ctx] == ["user", "assistant", "user"]
    assert build_context(history, until_message_id="u1") == [
        {"role": "user", "content": [{"type": "text", "text": "first"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "answer one"}]}]


def test_tool_calls_join_their_assistant_message_and_unanswered_calls_are_dropped() -> None:
    history = [
        sm(m.user_message("u1", "go", 1), "t1"),
        sm(m.tool_call_message("c1", "toolu_1", "Bash", {"command": "ls"}, "a1", 2), "t1"),
        sm(m.assistant_message("a1", "Let me look.", 2), "t1"),
        sm(m.tool_result_message("r1", "toolu_1", "Bash", "x.txt", False, 3), "t1"),
        sm(m.assistant_message("a2", "One file.", 4), "t1"),
        sm(m.user_message("u2", "again", 5), "t2"),
        sm(m.tool_call_message("c2", "toolu_2", "Bash", {}, "a3", 6), "t2"),  # turn failed: no result
        sm(m.error_message("e1", "boom", "api_error", 7), "t2"),
        sm(m.user_message("u3", "third", 8), "t3"),
    ]
    assert build_context(history) == [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x.txt",
                                      "is_error": False}]},
        {"role": "assistant", "content": [{"type": "text", "text": "One file."}]},
        {"role": "user", "content": [{"type": "text", "text": "again"}, {"type": "text", "text": "third"}]},
    ]


def test_user_content_parts_become_anthropic_blocks() -> None:
    parts = [{"type": "text", "text": "see"},
             {"type": "image", "data": "iVBOR", "mediaType": "image/png"},
             {"type": "file", "data": "aGVsbG8=", "mediaType": "text/plain", "filename": "a.txt"},
             {"type": "file", "data": "JVBERi0=", "mediaType": "application/pdf"}]
    ctx = build_context([sm(m.user_message("u1", parts, 1), "t1")])
    assert ctx[0]["content"] == [
        {"type": "text", "text": "see"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
        {"type": "text", "text": "hello"},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}},
    ]
