"""OpenAI Chat Completions ⇄ the neutral driver request and events (Anthropic's message shape).

In: messages (system/developer, user with text and image parts, assistant with tool calls, tool
results), tools and tool_choice, max_tokens / max_completion_tokens, temperature, top_p, stop, n=1.
Out: a `chat.completion` or `chat.completion.chunk` stream, usage with the billed cost (`usage.cost`,
USD as decimal text). `response_format` json_object / json_schema: api/json_mode.py. Refused with a 400
naming the parameter: n > 1, a part or role this API does not know."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from agentvm.api.json_mode import chat_format, with_json_tool
from agentvm.api.token_common import DEFAULT_MAX_TOKENS, JSON, Completion
from agentvm.domain.models import Usage
from agentvm.drivers.base import LLMRequest
from agentvm.errors import InvalidRequest
from agentvm.money import money_text
from agentvm.services.token_gateway import Billed

FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
                  "refusal": "content_filter", "pause_turn": "stop"}
_DATA_URL = re.compile(r"^data:(image/[a-zA-Z0-9.+-]+);base64,(.*)$", re.DOTALL)


def _bad(param: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {problem}", field=param)


def _number(body: JSON, name: str, lo: float, hi: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise _bad(name, f"must be a number from {lo:g} to {hi:g}")
    return float(value)


@dataclass(frozen=True, slots=True)
class ChatCall:
    model: str  # the catalog model's name as the caller gave it
    request: LLMRequest
    stream: bool
    include_usage: bool  # a streamed answer ends with a usage chunk (`stream_options.include_usage`)
    max_tokens_param: str | None  # the field that set max_tokens; None: the default
    json_tool: str | None = None  # a JSON response_format: the forced tool whose input is the answer


def to_request(body: JSON) -> ChatCall:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "required: a model id from GET /v1/models")
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad("n", "only 1 is supported")
    json_mode = chat_format(body.get("response_format"))
    param: str | None = next((p for p in ("max_completion_tokens", "max_tokens") if body.get(p) is not None), None)
    max_tokens = DEFAULT_MAX_TOKENS if param is None else body[param]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= 1_000_000:
        raise _bad(param or "max_tokens", "must be a whole number from 1")
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
    system, messages = _messages(body.get("messages"))
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise _bad("stop", "must be a string or a list of strings")
    request = LLMRequest(model=model, messages=messages, max_tokens=max_tokens,
                         system="\n\n".join(system) if system else None, tools=_tools(body.get("tools")),
                         temperature=_number(body, "temperature", 0, 2), top_p=_number(body, "top_p", 0, 1),
                         stop_sequences=stop or None, tool_choice=tool_choice_of(body.get("tool_choice")),
                         stream=stream)
    if json_mode is not None:
        request = with_json_tool(request, json_mode, "response_format")
    return ChatCall(model, request, stream, include_usage, param, json_mode.tool if json_mode else None)


def _messages(raw: Any) -> tuple[list[str], list[JSON]]:
    if not isinstance(raw, list) or not raw:
        raise _bad("messages", "must be a non-empty list")
    system: list[str] = []
    out: list[JSON] = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _bad(where, "must be an object")
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            system.append(_text_only(content, f"{where}.content"))
        elif role == "user":
            _append(out, "user", _user_blocks(content, f"{where}.content"))
        elif role == "assistant":
            blocks: list[JSON] = []
            text = _text_only(content, f"{where}.content") if content is not None else ""
            if text:
                blocks.append({"type": "text", "text": text})
            for j, call in enumerate(message.get("tool_calls") or []):
                blocks.append(_tool_use(call, f"{where}.tool_calls[{j}]"))
            if not blocks:
                raise _bad(f"{where}.content", "an assistant message needs content or tool_calls")
            _append(out, "assistant", blocks)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise _bad(f"{where}.tool_call_id", "required for a tool message")
            _append(out, "user", [{"type": "tool_result", "tool_use_id": call_id,
                                   "content": _text_only(content, f"{where}.content")}])
        else:
            raise _bad(f"{where}.role", "must be system, developer, user, assistant or tool")
    if not out:
        raise _bad("messages", "needs at least one user message")
    return system, out


def _append(out: list[JSON], role: str, blocks: list[JSON]) -> None:
    """Consecutive messages of one role become one (tool results and the user's next words together)."""
    if out and out[-1]["role"] == role:
        out[-1]["content"].extend(blocks)
    else:
        out.append({"role": role, "content": blocks})


def _text_only(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"{where}[{i}]", "only text parts are taken here")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(where, "must be a string or a list of text parts")


def _user_blocks(content: Any, where: str) -> list[JSON]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not content:
        raise _bad(where, "must be a string or a non-empty list of parts")
    blocks: list[JSON] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            blocks.append(image_block(part.get("image_url"), f"{where}[{i}].image_url"))
        else:
            raise _bad(f"{where}[{i}]", "must be a text or image_url part")
    return blocks


def image_block(raw: Any, where: str) -> JSON:
    url = raw.get("url") if isinstance(raw, dict) else raw
    if not isinstance(url, str) or not url:
        raise _bad(f"{where}.url", "required")
    found = _DATA_URL.match(url)
    if found is not None:
        return {"type": "image", "source": {"type": "base64", "media_type": found.group(1), "data": found.group(2)}}
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise _bad(f"{where}.url", "must be an http(s) URL or a data:image/…;base64 URL")


def _tool_use(call: Any, where: str) -> JSON:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _bad(f"{where}.function", "must have a name and arguments")
    arguments = function.get("arguments") or "{}"
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) else arguments
    except orjson.JSONDecodeError:
        raise _bad(f"{where}.function.arguments", "must be a JSON object") from None
    if not isinstance(parsed, dict):
        raise _bad(f"{where}.function.arguments", "must be a JSON object")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.id", "required")
    return {"type": "tool_use", "id": call_id, "name": function["name"], "input": parsed}


def _tools(raw: Any) -> list[JSON]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad("tools", "must be a list of function tools")
    tools = []
    for i, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise _bad(f"tools[{i}]", "must be {\"type\": \"function\", \"function\": {\"name\", …}}")
        params = function.get("parameters") or {"type": "object", "properties": {}}
        entry: JSON = {"name": function["name"], "input_schema": params}
        if isinstance(function.get("description"), str):
            entry["description"] = function["description"]
        tools.append(entry)
    return tools


def tool_choice_of(raw: Any) -> JSON | None:
    if raw is None:
        return None
    if raw in ("auto", "none"):
        return {"type": raw}
    if raw == "required":
        return {"type": "any"}
    if isinstance(raw, dict) and raw.get("type") == "function":
        name = raw.get("function", {}).get("name") if isinstance(raw.get("function"), dict) else None
        if isinstance(name, str) and name:
            return {"type": "tool", "name": name}
    raise _bad("tool_choice", "must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\"}}")


# ---- out -------------------------------------------------------------------------------------------

def usage_wire(usage: Usage, billed: Billed | None) -> JSON:
    prompt = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    out: JSON = {"prompt_tokens": prompt, "completion_tokens": usage.output_tokens,
                 "total_tokens": prompt + usage.output_tokens,
                 "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens}}
    if billed is not None:
        out["cost"] = money_text(billed.cost.billed)
    return out


def tool_calls_wire(blocks: Sequence[JSON]) -> list[JSON]:
    return [{"id": b["id"], "type": "function",
             "function": {"name": b["name"], "arguments": orjson.dumps(b["input"]).decode()}} for b in blocks]


def completion_wire(done: Completion, model: str, ident: str) -> JSON:
    message: JSON = {"role": "assistant", "content": done.text or None, "refusal": None}
    if done.tool_calls:
        message["tool_calls"] = tool_calls_wire(done.tool_calls)
    usage = done.billed.usage if done.billed is not None else Usage()
    return {"id": ident, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": FINISH_REASONS.get(done.stop_reason, "stop")}],
            "usage": usage_wire(usage, done.billed)}


def chunk(ident: str, model: str, created: int, delta: JSON | None, finish: str | None = None,
          usage: JSON | None = None) -> bytes:
    body: JSON = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                  "choices": [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                                         "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + orjson.dumps(body) + b"\n\n"
