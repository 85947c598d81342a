"""Agent definitions registered in code: `@register_agent("chat_basic")`.

A code definition is a function returning the same content as an `agent` resource
(`systemPrompt`, `tools`, `mcpServers`, `model`, `maxTokens`, `description`, `knowledge`; see
docs/resources.md). It is versioned with the deployment: images built from it record
`code:<name>@<agentvm version>` as their source. Resources are for definitions that change without a
deployment; both are listed by `/v1/definitions`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

JSON = dict[str, Any]
DefinitionFactory = Callable[[], JSON]

_registry: dict[str, DefinitionFactory] = {}


def register_agent(name: str) -> Callable[[DefinitionFactory], DefinitionFactory]:
    """Register the decorated function as the code definition `name` (lowercase, like resource names)."""
    from agentvm.domain.resource_uri import is_valid_name

    if not is_valid_name(name):
        raise ValueError(f"agent definition name {name!r}: lowercase letters, digits, '.', '_' and '-'")

    def decorate(fn: DefinitionFactory) -> DefinitionFactory:
        if name in _registry and _registry[name] is not fn:
            raise ValueError(f"agent definition {name!r} is registered twice")
        _registry[name] = fn
        return fn

    return decorate


def code_definitions() -> dict[str, JSON]:
    """Every code definition's content, by name (built-in ones included)."""
    return {name: dict(fn()) for name, fn in sorted(_registry.items())}


def code_definition(name: str) -> JSON | None:
    fn = _registry.get(name)
    return None if fn is None else dict(fn())


@register_agent("chat_basic")
def _chat_basic() -> JSON:
    return {"description": "A plain conversational assistant (pure chat: the function tier only).",
            "systemPrompt": "You are a helpful, concise assistant."}


@register_agent("coder")
def _coder() -> JSON:
    return {"description": "A coding agent with the built-in tools on its container's workspace.",
            "systemPrompt": ("You are a careful software engineer. Work in the workspace with the tools you have: "
                             "read before you edit, run what you change, and report what you did."),
            "tools": ["bash", "read_file", "write_file", "edit_file", "list_files"]}
