"""Every frame the test suites receive from the server is checked against the protocol models
(agentvm.protocol.wire_check): the stock client checks each frame it reads, the Python client's
and the SSE chat tests check what they see. A frame that does not match is recorded here, and the
autouse fixture of tests/conftest.py fails the test that received it (the stock client's reader
cannot raise into the test). docs/protocol.md, "Keeping the wire in line"."""

from __future__ import annotations

from typing import Any

import pytest

from agentvm.protocol.wire_check import data_problems, frame_problems

DRIFT: list[str] = []


def check_frame(frame: str | bytes | dict[str, Any]) -> None:
    """Record what is wrong with one unwrapped server frame."""
    DRIFT.extend(frame_problems(frame))


def check_wrapper(frame: Any) -> None:
    """The reliable wrapper: exactly `{__msgId: str, __payload: str}`."""
    if set(frame) != {"__msgId", "__payload"} or not all(isinstance(v, str) for v in frame.values()):
        DRIFT.append(f"wrapper: not {{__msgId: str, __payload: str}}: {str(frame)[:120]}")


def watch_chat_feed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check the session events an SSE chat turn turns into chat events (the same frames a WebSocket
    subscriber gets; `turn_response` reaches `done_event` as its data alone)."""
    from agentvm.services import chat

    chat_event, done_event = chat.chat_event, chat.done_event

    def checked_chat_event(envelope: dict[str, Any]) -> Any:
        check_frame(envelope)
        return chat_event(envelope)

    def checked_done_event(session_id: str, data: dict[str, Any], seq: int | None) -> Any:
        DRIFT.extend(data_problems("turn_response", data))
        return done_event(session_id, data, seq)

    monkeypatch.setattr(chat, "chat_event", checked_chat_event)
    monkeypatch.setattr(chat, "done_event", checked_done_event)
