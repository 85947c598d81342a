"""Building an image's snapshot from its config: every `resource://` reference resolved and pinned.

An image config may name an agent definition (`agent: resource://agents/<name>[@spec]`) and may give
its system prompt as a reference (`systemPrompt: resource://prompts/<name>[@spec]`). Building
resolves each against the resource center as it stands now (the caller's resources and published
ones), takes the content into the image, and records the exact version of every resource in the
resolved trees (`pins`). The image then never changes: a session resumed later runs exactly as built,
and publishing a new version affects only images built after it.

An agent definition's content may hold `systemPrompt` (text or a prompt reference), `tools`
(built-in tool names), `mcpServers`, `model`, `maxTokens`, `description` and `knowledge` (knowledge
references: the image gets `knowledge_search` over their pinned versions); values given in the
image config itself win over the definition's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentvm import __version__
from agentvm.definitions import code_definition, code_definitions
from agentvm.domain.models import Principal
from agentvm.domain.resource_uri import is_resource_uri
from agentvm.errors import InvalidRequest, NotFound
from agentvm.services.resources import Resolved, ResourceService

JSON = dict[str, Any]
DEFINITION_KEYS = ("systemPrompt", "tools", "mcpServers", "model", "maxTokens", "description", "knowledge")


@dataclass(slots=True)
class Built:
    system_prompt: str | None
    values: JSON = field(default_factory=dict)  # definition values the config did not set
    pins: dict[str, str] = field(default_factory=dict)
    sources: JSON = field(default_factory=dict)  # what was referenced: {"agent": uri@v, "systemPrompt": uri@v}
    knowledge: list[str] = field(default_factory=list)  # pinned knowledge resources (knowledge_search)


class ImageBuilder:
    def __init__(self, resources: ResourceService) -> None:
        self.resources = resources

    async def build(self, p: Principal, *, agent: str | None, system_prompt: str | None) -> Built:
        built = Built(system_prompt=system_prompt)
        if agent is not None:
            if is_resource_uri(agent):
                node = await self._resolve(p, agent, "agent", "agent")
                content, source = node.resource.content, node.pinned
                built.pins.update(node.pins())
            else:
                code = code_definition(agent)
                if code is None:
                    known = ", ".join(code_definitions())
                    raise NotFound(f"agent: no definition '{agent}' (code definitions: {known}; or a "
                                   "resource://agents/... reference)", field="agent")
                content, source = code, f"code:{agent}@{__version__}"
            unknown = sorted(set(content) - set(DEFINITION_KEYS))
            if unknown:
                raise InvalidRequest(f"agent: {source} has unknown keys: {', '.join(unknown)} (a definition "
                                     f"may hold {', '.join(DEFINITION_KEYS)})", field="agent")
            built.sources["agent"] = source
            for key in DEFINITION_KEYS:
                if key in content:
                    built.values[key] = content[key]
            if built.system_prompt is None and isinstance(content.get("systemPrompt"), str):
                built.system_prompt = content["systemPrompt"]
        if built.system_prompt is not None and is_resource_uri(built.system_prompt):
            node = await self._resolve(p, built.system_prompt, "prompt", "systemPrompt")
            text = node.resource.content.get("text")
            if not isinstance(text, str):
                raise InvalidRequest(f"systemPrompt: {node.pinned} has no text (a prompt's content is "
                                     '{"text": "..."})', field="systemPrompt")
            built.pins.update(node.pins())
            built.sources["systemPrompt"] = node.pinned
            built.system_prompt = text
        built.values.pop("systemPrompt", None)
        refs = built.values.pop("knowledge", None) or []
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            raise InvalidRequest("knowledge: a list of resource://knowledge/... references", field="knowledge")
        for ref in refs:
            node = await self._resolve(p, ref, "knowledge", "knowledge")
            built.pins.update(node.pins())
            built.knowledge.append(node.pinned)
        return built

    async def _resolve(self, p: Principal, uri: str, kind: str, field_name: str) -> Resolved:
        try:
            node = await self.resources.resolve(p, uri)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{field_name}: {exc.message.removeprefix('uri: ')}", field=field_name) from exc
        if node.resource.kind != kind:
            raise InvalidRequest(f"{field_name}: {uri} is {_a(node.resource.kind)}, not {_a(kind)}", field=field_name)
        return node


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"
