"""Scripted-driver scripts that reproduce the recorded reference turns."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from agentvm.drivers.base import DriverEvent, LLMRequest
from agentvm.drivers.scripted import ScriptedDriver, parse_script

REFERENCE_SCRIPT = """
rules:
  - match: "^tool turn"
    responses:
      - id: msg_01A
        model: claude-x
        text: ["Let me check."]
        tool_calls:
          - {id: toolu_01, name: Bash, input: {command: ls}, result: "a.txt\\nb.txt"}
        usage: {input_tokens: 100, output_tokens: 20}
      - id: msg_01B
        model: claude-x
        text: ["Two files."]
        usage: {input_tokens: 140, output_tokens: 5, cache_read_tokens: 80}
  - match: "^error turn"
    responses:
      - error: {code: rate_limit_error, message: Rate limit exceeded}
  - match: "^midstream error"
    responses:
      - text: ["partial ", "answer ", "then"]
        error: {code: overloaded_error, message: Overloaded, after_chunks: 2}
  # ~0.8 s: long enough for a second message to be queued and announced while it runs, in the
  # cloud too, where the running chat_turn picks up such messages at its next poll (0.25 s)
  - match: "^slow"
    responses:
      - text: ["one ", "two ", "three ", "four ", "five ", "six ", "seven ", "eight"]
        delay_ms: 100
  - match: "^unknown tool"
    responses:
      - text: ["Trying."]
        tool_calls: [{id: toolu_x, name: nope, input: {}}]
      - text: ["It failed."]
  - match: "^Hello"
    responses:
      - id: msg_01TEXT
        model: claude-x
        text: ["Hello", " there"]
        usage: {input_tokens: 12, output_tokens: 3}
"""


def reference_driver() -> ScriptedDriver:
    return ScriptedDriver(parse_script(REFERENCE_SCRIPT))


class RecordingDriver:
    """Wraps a driver and keeps every LLM request it was given."""

    def __init__(self, inner: ScriptedDriver) -> None:
        self.inner = inner
        self.name = inner.name
        self.requests: list[LLMRequest] = []

    async def stream(self, request: LLMRequest) -> AsyncGenerator[DriverEvent, None]:
        self.requests.append(request)
        async for ev in self.inner.stream(request):
            yield ev


def slow_reply_script(match: str, delay_ms: int) -> str:
    """A script whose one rule streams 20 words, `delay_ms` apart, with usage (40 in, 20 out): a turn
    that lasts long enough to be killed, interrupted or watched mid-stream."""
    words = ", ".join(f'"w{i:02d} "' for i in range(19)) + ', "w19"'
    return f"""
rules:
  - match: "{match}"
    responses:
      - text: [{words}]
        delay_ms: {delay_ms}
        usage: {{input_tokens: 40, output_tokens: 20}}
"""
