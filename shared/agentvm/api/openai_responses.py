"""OpenAI's Responses API, `POST /v1/responses`, over the token gateway (docs/token-api.md): text,
images, function tools and their outputs in; a `response` object or its stream of events out.

Stateless: `previous_response_id`, `store: true` conversations, built-in tools (web search, file
search, …), `background` and `conversation` are refused with a 400 naming the param (AgentVM keeps no
response; send the whole input)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentvm.api.json_mode import JsonMode, json_answer, responses_format, with_json_tool
from agentvm.api.openai_http import openai_error
from agentvm.api.openai_wire import image_block, tool_choice_of
from agentvm.api.token_common import (
    DEFAULT_MAX_TOKENS,
    JSON,
    OPENAI_ERROR,
    SSE_HEADERS,
    Completion,
    TokenCaller,
    collect,
    cost_headers,
    first_event,
    json_body,
    replay,
    vendor_responses,
)
from agentvm.domain.models import Usage
from agentvm.drivers.base import (
    DriverEvent,
    InputJsonDelta,
    LLMRequest,
    MessageStop,
    TextDelta,
    ToolUseStart,
    ToolUseStop,
)
from agentvm.errors import AgentVMError, InvalidRequest, public_message
from agentvm.money import money_text
from agentvm.services.token_gateway import Billed, GatewayCall, TokenGateway

_REFUSED = ("previous_response_id", "conversation", "background", "prompt", "reasoning")
_INCOMPLETE = {"max_tokens": "max_output_tokens", "refusal": "content_filter"}


def _bad(param: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {problem}", field=param)


def to_request(body: JSON) -> tuple[str, LLMRequest, bool, str | None, JsonMode | None]:
    """The model's name, the neutral request, whether to stream, the param that set max_tokens, and a JSON
    `text.format` (api/json_mode.py)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "required: a model id from GET /v1/models")
    for name in _REFUSED:
        if body.get(name) is not None:
            raise _bad(name, "not supported: AgentVM keeps no responses (send the whole input)")
    if body.get("store") is True:
        raise _bad("store", "only false: AgentVM keeps no responses")
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise _bad("text", "must be an object: {\"format\": {…}}")
    json_mode = responses_format((text or {}).get("format"))
    max_tokens = body.get("max_output_tokens")
    param = None if max_tokens is None else "max_output_tokens"
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _bad("max_output_tokens", "must be a whole number from 1")
    system: list[str] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _bad("instructions", "must be a string")
        system.append(instructions)
    messages = _input(body.get("input"), system)
    numbers: dict[str, float | None] = {}
    for name, hi in (("temperature", 2.0), ("top_p", 1.0)):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not 0 <= value <= hi):
            raise _bad(name, f"must be a number from 0 to {hi:g}")
        numbers[name] = None if value is None else float(value)
    request = LLMRequest(model=model, messages=messages, max_tokens=max_tokens,
                         system="\n\n".join(system) if system else None, tools=_tools(body.get("tools")),
                         temperature=numbers["temperature"], top_p=numbers["top_p"],
                         tool_choice=_choice(body.get("tool_choice")), stream=body.get("stream") is True)
    if json_mode is not None:
        request = with_json_tool(request, json_mode, "text.format")
    return model, request, body.get("stream") is True, param, json_mode


def _input(raw: Any, system: list[str]) -> list[JSON]:
    if isinstance(raw, str):
        return [{"role": "user", "content": [{"type": "text", "text": raw}]}]
    if not isinstance(raw, list) or not raw:
        raise _bad("input", "must be a string or a non-empty list of items")
    out: list[JSON] = []

    def add(role: str, block: JSON) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].append(block)
        else:
            out.append({"role": role, "content": [block]})

    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(where, "must be an object")
        kind = item.get("type", "message")
        if kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise _bad(where, "a function_call needs call_id and name")
            try:
                args = orjson.loads(item.get("arguments") or "{}")
            except orjson.JSONDecodeError:
                raise _bad(f"{where}.arguments", "must be a JSON object") from None
            add("assistant", {"type": "tool_use", "id": call_id, "name": name, "input": args if isinstance(args, dict)
                              else {}})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not isinstance(output, str):
                raise _bad(where, "a function_call_output needs call_id and a string output")
            add("user", {"type": "tool_result", "tool_use_id": call_id, "content": output})
        elif kind == "message":
            role = item.get("role")
            if role in ("system", "developer"):
                system.append("".join(b["text"] for b in _parts(item.get("content"), f"{where}.content")
                                      if b["type"] == "text"))
            elif role in ("user", "assistant"):
                for block in _parts(item.get("content"), f"{where}.content"):
                    add(role, block)
            else:
                raise _bad(f"{where}.role", "must be user, assistant, system or developer")
        else:
            raise _bad(f"{where}.type", "must be message, function_call or function_call_output")
    if not out:
        raise _bad("input", "needs at least one user message")
    return out


def _parts(content: Any, where: str) -> list[JSON]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(where, "must be a string or a list of parts")
    blocks: list[JSON] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            blocks.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            blocks.append(image_block(part.get("image_url"), f"{where}[{i}].image_url"))
        else:
            raise _bad(f"{where}[{i}]", "must be an input_text, output_text or input_image part")
    return blocks


def _tools(raw: Any) -> list[JSON]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad("tools", "must be a list of function tools")
    tools = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise _bad(f"tools[{i}]", "only function tools ({\"type\": \"function\", \"name\", \"parameters\"})")
        entry: JSON = {"name": tool["name"], "input_schema": tool.get("parameters") or {"type": "object"}}
        if isinstance(tool.get("description"), str):
            entry["description"] = tool["description"]
        tools.append(entry)
    return tools


def _choice(raw: Any) -> JSON | None:
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("name"), str):
        return {"type": "tool", "name": raw["name"]}
    return tool_choice_of(raw)


# ---- out -------------------------------------------------------------------------------------------

def _usage(usage: Usage, billed: Billed | None) -> JSON:
    prompt = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    out: JSON = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": usage.cache_read_tokens},
                 "output_tokens": usage.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": prompt + usage.output_tokens}
    if billed is not None:
        out["cost"] = money_text(billed.cost.billed)
    return out


def _message_item(ident: str, text: str, status: str = "completed") -> JSON:
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"type": "message", "id": ident, "status": status, "role": "assistant", "content": content}


def _call_item(block: JSON, status: str = "completed", arguments: str | None = None) -> JSON:
    return {"type": "function_call", "id": "fc_" + block["id"], "call_id": block["id"], "name": block["name"],
            "arguments": orjson.dumps(block["input"]).decode() if arguments is None else arguments, "status": status}


def _format_wire(mode: JsonMode | None) -> JSON:
    """`text.format` as a response echoes it."""
    if mode is None:
        return {"type": "text"}
    if mode.kind == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "name": mode.tool, "schema": mode.schema, "strict": None}


def _answer(events: AsyncGenerator[DriverEvent | Billed, None],
            mode: JsonMode | None) -> AsyncGenerator[DriverEvent | Billed, None]:
    return events if mode is None else json_answer(events, mode.tool)


def response_wire(ident: str, model: str, created: int, *, status: str, output: list[JSON],
                  usage: JSON | None, stop_reason: str | None = None, text_format: JSON | None = None) -> JSON:
    incomplete = _INCOMPLETE.get(stop_reason or "")
    return {"id": ident, "object": "response", "created_at": created, "model": model,
            "status": "incomplete" if incomplete and status == "completed" else status,
            "incomplete_details": {"reason": incomplete} if incomplete else None, "error": None,
            "instructions": None, "metadata": {}, "output": output, "parallel_tool_calls": True,
            "temperature": None, "top_p": None, "tool_choice": "auto", "tools": [], "store": False,
            "text": {"format": text_format or {"type": "text"}}, "truncation": "disabled", "usage": usage}


def _output(done: Completion, ident: str) -> list[JSON]:
    output: list[JSON] = []
    for i, block in enumerate(done.blocks):
        if block["type"] == "text":
            output.append(_message_item(f"msg_{ident}_{i}", block["text"]))
        else:
            output.append(_call_item(block))
    return output


def responses_router(gateway: Callable[[], TokenGateway], caller: TokenCaller) -> APIRouter:
    router = APIRouter(tags=["token API (OpenAI)"])

    @router.post("/v1/responses", summary="OpenAI Responses (stateless) over the catalog, metered",
                 responses=vendor_responses(OPENAI_ERROR, streams=True))
    async def responses(request: Request) -> Response:
        try:
            principal = await caller(request)
            name, llm_request, stream, param, json_mode = to_request(await json_body(request))
            call = await gateway().start(principal, name, llm_request, max_tokens_param=param)
        except AgentVMError as exc:
            return openai_error(exc)
        ident = "resp_" + call.call_id
        try:
            first = await first_event(call)
        except AgentVMError as exc:
            return openai_error(exc)
        if not stream:
            try:
                done = await collect(_answer(replay(first, call), json_mode))
            except AgentVMError as exc:
                return openai_error(exc)
            finally:
                await call.events.aclose()
            usage = done.billed.usage if done.billed is not None else Usage()
            body = response_wire(ident, call.model.id, int(time.time()), status="completed",
                                 output=_output(done, call.call_id), usage=_usage(usage, done.billed),
                                 stop_reason=done.stop_reason, text_format=_format_wire(json_mode))
            return JSONResponse(body, headers=cost_headers(call, done.billed))
        return StreamingResponse(_events(call, first, ident, json_mode), media_type="text/event-stream",
                                 headers={**SSE_HEADERS, **cost_headers(call, None)})

    return router


class _Seq:
    def __init__(self) -> None:
        self.n = -1

    def sse(self, kind: str, data: JSON) -> bytes:
        self.n += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(
            {"type": kind, "sequence_number": self.n, **data}) + b"\n\n"


async def _events(call: GatewayCall, first: DriverEvent | Billed | None, ident: str,
                  mode: JsonMode | None) -> AsyncIterator[bytes]:
    seq, model, created = _Seq(), call.model.id, int(time.time())
    text_format = _format_wire(mode)
    output: list[JSON] = []
    text_item: JSON | None = None  # the message item being streamed
    text = ""
    tool_item_id = ""
    stop_reason: str | None = None

    def close_text() -> list[bytes]:
        nonlocal text_item, text
        if text_item is None:
            return []
        index = len(output)
        part = {"type": "output_text", "text": text, "annotations": []}
        item = _message_item(text_item["id"], text)
        output.append(item)
        text_item, text = None, ""
        return [seq.sse("response.output_text.done", {"item_id": item["id"], "output_index": index,
                                                        "content_index": 0, "text": part["text"]}),
                seq.sse("response.content_part.done", {"item_id": item["id"], "output_index": index,
                                                         "content_index": 0, "part": part}),
                seq.sse("response.output_item.done", {"output_index": index, "item": item})]

    yield seq.sse("response.created", {"response": response_wire(ident, model, created, status="in_progress",
                                                                   output=[], usage=None)})
    yield seq.sse("response.in_progress", {"response": response_wire(ident, model, created, status="in_progress",
                                                                       output=[], usage=None)})
    try:
        async with contextlib.aclosing(_answer(replay(first, call), mode)) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    if text_item is None:
                        text_item = _message_item(f"msg_{call.call_id}_{len(output)}", "", "in_progress")
                        yield seq.sse("response.output_item.added", {"output_index": len(output), "item": text_item})
                        yield seq.sse("response.content_part.added", {
                            "item_id": text_item["id"], "output_index": len(output), "content_index": 0,
                            "part": {"type": "output_text", "text": "", "annotations": []}})
                    text += event.text
                    yield seq.sse("response.output_text.delta", {"item_id": text_item["id"], "output_index":
                                                                   len(output), "content_index": 0,
                                                                   "delta": event.text})
                elif isinstance(event, ToolUseStart):
                    for chunk in close_text():
                        yield chunk
                    item = _call_item({"id": event.tool_call_id, "name": event.name, "input": {}}, "in_progress", "")
                    tool_item_id = item["id"]
                    yield seq.sse("response.output_item.added", {"output_index": len(output), "item": item})
                elif isinstance(event, InputJsonDelta):
                    yield seq.sse("response.function_call_arguments.delta", {
                        "item_id": tool_item_id, "output_index": len(output), "delta": event.partial_json})
                elif isinstance(event, ToolUseStop):
                    block = {"id": event.tool_call_id, "name": event.name, "input": dict(event.input)}
                    item = _call_item(block)
                    yield seq.sse("response.function_call_arguments.done", {
                        "item_id": item["id"], "output_index": len(output), "arguments": item["arguments"]})
                    yield seq.sse("response.output_item.done", {"output_index": len(output), "item": item})
                    output.append(item)
                elif isinstance(event, MessageStop):
                    for chunk in close_text():
                        yield chunk
                    stop_reason = event.stop_reason
                elif isinstance(event, Billed):
                    yield seq.sse("response.completed", {"response": response_wire(
                        ident, model, created, status="completed", output=output, usage=_usage(event.usage, event),
                        stop_reason=stop_reason, text_format=text_format)})
    except AgentVMError as exc:
        yield seq.sse("error", {"code": exc.code, "message": public_message(exc), "param": None})
    finally:
        await call.events.aclose()
