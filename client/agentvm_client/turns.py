"""Following turns on a session's event stream: where each turn ends, which queued message runs
next, and what one `send_message` observed of its turn."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agentvm_client.frames import Event, _context_str, _data, _str_field

__all__ = ["TurnResult"]

logger = logging.getLogger(__name__)

# Session events that do not show that a turn is under way.
_NOT_TURN_ACTIVITY = frozenset({"conversation_queued", "turn_response", "message_persisted", "user_message"})


@dataclass(slots=True)
class TurnResult:
    """What `send_message` observed of one turn.

    `text` joins the text of the turn's LLM messages, separated by a blank line. `reason` is the
    `conversation_end` reason, `"error"` when `error_occurred` ended the turn, or None when the
    call did not wait. `turn` is the `turn_response` data (usage, cost, model, …) if it arrived.
    `session_id` is the session of the turn: the one asked for, else the one the server named in its
    response, else the one seen on the turn's events (None if none was seen).
    """

    image_id: str
    agent_id: str | None = None
    text: str = ""
    reason: str | None = None
    error: str | None = None
    error_code: str | None = None
    turn: dict[str, Any] | None = None
    queued: bool = False
    message_id: str | None = None
    session_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class _TurnInfo:
    ended: bool = False
    next_message_id: str | None = None


_NO_TURN_INFO = _TurnInfo()


class _TurnTracker:
    """Follows one session's turns from its event stream: where each ends, which queued message is next.

    A turn ends with `conversation_end` or `error_occurred`. If a server sends both for one failed
    turn (`error_occurred` and `conversation_end{reason:"error"}`, in either order, with no turn
    activity between them) they count as one end.
    """

    __slots__ = ("_last_end", "_queue", "image_id")

    def __init__(self, image_id: str | None = None) -> None:
        self.image_id = image_id  # the image the session belongs to
        self._queue: deque[str] = deque()
        self._last_end: str | None = None  # an error-kind end with no activity since

    def observe(self, event: Event) -> _TurnInfo:
        kind = event["type"]
        data = _data(event)
        if kind == "conversation_queued":
            message_id = _str_field(data, "messageId")
            if message_id is not None:
                self._queue.append(message_id)
            return _NO_TURN_INFO
        if kind in ("error_occurred", "conversation_end"):
            is_error = kind == "error_occurred" or data.get("reason") == "error"
            if is_error and self._last_end is not None and self._last_end != kind:
                self._last_end = None  # second half of one failed turn
                return _NO_TURN_INFO
            self._last_end = kind if is_error else None
            return _TurnInfo(ended=True, next_message_id=self._queue.popleft() if self._queue else None)
        if kind not in _NOT_TURN_ACTIVITY:
            self._last_end = None
        return _NO_TURN_INFO

    def is_queued(self, message_id: str) -> bool:
        return message_id in self._queue


class _Client(Protocol):
    """What a collector reads of its `AgentVMClient` (client.py imports this module, not the reverse)."""

    _server_has_seq: bool
    _trackers: dict[str, _TurnTracker]


class _TurnCollector:
    """Collects one `send_message` turn. Fed synchronously, in arrival order, from the receive loop.

    It sees every session event of its image and keeps those of its session: `session_id`, given by
    the caller or taken from the response; while unknown (a server that does not name it), any
    session's, until one is identified (the queue holding our message, or the turn's first event).

    Before the response only `conversation_queued` matters: the last one of our session is ours
    (queued messages are announced before the response, spec §3.9 rule 4), so the last one of each
    session is kept until the response says which session is ours. After the response the turn is
    ours at once, or, when queued, from the end of the turn that pops our message.
    """

    def __init__(self, client: _Client, image_id: str, session_id: str | None,
                 on_event: Callable[[Event], None] | None, grace: float) -> None:
        self._client = client
        self.image_id = image_id
        self.session_id = session_id
        self._on_event = on_event
        self._grace = grace
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.state = "sent"  # sent → (waiting) → running → grace → ended
        self.queued_events: dict[str, Event] = {}  # the last `conversation_queued` per session, before the response
        self.last_queued: Event | None = None  # the last one of any session
        self.message_id: str | None = None
        self.queued = False
        self.active = False
        self.parts: list[str] = []
        self.llm_message_ids: set[str] = set()
        self.reason: str | None = None
        self.error: str | None = None
        self.error_code: str | None = None
        self.turn: dict[str, Any] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # called from the receive loop -------------------------------------------------------------------

    def on_response(self, response: Event) -> None:
        data = _data(response)
        if data.get("error"):
            self._finish()
            return
        if self.session_id is None:
            self.session_id = _str_field(data, "sessionId")
        self.message_id = _str_field(data, "messageId")
        queued = self.last_queued if self.session_id is None else self.queued_events.get(self.session_id)
        self.queued_events, self.last_queued = {}, None
        if queued is not None:
            queued_id = _str_field(_data(queued), "messageId")
            if self.message_id is None or self.message_id == queued_id:
                self.message_id = queued_id
        # Which session's queue may hold our message: ours, else the announced one's, else any of the image.
        trackers = self._client._trackers
        if self.session_id is not None:
            candidates: list[str | None] = [self.session_id]
        elif queued is not None:
            candidates = [_context_str(queued, "sessionId")]
        else:
            candidates = [s for s, t in trackers.items() if t.image_id == self.image_id]
        for session_id in candidates:
            tracker = trackers.get(session_id) if session_id is not None else None
            if self.message_id is not None and tracker is not None and tracker.is_queued(self.message_id):
                self.session_id = session_id
                self.queued = True
                self.state = "waiting"
                if queued is not None:
                    self._emit(queued)
                return
        self.state = "running"

    def observe(self, event: Event, info: _TurnInfo, session_id: str) -> None:
        """`event` is a session event of this image; `info` what the session's tracker made of it."""
        kind = event["type"]
        if self.state == "sent":
            if kind == "conversation_queued":
                self.queued_events[session_id] = event
                self.last_queued = event
        elif self.session_id is not None and session_id != self.session_id:
            return  # another session of the image
        elif self.state == "waiting":
            if info.ended and info.next_message_id == self.message_id:
                self.state = "running"
        elif self.state == "running":
            self._observe_running(event, kind, info, session_id)
        elif self.state == "grace" and kind == "turn_response" and self._is_ours(event):
            self.turn = _data(event)
            self._emit(event)
            self._finish()

    def _observe_running(self, event: Event, kind: str, info: _TurnInfo, session_id: str) -> None:
        if kind in ("conversation_queued", "message_persisted", "user_message"):
            return  # about other messages (sent behind ours, or from another device)
        if kind == "turn_response":
            if self.active and self._is_ours(event):
                self.turn = _data(event)
                self._emit(event)
            return
        if kind not in _NOT_TURN_ACTIVITY:
            self.active = True
            if self.session_id is None:
                self.session_id = session_id  # the turn's first event: from now on, only this session
        data = _data(event)
        if kind == "message_start":
            llm_message_id = _str_field(data, "messageId")
            if llm_message_id is not None:
                self.llm_message_ids.add(llm_message_id)
        if kind == "message_start" or (kind == "text_delta" and not self.parts):
            self.parts.append("")
        if kind == "text_delta":
            text = data.get("text")
            if isinstance(text, str):
                self.parts[-1] += text
        elif kind == "error_occurred":
            self.error = _str_field(data, "message") or "unknown error"
            self.error_code = _str_field(data, "code")
        self._emit(event)
        if info.ended:
            self.reason = "error" if kind == "error_occurred" else (_str_field(data, "reason") or "completed")
            if self.turn is None and self._client._server_has_seq and self._grace > 0:
                # AgentVM ends each turn with turn_response; give it a moment to arrive.
                self.state = "grace"
                self._timer = asyncio.get_running_loop().call_later(self._grace, self._finish)
            else:
                self._finish()

    def _is_ours(self, event: Event) -> bool:
        """Whether a `turn_response` is this turn's. Its `messageId` names an LLM message of the turn
        (AgentVM) or, in other servers, possibly the user message; without one we cannot tell."""
        theirs = _str_field(_data(event), "messageId")
        return (theirs is None or not self.llm_message_ids or theirs in self.llm_message_ids
                or theirs == self.message_id)

    def _emit(self, event: Event) -> None:
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:
                logger.exception("send_message on_event callback raised")

    def _finish(self) -> None:
        self.state = "ended"
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.done.done():
            self.done.set_result(None)

    def fail(self, exc: BaseException) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.done.done():
            self.done.set_exception(exc)

    def result(self, agent_id: str | None) -> TurnResult:
        return TurnResult(
            image_id=self.image_id,
            agent_id=agent_id,
            text="\n\n".join(p for p in self.parts if p),
            reason=self.reason,
            error=self.error,
            error_code=self.error_code,
            turn=self.turn,
            queued=self.queued,
            message_id=self.message_id,
            session_id=self.session_id,
        )

