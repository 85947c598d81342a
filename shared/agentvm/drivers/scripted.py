"""The scripted driver: deterministic and offline. Used by tests and by `avm serve` without a key.

A script is a list of rules. The first rule whose `match` regex is found in the latest user text
answers the turn; its `responses` are the successive LLM calls of that turn (a tool loop makes
several). Without a matching rule the driver echoes the user's text.

```yaml
rules:
  - match: "weather"
    responses:
      - text: ["Let me check."]
        tool_calls: [{id: toolu_01, name: Bash, input: {command: ls}, result: "a.txt\\nb.txt"}]
      - text: "Two files."
        usage: {input_tokens: 120, output_tokens: 8}
  - match: "fail"
    responses:
      - error: {code: rate_limit_error, message: Rate limit exceeded}
```
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentvm.domain.models import Usage
from agentvm.drivers.base import (
    DriverEvent,
    InputJsonDelta,
    LLMRequest,
    MessageStart,
    MessageStop,
    TextDelta,
    ToolOutcome,
    ToolUseStart,
    ToolUseStop,
)
from agentvm.errors import InvalidRequest, UpstreamError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScriptedUsage(_Strict):
    input_tokens: int = Field(0, ge=0)
    output_tokens: int = Field(0, ge=0)
    cache_read_tokens: int = Field(0, ge=0)
    cache_write_tokens: int = Field(0, ge=0)


class ScriptedToolCall(_Strict):
    id: str | None = None
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    # Split points of the input JSON into input_json_delta chunks (default: two halves).
    input_chunks: int = Field(2, ge=1, le=100)
    # A result supplied by the script (like the reference's mock). Without it the engine runs the tool.
    result: Any = None
    is_error: bool = False


class ScriptedError(_Strict):
    code: str = "api_error"
    message: str = "Scripted upstream error"
    # Raise after this many text chunks; None raises before the message starts.
    after_chunks: int | None = None


class ScriptedResponse(_Strict):
    id: str | None = None
    model: str | None = None
    text: list[str] = Field(default_factory=list)
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    stop_reason: str | None = None
    usage: ScriptedUsage | None = None
    delay_ms: float = Field(0, ge=0, le=60_000)
    first_delay_ms: float = Field(0, ge=0, le=600_000)
    error: ScriptedError | None = None

    @field_validator("text", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if isinstance(v, str):
            return _word_chunks(v)
        return v


class ScriptedRule(_Strict):
    match: str | None = None
    responses: list[ScriptedResponse] = Field(min_length=1)

    @field_validator("match")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"invalid regular expression: {exc}") from exc
        return v


class Script(_Strict):
    rules: list[ScriptedRule] = Field(default_factory=list)
    echo_prefix: str = "You said: "
    echo_delay_ms: float = Field(0, ge=0, le=60_000)


_ids = itertools.count(1)


def _word_chunks(text: str) -> list[str]:
    """Split text into word-sized chunks that concatenate back to it exactly."""
    return re.findall(r"\S+\s*|\s+", text) or ([text] if text else [])


def _estimate_tokens(value: Any) -> int:
    """About four characters per token."""
    if isinstance(value, str):
        return max(1, len(value) // 4)
    chars = 0
    for entry in value:
        content = entry.get("content")
        if isinstance(content, str):
            chars += len(content)
            continue
        for block in content or []:
            text = block.get("text") if block.get("type") == "text" else block.get("content")
            chars += len(text) if isinstance(text, str) else 16
    return max(1, chars // 4)


def latest_user_text(messages: list[dict[str, Any]]) -> tuple[str, int]:
    """The text of the last user message that is not a tool result, and the number of assistant
    messages after it (= which LLM call of the turn this is)."""
    calls = 0
    for entry in reversed(messages):
        if entry.get("role") == "assistant":
            calls += 1
            continue
        content = entry.get("content")
        if isinstance(content, str):
            return content, calls
        texts = [b.get("text", "") for b in content or [] if b.get("type") == "text"]
        if texts:
            # Consecutive user messages are merged into one entry: the newest is the last block.
            return texts[-1], calls
    return "", calls


class ScriptedDriver:
    name = "scripted"

    def __init__(self, script: Script | None = None) -> None:
        self.script = script or Script()
        self._compiled = [(re.compile(r.match) if r.match else None, r) for r in self.script.rules]

    @classmethod
    def from_file(cls, path: Path) -> ScriptedDriver:
        try:
            raw = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidRequest(f"script file {path}: {exc.strerror}", field="script_path") from exc
        return cls(parse_script(raw, source=str(path)))

    def _pick(self, request: LLMRequest) -> tuple[ScriptedResponse | None, str]:
        text, call_index = latest_user_text(request.messages)
        for regex, rule in self._compiled:
            if regex is None or regex.search(text):
                if call_index < len(rule.responses):
                    return rule.responses[call_index], text
                # The script ran out of responses for this tool loop: end the turn politely.
                return ScriptedResponse(text=["Done."]), text
        return None, text

    @staticmethod
    def _forced(request: LLMRequest, text: str) -> ScriptedResponse | None:
        """Without a matching rule, a request that requires a tool gets a call of it, as a real model must
        answer: the named tool (`tool`), else the last one given (`any`), its input a small instance of
        the tool's input schema whose strings are the echo (`schema_instance`)."""
        choice = request.tool_choice or {}
        tools = {t.get("name"): t for t in request.tools if isinstance(t, dict)}
        name = choice.get("name") if choice.get("type") == "tool" else (
            list(tools)[-1] if choice.get("type") == "any" and tools else None)
        if name not in tools:
            return None
        schema = tools[name].get("input_schema") or {"type": "object"}
        instance = schema_instance(schema, text)
        return ScriptedResponse(tool_calls=[ScriptedToolCall(name=str(name), input=instance if isinstance(
            instance, dict) else {"value": instance})])

    async def stream(self, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
        response, user_text = self._pick(request)
        if response is None:
            response = self._forced(request, self.script.echo_prefix + user_text) or ScriptedResponse(
                text=_word_chunks(self.script.echo_prefix + user_text), delay_ms=self.script.echo_delay_ms)
        if response.first_delay_ms:
            await asyncio.sleep(response.first_delay_ms / 1000)
        err = response.error
        if err is not None and err.after_chunks is None:
            raise UpstreamError(err.message, code=err.code)
        usage = response.usage
        input_tokens = usage.input_tokens if usage else _estimate_tokens(request.messages)
        start_usage = Usage(input_tokens, 1, usage.cache_read_tokens if usage else 0,
                            usage.cache_write_tokens if usage else 0)
        yield MessageStart(response.id or f"msg_scripted_{next(_ids):06d}", response.model or request.model,
                           start_usage)
        for i, chunk in enumerate(response.text):
            if err is not None and err.after_chunks == i:
                raise UpstreamError(err.message, code=err.code)
            if response.delay_ms:
                await asyncio.sleep(response.delay_ms / 1000)
            yield TextDelta(chunk)
        if err is not None:
            raise UpstreamError(err.message, code=err.code)
        for call in response.tool_calls:
            call_id = call.id or f"toolu_scripted_{next(_ids):06d}"
            yield ToolUseStart(call_id, call.name)
            raw = orjson.dumps(call.input).decode()
            step = max(1, -(-len(raw) // call.input_chunks))
            for pos in range(0, len(raw), step):
                yield InputJsonDelta(raw[pos:pos + step])
            result = None if call.result is None else ToolOutcome(call.result, call.is_error)
            yield ToolUseStop(call_id, call.name, dict(call.input), result)
        output_tokens = usage.output_tokens if usage else _estimate_tokens("".join(response.text))
        stop = response.stop_reason or ("tool_use" if response.tool_calls else "end_turn")
        yield MessageStop(stop, Usage(input_tokens, output_tokens, start_usage.cache_read_tokens,
                                      start_usage.cache_write_tokens))


def schema_instance(schema: Any, text: str, root: Any = None, depth: int = 0) -> Any:
    """A small instance of a JSON Schema, for the offline model's forced tool calls: an object's required
    properties (all when none are listed), `const`, the first `enum` value, the first non-null choice of
    `anyOf`/`oneOf`, `$ref`s within the document (pydantic's `$defs`), `minItems` items, numbers at their
    minimum or 0, false, and `text` for strings; an object with no properties gets `{"reply": text}`."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > 12:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        return schema_instance(target, text, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            chosen = next((o for o in options if isinstance(o, dict) and o.get("type") != "null"), options[0])
            return schema_instance(chosen, text, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            return {} if schema.get("additionalProperties") is False else {"reply": text}
        required = schema.get("required")
        names = [n for n in props if not isinstance(required, list) or n in required]
        return {n: schema_instance(props[n], text, root, depth + 1) for n in names}
    if kind == "array":
        count = schema.get("minItems", 0)
        count = min(count, 3) if isinstance(count, int) and not isinstance(count, bool) else 0
        return [schema_instance(schema.get("items", {}), text, root, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", 0)
        return low if isinstance(low, int | float) and not isinstance(low, bool) else 0
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return text


def parse_script(raw: str, *, source: str = "script") -> Script:
    try:
        data = yaml.safe_load(raw) if raw.strip() else {}
    except yaml.YAMLError as exc:  # one line: the problem and where (PyYAML's own text spans lines)
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise InvalidRequest(f"{source}: not valid YAML/JSON{at}: {problem}", field="script") from None
    if isinstance(data, list):
        data = {"rules": data}
    if not isinstance(data, dict):
        raise InvalidRequest(f"{source}: a script is a mapping with `rules` or a list of rules", field="script")
    try:
        return Script.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise InvalidRequest(f"{source}: {loc}: {first['msg']}", field="script") from exc
