"""Builds the LLM context (Anthropic-shaped messages) from stored AgentX history.

History is ordered by turn: a message queued during another turn is stored before that turn's
answer, but belongs after it in the conversation.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from typing import Any

from agentvm.domain.models import StoredMessage

JSON = dict[str, Any]


def conversation_order(messages: Iterable[StoredMessage]) -> list[StoredMessage]:
    """Group messages by turn, turns in order of first appearance; messages keep storage order."""
    groups: dict[str, list[StoredMessage]] = {}
    for i, m in enumerate(messages):
        key = m.turn_id or f"_solo{i}"
        groups.setdefault(key, []).append(m)
    return [m for group in groups.values() for m in group]


def user_blocks(content: Any) -> list[JSON]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    blocks: list[JSON] = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            blocks.append({"type": "text", "text": part.get("text", "")})
        elif kind == "image":
            blocks.append(_media_block("image", part))
        elif kind == "file":
            media = str(part.get("mediaType", ""))
            if media == "application/pdf":
                blocks.append(_media_block("document", part))
            elif media.startswith("text/"):
                blocks.append({"type": "text", "text": _decode_text(part)})
            else:
                name = part.get("filename") or "file"
                blocks.append({"type": "text", "text": f"[attached file {name} ({media}) is not readable]"})
    return blocks


def _media_block(kind: str, part: JSON) -> JSON:
    data = str(part.get("data", ""))
    media = str(part.get("mediaType", ""))
    if data.startswith(("http://", "https://")):
        return {"type": kind, "source": {"type": "url", "url": data}}
    return {"type": kind, "source": {"type": "base64", "media_type": media, "data": data}}


def _decode_text(part: JSON) -> str:
    data = str(part.get("data", ""))
    try:
        return base64.b64decode(data, validate=True).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        return data


def build_context(history: list[StoredMessage], *, until_message_id: str | None = None) -> list[JSON]:
    """Anthropic messages for the conversation, up to and including the turn of `until_message_id`.

    Tool calls join the assistant message they belong to (`parentId`), tool results become a user
    message of tool_result blocks, error messages are left out, consecutive same-role messages are
    merged, and tool calls that never got a result (a failed or interrupted turn) are dropped.
    """
    ordered = conversation_order(history)
    if until_message_id is not None:
        stop_turn = next((m.turn_id for m in ordered if m.message_id == until_message_id), None)
        cut: list[StoredMessage] = []
        seen_stop = False
        for m in ordered:
            if m.turn_id == stop_turn and stop_turn is not None:
                seen_stop = True
            elif seen_stop:
                break
            cut.append(m)
            if stop_turn is None and m.message_id == until_message_id:
                break
        ordered = cut

    answered = {m.body.get("toolCallId") for m in ordered if m.subtype == "tool-result"}
    out: list[JSON] = []
    assistant_by_id: dict[str, JSON] = {}

    def push(role: str, blocks: list[JSON]) -> JSON | None:
        if not blocks:
            return None
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
            return out[-1]
        entry: JSON = {"role": role, "content": list(blocks)}
        out.append(entry)
        return entry

    for m in ordered:
        body = m.body
        sub = m.subtype
        if sub == "user":
            push("user", user_blocks(body.get("content", "")))
        elif sub == "assistant":
            text = "".join(p.get("text", "") for p in body.get("content", []) if p.get("type") == "text")
            parent = str(body.get("id", ""))
            existing = assistant_by_id.get(parent)
            if existing is not None:
                # Its tool calls were stored first (they end before the message does).
                if text.strip():
                    existing["content"].insert(0, {"type": "text", "text": text})
                continue
            entry = push("assistant", [{"type": "text", "text": text}] if text.strip() else [])
            if entry is not None:
                assistant_by_id[parent] = entry
        elif sub == "tool-call":
            call = body.get("toolCall", {})
            if call.get("id") not in answered:
                continue
            block = {"type": "tool_use", "id": call.get("id"), "name": call.get("name"),
                     "input": call.get("input") or {}}
            parent = str(body.get("parentId") or "")
            existing = assistant_by_id.get(parent)
            if existing is not None and out and out[-1] is existing:
                existing["content"].append(block)
            else:
                entry = push("assistant", [block])
                if entry is not None and parent:
                    assistant_by_id[parent] = entry
        elif sub == "tool-result":
            result = body.get("toolResult", {})
            output = result.get("output", {})
            value = output.get("value", "")
            push("user", [{"type": "tool_result", "tool_use_id": body.get("toolCallId"),
                           "content": value if isinstance(value, str) else str(value),
                           "is_error": str(output.get("type", "")).startswith("error")}])
        # error messages carry no conversation content
    # The API requires the conversation to start with a user message.
    while out and out[0]["role"] != "user":
        out.pop(0)
    return out
