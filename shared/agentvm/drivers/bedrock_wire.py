"""The Amazon Bedrock Converse wire format, both ways: an `LLMRequest` (Anthropic's shapes) as the
parameters of botocore's `converse_stream`, and the events of its stream as driver events.

No botocore import here (the driver module has it): translation is plain data.

Request translation:
- `system` → `system: [{"text"}]`; text → `{"text"}`; images with a base64 source → `{"image":
  {"format", "source": {"bytes"}}}` (png, jpeg, gif, webp; a URL source is refused: Converse takes
  bytes or S3 only); `tool_use` → `{"toolUse"}`; `tool_result` → `{"toolResult": {toolUseId, content
  (text and images), status "success" | "error"}}`; thinking blocks are dropped; any other block
  type is refused with the field named.
- a block's (or tool's) `cache_control` → a `{"cachePoint": {"type": "default"}}` right after it,
  which is how Converse marks a prompt-cache breakpoint.
- `max_tokens` / `temperature` / `stop_sequences` → `inferenceConfig`; tools → `toolConfig.tools`
  (`toolSpec` with `inputSchema.json`); `tool_choice` auto / any / tool → `toolChoice`. Converse
  has no "none": with no tool blocks in the conversation the tools are left out instead, else the
  request is refused. `disable_parallel_tool_use` has no Converse equivalent and is not sent.

Stream mapping: `messageStart` → `MessageStart` (id from the request id, the model as asked);
`contentBlockStart` with `toolUse` → `ToolUseStart`; `contentBlockDelta` text → `TextDelta`,
`toolUse.input` fragments → `InputJsonDelta`, `reasoningContent.text` → `HiddenOutput`;
`contentBlockStop` of a tool block → `ToolUseStop`; `metadata.usage` → `UsageUpdate` (inputTokens
is the uncached input; cacheRead/WriteInputTokens are reported apart, as Anthropic does). The
`messageStop` (stop reason) comes before `metadata`, so `MessageStop` is emitted at the stream's end.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from agentvm.domain.models import Usage
from agentvm.drivers.anthropic_common import ToolBlock
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
from agentvm.drivers.openai_wire import invalid_request

_IMAGE_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg", "image/gif": "gif",
                  "image/webp": "webp"}
_CACHE_POINT: JSON = {"cachePoint": {"type": "default"}}
# Converse stop reasons Anthropic names otherwise; the rest (end_turn, tool_use, max_tokens,
# stop_sequence, model_context_window_exceeded) are the same words.
_STOP_REASONS = {"guardrail_intervened": "refusal", "content_filtered": "refusal"}
_KNOWN_STOPS = frozenset({"end_turn", "tool_use", "max_tokens", "stop_sequence", "model_context_window_exceeded"})


# --- request ---------------------------------------------------------------------------------

def converse_params(request: LLMRequest) -> JSON:
    """The keyword arguments of `converse_stream`; unset optional fields are left out."""
    messages = [_message(m, f"messages[{i}]") for i, m in enumerate(request.messages)]
    params: JSON = {"modelId": request.model, "messages": messages}
    if request.system_blocks is not None:  # the token API's: each text block, a cache mark after a marked one
        system: list[JSON] = []
        for block in request.system_blocks:
            if isinstance(block, Mapping) and block.get("type") == "text":
                system.append({"text": str(block.get("text", ""))})
                if block.get("cache_control"):
                    system.append(dict(_CACHE_POINT))
        if system:
            params["system"] = system
    elif request.system:
        params["system"] = [{"text": request.system}]
    inference: JSON = {"maxTokens": request.max_tokens}
    if request.temperature is not None:
        inference["temperature"] = request.temperature
    if request.top_p is not None:
        inference["topP"] = request.top_p
    if request.stop_sequences:
        inference["stopSequences"] = list(request.stop_sequences)
    params["inferenceConfig"] = inference
    tool_config = _tool_config(request, messages)
    if tool_config is not None:
        params["toolConfig"] = tool_config
    return params


def _tool_config(request: LLMRequest, messages: list[JSON]) -> JSON | None:
    if not request.tools:
        return None
    choice = request.tool_choice or {}
    kind = choice.get("type")
    if kind == "none":
        if any("toolUse" in b or "toolResult" in b for m in messages for b in m["content"]):
            raise invalid_request("tool_choice.type: Bedrock Converse has no 'none' tool choice for a "
                                  "conversation that already uses tools", "tool_choice.type")
        return None
    tools: list[JSON] = []
    for i, tool in enumerate(request.tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping) or tool.get("type") not in (None, "custom"):
            kind_name = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
            raise invalid_request(f"{where}: tool type {kind_name!r} is not supported by Bedrock Converse "
                                  "(only custom tools are)", where)
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request(f"{where}.name: a tool needs a name", f"{where}.name")
        spec: JSON = {"name": name,
                      "inputSchema": {"json": tool.get("input_schema") or {"type": "object", "properties": {}}}}
        if isinstance(tool.get("description"), str) and tool["description"]:
            spec["description"] = tool["description"]
        tools.append({"toolSpec": spec})
        if tool.get("cache_control"):
            tools.append(dict(_CACHE_POINT))
    config: JSON = {"tools": tools}
    if kind == "auto":
        config["toolChoice"] = {"auto": {}}
    elif kind == "any":
        config["toolChoice"] = {"any": {}}
    elif kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request("tool_choice.name: a tool choice of type 'tool' needs the tool's name",
                                  "tool_choice.name")
        config["toolChoice"] = {"tool": {"name": name}}
    elif kind is not None:
        raise invalid_request(f"tool_choice.type: {kind!r} is not one of auto, any, tool, none", "tool_choice.type")
    return config


def _message(message: Any, where: str) -> JSON:
    if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
        raise invalid_request(f"{where}.role: must be 'user' or 'assistant'", f"{where}.role")
    content = message.get("content")
    if isinstance(content, str):
        return {"role": message["role"], "content": [{"text": content}]}
    if not isinstance(content, list):
        raise invalid_request(f"{where}.content: must be a string or a list of blocks", f"{where}.content")
    blocks: list[JSON] = []
    for j, block in enumerate(content):
        here = f"{where}.content[{j}]"
        converted = _block(block, here)
        if converted is None:
            continue
        blocks.append(converted)
        if isinstance(block, Mapping) and block.get("cache_control"):
            blocks.append(dict(_CACHE_POINT))
    return {"role": message["role"], "content": blocks}


def _block(block: Any, where: str) -> JSON | None:
    kind = block.get("type") if isinstance(block, Mapping) else None
    if kind == "text":
        return {"text": str(block.get("text") or "")}
    if kind == "image":
        return {"image": _image(block.get("source"), where)}
    if kind == "tool_use":
        tool_input = block.get("input")
        return {"toolUse": {"toolUseId": str(block.get("id") or ""), "name": str(block.get("name") or ""),
                            "input": tool_input if isinstance(tool_input, dict) else {}}}
    if kind == "tool_result":
        return {"toolResult": {"toolUseId": str(block.get("tool_use_id") or ""),
                               "content": _result_content(block.get("content"), where),
                               "status": "error" if block.get("is_error") else "success"}}
    if kind in ("thinking", "redacted_thinking"):
        return None
    raise invalid_request(f"{where}.type: block type {kind!r} is not supported by Bedrock Converse", f"{where}.type")


def _result_content(content: Any, where: str) -> list[JSON]:
    if content is None or isinstance(content, str):
        return [{"text": content or ""}]
    if not isinstance(content, list):
        raise invalid_request(f"{where}.content: must be a string or a list of blocks", f"{where}.content")
    out: list[JSON] = []
    for k, part in enumerate(content):
        here = f"{where}.content[{k}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            out.append({"text": str(part.get("text") or "")})
        elif kind == "image":
            out.append({"image": _image(part.get("source"), here)})
        else:
            raise invalid_request(f"{here}.type: block type {kind!r} is not supported in a Bedrock tool result",
                                  f"{here}.type")
    return out


def _image(source: Any, where: str) -> JSON:
    kind = source.get("type") if isinstance(source, Mapping) else None
    if kind != "base64":
        raise invalid_request(f"{where}.source: Bedrock Converse takes images as base64 data, not {kind!r} "
                              "sources", f"{where}.source")
    image_format = _IMAGE_FORMATS.get(str(source.get("media_type") or "").lower())
    if image_format is None:
        raise invalid_request(f"{where}.source.media_type: must be one of {', '.join(sorted(_IMAGE_FORMATS))}",
                              f"{where}.source.media_type")
    try:
        data = base64.b64decode(str(source.get("data") or ""), validate=True)
    except (binascii.Error, ValueError):
        raise invalid_request(f"{where}.source.data: not valid base64", f"{where}.source.data") from None
    return {"format": image_format, "source": {"bytes": data}}


# --- response stream -------------------------------------------------------------------------

def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def converse_usage(raw: Any, base: Usage) -> tuple[Usage, bool]:
    """`base` updated by a Converse `usage` object, and whether it carried `outputTokens`."""
    if not isinstance(raw, Mapping):
        return base, False
    fields = (("inputTokens", "input_tokens"), ("outputTokens", "output_tokens"),
              ("cacheReadInputTokens", "cache_read_tokens"), ("cacheWriteInputTokens", "cache_write_tokens"))
    values = {ours: _count(raw.get(theirs)) for theirs, ours in fields}
    usage = Usage(**{ours: getattr(base, ours) if v is None else v for ours, v in values.items()})
    return usage, values["output_tokens"] is not None


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


class ConverseMapper:
    """Maps the parsed events of one ConverseStream (botocore's dicts) onto driver events."""

    def __init__(self, model: str, message_id: str) -> None:
        self.model = model
        self.message_id = message_id
        self.started = False
        self.stop_reason: str | None = None
        self.usage = Usage()
        self.output_reported = False
        self._tools: dict[int, ToolBlock] = {}

    def map(self, event: Mapping[str, Any]) -> list[DriverEvent]:
        events: list[DriverEvent] = []
        if "messageStart" in event or not self.started:
            if not self.started:
                self.started = True
                events.append(MessageStart(message_id=self.message_id, model=self.model))
            if "messageStart" in event:
                return events
        if "contentBlockStart" in event:
            body = _dict(event["contentBlockStart"])
            tool = _dict(_dict(body.get("start")).get("toolUse"))
            if tool:
                block = ToolBlock(str(tool.get("toolUseId") or ""), str(tool.get("name") or ""), {})
                self._tools[_index(body)] = block
                events.append(ToolUseStart(block.tool_call_id, block.name))
        elif "contentBlockDelta" in event:
            body = _dict(event["contentBlockDelta"])
            delta = _dict(body.get("delta"))
            text = delta.get("text")
            if isinstance(text, str) and text:
                events.append(TextDelta(text))
            fragment = _dict(delta.get("toolUse")).get("input")
            tool_block = self._tools.get(_index(body))
            if isinstance(fragment, str) and fragment and tool_block is not None:
                tool_block.parts.append(fragment)
                events.append(InputJsonDelta(fragment))
            reasoning = _dict(delta.get("reasoningContent")).get("text")
            if isinstance(reasoning, str) and reasoning:
                events.append(HiddenOutput(len(reasoning.encode())))
        elif "contentBlockStop" in event:
            done = self._tools.pop(_index(_dict(event["contentBlockStop"])), None)
            if done is not None:
                events.append(ToolUseStop(done.tool_call_id, done.name, done.parsed_input()))
        elif "messageStop" in event:
            reason = _dict(event["messageStop"]).get("stopReason")
            self.stop_reason = reason if isinstance(reason, str) else "end_turn"
        elif "metadata" in event:
            raw = _dict(event["metadata"]).get("usage")
            self.usage, has_output = converse_usage(raw, self.usage)
            self.output_reported = self.output_reported or has_output
            if isinstance(raw, Mapping):
                events.append(UsageUpdate(self.usage, has_output))
        return events

    def stop(self) -> MessageStop:
        reason = self.stop_reason or "end_turn"
        reason = _STOP_REASONS.get(reason, reason if reason in _KNOWN_STOPS else "end_turn")
        return MessageStop(stop_reason=reason, usage=self.usage, usage_final=self.output_reported)


def _index(body: Mapping[str, Any]) -> int:
    value = body.get("contentBlockIndex")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
