"""Upper bounds of a call's tokens, from its request alone: the input bound that metering holds before a
call (docs/billing.md, "The hold is an upper bound") and, for a call that ended without the provider's
final count, the usage to bill (`billed_usage`)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from agentvm.domain.models import Usage
from agentvm.drivers.base import LLMRequest

# An image: Anthropic bills about width × height / 750 tokens after scaling it down to the model's
# largest native size: ~1.15 MP, ~1,600 tokens, up to Claude 4.6; 2576 px long edge, 3.75 MP, ~5,000
# tokens on Opus 4.7 (Anthropic's vision docs). 6,000 covers that with the padding to 28 px.
IMAGE_TOKENS = 6_000
# The tool-use system prompt Anthropic adds to a request with tools (159 to 804 tokens by model and
# tool choice in Anthropic's tool-use pricing table; 804 for Opus 4.7 with `any`), with a margin.
TOOL_SYSTEM_TOKENS = 1_000
# Models whose context window is 200k input tokens (Anthropic's models overview; AgentVM sends no
# long-context beta header); any other model, the 1M window of Opus 4.6+ and Sonnet 4.6, is held at
# the largest, so that the bound holds for models this list does not know.
_WINDOW_200K = re.compile(r"^(claude-(opus|sonnet)-4(-0)?|claude-opus-4-1|claude-(opus|sonnet|haiku)-4-5)(-\d{8})?$"
                          r"|^claude-3|^scripted")
MAX_CONTEXT_WINDOW = 1_000_000
# Document sources whose text is in the request (counted by its bytes); any other source (a PDF as
# base64, URL or file) is rendered by the provider: it is bounded by the context window.
_TEXT_SOURCES = frozenset({"text", "content"})


def context_window(model: str) -> int:
    return 200_000 if _WINDOW_200K.match(model.lower()) else MAX_CONTEXT_WINDOW


def worst_input_tokens(request: LLMRequest) -> int:
    """An upper bound of the request's input tokens: a token covers at least one UTF-8 byte of text, so
    the bytes of every string (plus a little per structural element) bound the count; an image counts
    `IMAGE_TOKENS`, a PDF the whole context window; tools add `TOOL_SYSTEM_TOKENS`. Never more than the
    model's context window: the API refuses (unbilled) a request that does not fit."""
    window = context_window(request.model)
    total = _bound(request.messages, window) + _bound(request.system or "", window) + 16
    if request.tools:
        total += _bound(request.tools, window) + TOOL_SYSTEM_TOKENS
    return min(total, window)


def _bound(value: Any, window: int) -> int:
    if isinstance(value, str):
        return len(value.encode()) + 2
    if isinstance(value, dict):
        kind = value.get("type")
        if kind == "image":
            return IMAGE_TOKENS
        if kind == "document":
            source = value.get("source")
            if not (isinstance(source, dict) and source.get("type") in _TEXT_SOURCES):
                return window
        return 2 + sum(_bound(k, window) + _bound(v, window) for k, v in value.items())
    if isinstance(value, list | tuple):
        return 2 + sum(_bound(v, window) for v in value)
    return 4  # numbers, booleans, null


def billed_usage(usage: Usage, request: LLMRequest, *, unreported_bytes: int, started: bool,
                 final: bool) -> tuple[Usage, bool]:
    """The usage to bill for a call as it ended, and whether it is estimated. `usage` is the provider's
    last report; `unreported_bytes` the UTF-8 bytes of output streamed since it last reported the output
    count; `started`: the message started (the upstream accepted the request); `final`: it ended with the
    provider's final count.
    * Output streamed but never counted is billed at one token per byte (no token is shorter than a
      byte), on top of the last count, at most `max_tokens`: the provider bills what it generated.
    * A started call that ended without any input count (OpenAI-compatible and Bedrock streams report
      usage only at their end: the stream broke, was interrupted, or the server sends no usage) is billed
      the request's input bound (`worst_input_tokens`), the hold's own estimate: the provider billed the
      input it read, and a cent is never lost."""
    estimated = False
    if unreported_bytes:
        reported = usage.output_tokens
        usage = replace(usage, output_tokens=max(reported, min(request.max_tokens, reported + unreported_bytes)))
        estimated = True
    if started and not final and not (usage.input_tokens or usage.cache_read_tokens or usage.cache_write_tokens):
        usage = replace(usage, input_tokens=worst_input_tokens(request))
        estimated = True
    return usage, estimated
