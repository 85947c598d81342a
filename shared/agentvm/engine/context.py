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
    return [m for group in turn_groups(messages).values() for m in group]


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


def turn_groups(history: Iterable[StoredMessage]) -> dict[str, list[StoredMessage]]:
    """Messages grouped by turn, turns in order of first appearance; messages keep storage order."""
    groups: dict[str, list[StoredMessage]] = {}
    for i, m in enumerate(history):
        groups.setdefault(m.turn_id or f"_solo{i}", []).append(m)
    return groups


def build_context(history: list[StoredMessage], *, until_message_id: str | None = None) -> list[JSON]:
    """Anthropic messages for the conversation, up to and including the turn of `until_message_id`.

    Tool calls join the assistant message they belong to (`parentId`), tool results become a user
    message of tool_result blocks, error messages are left out, consecutive same-role messages are
    merged, and tool calls that never got a result (a failed or interrupted turn) are dropped.
    """
    groups = turn_groups(history)
    chosen: list[list[StoredMessage]] = []
    for group in groups.values():
        chosen.append(group)
        if until_message_id is not None and any(m.message_id == until_message_id for m in group):
            break
    return join_groups(build_group(g) for g in chosen)


def join_groups(groups: Iterable[list[JSON]]) -> list[JSON]:
    """Concatenate built turn groups, merging same-role neighbours into new entries, so the groups'
    own entries (which callers may cache) are never modified."""
    out: list[JSON] = []
    for entries in groups:
        for entry in entries:
            if out and out[-1]["role"] == entry["role"]:
                out[-1] = {"role": entry["role"], "content": [*out[-1]["content"], *entry["content"]]}
            else:
                out.append(entry)
    # The API requires the conversation to start with a user message.
    start = next((i for i, e in enumerate(out) if e["role"] == "user"), len(out))
    return out[start:]


def build_group(messages: list[StoredMessage]) -> list[JSON]:
    """The entries of one turn (or of one message that belongs to no turn)."""
    answered = {m.body.get("toolCallId") for m in messages if m.subtype == "tool-result"}
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

    for m in messages:
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
    return out
