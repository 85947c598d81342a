"""JSON answers on the OpenAI-compatible routes: `response_format` of `/v1/chat/completions` and
`text.format` of `/v1/responses`, `json_object` or `json_schema`, over every catalog model.

One way for every provider, the one the SDK adapters use for Claude (LangChain's
`with_structured_output`): the schema becomes the input schema of one more tool, which the request
forces (`tool_choice` that tool; `any` when the caller's own tools stay callable beside it), and the
call's events are rewritten so that the forced tool's input *is* the message's text: its
`input_json_delta` pieces become text deltas, its call is not shown, and a message that called only it
ends in `stop`. The model's own text beside it is dropped (the content must be the JSON document alone).
Providers validate a tool's input against its schema (Anthropic, OpenAI with `strict`, Bedrock), so the
answer is JSON of that schema; its tokens are billed as any."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import orjson

from agentvm.drivers.base import (
    DriverEvent,
    InputJsonDelta,
    LLMRequest,
    MessageStop,
    TextDelta,
    ToolUseStart,
    ToolUseStop,
)
from agentvm.errors import InvalidRequest
from agentvm.services.token_gateway import Billed

JSON = dict[str, Any]
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_DESCRIPTION = "Give your answer as this tool's input: a JSON document of the requested schema."


@dataclass(frozen=True, slots=True)
class JsonMode:
    tool: str  # the forced tool's name: the schema's name, or json_object
    schema: JSON
    description: str = _DESCRIPTION
    kind: str = "json_schema"  # or json_object


def _bad(param: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {problem}", field=param)


def chat_format(raw: Any, param: str = "response_format") -> JsonMode | None:
    """`response_format` of a chat completion: None for text (or absent)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _bad(param, "must be an object with a type: text, json_object or json_schema")
    kind = raw.get("type")
    if kind == "json_schema":
        spec = raw.get("json_schema")
        if not isinstance(spec, dict):
            raise _bad(f"{param}.json_schema", "required: an object with name and schema")
        return _schema_mode(spec, f"{param}.json_schema")
    return _simple(kind, param)


def responses_format(raw: Any, param: str = "text.format") -> JsonMode | None:
    """`text.format` of a response (`{"type": "json_schema", "name", "schema", "strict"?}`, flat)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _bad(param, "must be an object with a type: text, json_object or json_schema")
    if raw.get("type") == "json_schema":
        return _schema_mode(raw, param)
    return _simple(raw.get("type"), param)


def _simple(kind: Any, param: str) -> JsonMode | None:
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonMode("json_object", {"type": "object"},
                        "Give your answer as this tool's input: a JSON object of your choosing.", "json_object")
    raise _bad(f"{param}.type", "must be text, json_object or json_schema")


def _schema_mode(spec: JSON, where: str) -> JsonMode:
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(f"{where}.name", "required: letters, digits, _ and -, at most 64")
    schema = spec.get("schema", {"type": "object"})
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise _bad(f"{where}.schema", "must be the JSON Schema of an object (the answer is a JSON object)")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise _bad(f"{where}.description", "must be a string")
    return JsonMode(name, schema, description or _DESCRIPTION)


def with_json_tool(request: LLMRequest, mode: JsonMode, param: str) -> LLMRequest:
    """The request with the forced tool of `mode` (refused with a 400 where it cannot be forced)."""
    choice = (request.tool_choice or {}).get("type")
    if choice in ("tool", "any"):
        raise _bad("tool_choice", f"cannot require a tool together with a JSON {param} (the JSON answer is "
                                  "itself a required tool call): use auto or none")
    if any(tool.get("name") == mode.tool for tool in request.tools):
        raise _bad(param, f"its name {mode.tool!r} is also the name of one of the tools: rename one")
    own = [] if choice == "none" else list(request.tools)
    tool: JSON = {"name": mode.tool, "description": mode.description, "input_schema": mode.schema}
    forced: JSON = {"type": "any"} if own else {"type": "tool", "name": mode.tool}
    return dataclasses.replace(request, tools=[*own, tool], tool_choice=forced)


async def json_answer(events: AsyncGenerator[DriverEvent | Billed, None],
                      tool: str) -> AsyncGenerator[DriverEvent | Billed, None]:
    """The call's events with the forced tool's input as the message's text (see the module's doc)."""
    inside = streamed = other_calls = False
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, ToolUseStart):
                if event.name == tool:
                    inside, streamed = True, False
                    continue
                other_calls = True
            elif isinstance(event, InputJsonDelta) and inside:
                streamed = True
                yield TextDelta(event.partial_json)
                continue
            elif isinstance(event, ToolUseStop) and event.name == tool:
                if not streamed:  # a driver that gives the input whole
                    yield TextDelta(orjson.dumps(dict(event.input)).decode())
                inside = False
                continue
            elif isinstance(event, TextDelta):
                continue  # the model's words beside the document: not part of a JSON answer
            elif isinstance(event, MessageStop) and event.stop_reason == "tool_use" and not other_calls:
                event = dataclasses.replace(event, stop_reason="end_turn")
            yield event

