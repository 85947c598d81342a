"""The OpenAI Chat Completions wire format, both ways: an `LLMRequest` (Anthropic's shapes) as a
streamed Chat Completions body, and the stream's chunks as driver events.

Standard library only (with the neutral driver types): the OpenAI-compatible driver must stay cheap
to import on Lambda.

Request translation (what an OpenAI-compatible server takes):
- `system` → a leading `system` message; text blocks → `content` (a string when the message is one
  text block, else content parts); images (base64 or URL sources) → `image_url` parts (base64 as a
  `data:` URL); `cache_control` is dropped (OpenAI-compatible servers cache prefixes on their own).
- an assistant's `tool_use` blocks → `tool_calls` (arguments as JSON text); a user message's
  `tool_result` blocks → one `tool` message each, in order, before the rest of that message (a
  result's images, which a `tool` message cannot carry, go into that following user message).
- thinking blocks are dropped (their text is the upstream's own business); any other block type
  (documents, server tools) is refused: nothing is silently lost.
- `tools` → `function` tools; `tool_choice` auto / any / tool / none → "auto" / "required" /
  {"type": "function", ...} / "none", `disable_parallel_tool_use` → `parallel_tool_calls: false`.

Stream mapping: the first chunk opens the message (`MessageStart` with its id and model);
`delta.content` → `TextDelta`; `delta.tool_calls` → `ToolUseStart` (once the call's id and name
are known), `InputJsonDelta` per `function.arguments` fragment and `ToolUseStop` when the next call
or text starts, or the choice finishes (so tool blocks never interleave, as with Anthropic);
`delta.reasoning_content` / `delta.reasoning` (DeepSeek, vLLM) → `HiddenOutput`; a `usage` object
(the last chunk with `stream_options.include_usage`) → `UsageUpdate`. `prompt_tokens` includes the
cached tokens (`prompt_tokens_details.cached_tokens`, DeepSeek's `prompt_cache_hit_tokens`): they
are moved to `cache_read_tokens`, so `input_tokens` is the uncached part, as Anthropic counts.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentvm.domain.models import Usage
from agentvm.drivers.base import (
    JSON,
    DriverEvent,
    HiddenOutput,
    InputJsonDelta,
    LLMRequest,
    MessageStart,
    MessageStop,
    TextDelta,
    ToolUseStart,
    ToolUseStop,
    UsageUpdate,
)
from agentvm.errors import UpstreamError

# finish_reason → the Anthropic stop reason the engine and the protocols know.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                "content_filter": "refusal"}

_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def invalid_request(message: str, field_path: str) -> UpstreamError:
    """A request this upstream cannot take as it stands (not retryable), naming the field."""
    error = UpstreamError(message, code="invalid_request_error")
    error.field = field_path
    return error


# --- request ---------------------------------------------------------------------------------

def system_text(request: LLMRequest) -> str | None:
    """The system prompt as text: the token API's system blocks (their text joined; a cache mark has no
    Chat Completions equivalent) win over `system`."""
    if request.system_blocks is not None:
        return "\n\n".join(str(b.get("text", "")) for b in request.system_blocks
                             if isinstance(b, Mapping) and b.get("type") == "text") or None
    return request.system


def chat_body(request: LLMRequest, *, max_tokens_field: str = "max_tokens", include_usage: bool = True) -> JSON:
    """The Chat Completions body of a streamed call; unset optional fields are left out."""
    messages: list[JSON] = []
    system = system_text(request)
    if system:
        messages.append({"role": "system", "content": system})
    for i, message in enumerate(request.messages):
        messages.extend(_chat_messages(message, f"messages[{i}]"))
    body: JSON = {"model": request.model, "messages": messages, max_tokens_field: request.max_tokens,
                  "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if request.tools:
        body["tools"] = [_function_tool(tool, f"tools[{i}]") for i, tool in enumerate(request.tools)]
    if request.tool_choice is not None:
        choice, parallel = _tool_choice(request.tool_choice)
        body["tool_choice"] = choice
        if parallel is False and request.tools:
            body["parallel_tool_calls"] = False
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.stop_sequences:
        body["stop"] = list(request.stop_sequences)
    return body


def _function_tool(tool: Any, where: str) -> JSON:
    if not isinstance(tool, Mapping) or tool.get("type") not in (None, "custom"):
        kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
        raise invalid_request(f"{where}: tool type {kind!r} is not supported by an OpenAI-compatible "
                              "upstream (only function tools are)", where)
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_request(f"{where}.name: a tool needs a name", f"{where}.name")
    function: JSON = {"name": name,
                      "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: JSON) -> tuple[Any, bool | None]:
    kind = choice.get("type")
    parallel = None if choice.get("disable_parallel_tool_use") is None else not choice["disable_parallel_tool_use"]
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request("tool_choice.name: a tool choice of type 'tool' needs the tool's name",
                                  "tool_choice.name")
        return {"type": "function", "function": {"name": name}}, parallel
    if isinstance(kind, str) and kind in _TOOL_CHOICE:
        return _TOOL_CHOICE[kind], parallel
    raise invalid_request(f"tool_choice.type: {kind!r} is not one of auto, any, tool, none", "tool_choice.type")


def _chat_messages(message: Any, where: str) -> list[JSON]:
    if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
        raise invalid_request(f"{where}.role: must be 'user' or 'assistant'", f"{where}.role")
    role = message["role"]
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid_request(f"{where}.content: must be a string or a list of blocks", f"{where}.content")
    if role == "assistant":
        return [_assistant_message(content, where)]
    tool_messages: list[JSON] = []
    parts: list[JSON] = []
    for j, block in enumerate(content):
        here = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "tool_result":
            text, images = _tool_result(block, here)
            tool_messages.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""),
                                  "content": text})
            parts.extend(images)
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            parts.append(_user_part(block, here))
    if not parts:
        return tool_messages
    if len(parts) == 1 and parts[0]["type"] == "text":
        return [*tool_messages, {"role": "user", "content": parts[0]["text"]}]
    return [*tool_messages, {"role": "user", "content": parts}]


def _assistant_message(content: list[Any], where: str) -> JSON:
    texts: list[str] = []
    calls: list[JSON] = []
    for j, block in enumerate(content):
        here = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "tool_use":
            calls.append({"id": str(block.get("id") or ""), "type": "function",
                          "function": {"name": str(block.get("name") or ""),
                                       "arguments": json.dumps(block.get("input") or {})}})
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise invalid_request(f"{here}.type: block type {kind!r} is not supported in an assistant message "
                                  "for an OpenAI-compatible upstream", f"{here}.type")
    out: JSON = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        out["tool_calls"] = calls
    return out


def _user_part(block: Any, where: str) -> JSON:
    kind = block.get("type") if isinstance(block, Mapping) else None
    if kind == "text":
        return {"type": "text", "text": str(block.get("text") or "")}
    if kind == "image":
        return {"type": "image_url", "image_url": {"url": _image_url(block.get("source"), where)}}
    raise invalid_request(f"{where}.type: block type {kind!r} is not supported by an OpenAI-compatible upstream",
                          f"{where}.type")


def _image_url(source: Any, where: str) -> str:
    kind = source.get("type") if isinstance(source, Mapping) else None
    if kind == "base64" and isinstance(source.get("media_type"), str) and isinstance(source.get("data"), str):
        return f"data:{source['media_type']};base64,{source['data']}"
    if kind == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    raise invalid_request(f"{where}.source: an image needs a base64 (media_type, data) or url source",
                          f"{where}.source")


def _tool_result(block: Mapping[str, Any], where: str) -> tuple[str, list[JSON]]:
    """A tool_result's text (for the `tool` message) and its images (for the user message after)."""
    content = block.get("content")
    if content is None or isinstance(content, str):
        return content or "", []
    if not isinstance(content, list):
        raise invalid_request(f"{where}.content: must be a string or a list of blocks", f"{where}.content")
    texts: list[str] = []
    images: list[JSON] = []
    for k, part in enumerate(content):
        here = f"{where}.content[{k}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            texts.append(str(part.get("text") or ""))
        elif kind == "image":
            images.append(_user_part(part, here))
        else:
            raise invalid_request(f"{here}.type: block type {kind!r} is not supported in a tool result for an "
                                  "OpenAI-compatible upstream", f"{here}.type")
    return "\n".join(texts), images


# --- response stream -------------------------------------------------------------------------

def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def chat_usage(raw: Any, base: Usage) -> tuple[Usage, bool]:
    """`base` updated by a Chat Completions `usage` object (cumulative counts), and whether it carried
    the output count. Cached prompt tokens are reported as cache reads, not as input."""
    if not isinstance(raw, Mapping):
        return base, False
    prompt = _count(raw.get("prompt_tokens"))
    output = _count(raw.get("completion_tokens"))
    details = raw.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    if cached is None:
        cached = _count(raw.get("prompt_cache_hit_tokens"))
    usage = Usage(
        input_tokens=base.input_tokens if prompt is None else max(0, prompt - (cached or 0)),
        output_tokens=base.output_tokens if output is None else output,
        cache_read_tokens=base.cache_read_tokens if prompt is None and cached is None else (cached or 0),
        cache_write_tokens=base.cache_write_tokens,
    )
    return usage, output is not None


@dataclass(slots=True)
class _Call:
    tool_call_id: str
    name: str
    parts: list[str] = field(default_factory=list)
    announced: bool = False

    def parsed_input(self) -> JSON:
        text = "".join(self.parts)
        if not text.strip():
            return {}
        try:
            value = json.loads(text)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


class ChunkMapper:
    """Maps the parsed `chat.completion.chunk` objects of one stream onto driver events."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.started = False
        self.usage = Usage()
        self.output_reported = False
        self.finish_reason: str | None = None
        self.saw_tool_call = False
        self._calls: dict[int, _Call] = {}
        self._open: int | None = None
        self._closed: set[int] = set()
        self._seen = 0  # one more than the highest tool call index seen

    def map(self, chunk: JSON) -> list[DriverEvent]:
        events: list[DriverEvent] = []
        if not self.started:
            self.started = True
            message_id = _str(chunk.get("id")) or f"chatcmpl_{secrets.token_hex(8)}"
            events.append(MessageStart(message_id=message_id, model=_str(chunk.get("model")) or self.model))
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
                self._choice(choice, events)
        raw = chunk.get("usage")
        if isinstance(raw, Mapping):
            self.usage, has_output = chat_usage(raw, self.usage)
            self.output_reported = self.output_reported or has_output
            events.append(UsageUpdate(self.usage, has_output))
        return events

    def _choice(self, choice: Mapping[str, Any], events: list[DriverEvent]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, Mapping):
            for key in ("reasoning_content", "reasoning"):
                hidden = delta.get(key)
                if isinstance(hidden, str) and hidden:
                    events.append(HiddenOutput(len(hidden.encode())))
            for key in ("content", "refusal"):  # a refusal's text is the reply the user sees
                text = delta.get(key)
                if isinstance(text, str) and text:
                    self._close_open(events)
                    events.append(TextDelta(text))
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, list) else ():
                if isinstance(call, Mapping):
                    self._tool_fragment(call, events)
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:
            self.finish_reason = finish
            self._close_open(events)

    def _tool_fragment(self, call: Mapping[str, Any], events: list[DriverEvent]) -> None:
        index = call.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            # No index (some servers send each call whole): a new id is a new call.
            call_id = _str(call.get("id"))
            open_call = self._calls.get(self._open) if self._open is not None else None
            new = open_call is None or (call_id and call_id != open_call.tool_call_id)
            index = self._seen if new or self._open is None else self._open
        self._seen = max(self._seen, index + 1)
        if index in self._closed:
            raise UpstreamError("The upstream interleaved the fragments of two tool calls", code="malformed_response",
                                retryable=True)
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        current = self._calls.get(index)
        if current is None:
            self._close_open(events)
            current = self._calls[index] = _Call(_str(call.get("id")) or f"call_{secrets.token_hex(12)}",
                                                 _str(function.get("name")))
            self._open = index
            self.saw_tool_call = True
        elif not current.name and _str(function.get("name")):
            current.name = _str(function.get("name"))
        arguments = _str(function.get("arguments"))
        if arguments:
            current.parts.append(arguments)
        if not current.announced and current.name:
            current.announced = True
            events.append(ToolUseStart(current.tool_call_id, current.name))
            if current.parts:  # fragments that came before the name, as one
                events.append(InputJsonDelta("".join(current.parts)))
        elif current.announced and arguments:
            events.append(InputJsonDelta(arguments))

    def _close_open(self, events: list[DriverEvent]) -> None:
        if self._open is None:
            return
        index, self._open = self._open, None
        self._closed.add(index)
        call = self._calls.pop(index)
        if not call.announced:
            raise UpstreamError("The upstream streamed a tool call without a function name",
                                code="malformed_response", retryable=True)
        events.append(ToolUseStop(call.tool_call_id, call.name, call.parsed_input()))

    def stop(self) -> MessageStop:
        """The message's end: the finish reason as Anthropic's stop reason (a reply that called tools
        ends in `tool_use` even from servers that say "stop" there), with the final usage."""
        reason = STOP_REASONS.get(self.finish_reason or "stop", "end_turn")
        if self.saw_tool_call and reason == "end_turn":
            reason = "tool_use"
        return MessageStop(stop_reason=reason, usage=self.usage, usage_final=self.output_reported)

    def finish(self) -> list[DriverEvent]:
        """What closes the message at the stream's end (`[DONE]`, or the end after a finish_reason)."""
        events: list[DriverEvent] = []
        self._close_open(events)
        events.append(self.stop())
        return events
