"""Building an image's snapshot from its config: every `resource://` reference resolved and pinned.

An image config may name an agent definition (`agent: resource://agents/<name>[@spec]`) and may give
its system prompt as a reference (`systemPrompt: resource://prompts/<name>[@spec]`). Building
resolves each against the resource center as it stands now (the caller's resources and published
ones), takes the content into the image, and records the exact version of every resource in the
resolved trees (`pins`). The image then never changes: a session resumed later runs exactly as built,
and publishing a new version affects only images built after it.

An agent definition's content may hold `systemPrompt` (text or a prompt reference), `tools`
(built-in tool names and `resource://tools/...` references), `mcpServers`, `model`, `maxTokens`,
`description`, `knowledge` (knowledge references: the image gets `knowledge_search` over their
pinned versions) and `sandbox` (a `resource://sandboxes/...` reference: the limits its tools run
with); values given in the image config itself win over the definition's.

A tool reference becomes part of the snapshot by its type (agentvm/tools/resource_tools.py): a
built-in tool joins `tools`, an MCP server joins `mcpServers` under the resource's name, an HTTP
tool joins `httpTools` with its URL and schema as of the pinned version.
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
DEFINITION_KEYS = ("systemPrompt", "tools", "mcpServers", "model", "maxTokens", "description", "knowledge",
                   "sandbox")


@dataclass(slots=True)
class Built:
    system_prompt: str | None
    values: JSON = field(default_factory=dict)  # definition values the config did not set
    pins: dict[str, str] = field(default_factory=dict)
    sources: JSON = field(default_factory=dict)  # what was referenced: {"agent": uri@v, "systemPrompt": uri@v}
    knowledge: list[str] = field(default_factory=list)  # pinned knowledge resources (knowledge_search)
    sandbox: JSON | None = None  # the pinned sandbox's content ({"limits": ...})


@dataclass(slots=True)
class BuiltTools:
    """What a tools list (names and references) expands to."""

    builtin: list[str] = field(default_factory=list)
    mcp_servers: JSON = field(default_factory=dict)
    http: list[JSON] = field(default_factory=list)


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
        sandbox = built.values.pop("sandbox", None)
        if sandbox is not None:
            if not isinstance(sandbox, str) or not is_resource_uri(sandbox):
                raise InvalidRequest("sandbox: a resource://sandboxes/... reference", field="sandbox")
            node = await self._resolve(p, sandbox, "sandbox", "sandbox")
            built.pins.update(node.pins())
            built.sources["sandbox"] = node.pinned
            built.sandbox = dict(node.resource.content)
        return built

    async def tools(self, p: Principal, entries: list[str], built: Built) -> BuiltTools:
        """Expand a tools list: built-in names stay, `resource://tools/...` references are resolved,
        pinned (into `built.pins`) and sorted by their type."""
        out = BuiltTools()
        for entry in entries:
            if not is_resource_uri(entry):
                out.builtin.append(entry)
                continue
            node = await self._resolve(p, entry, "tool", "tools")
            built.pins.update(node.pins())
            content, name = node.resource.content, node.resource.name
            kind = content.get("type")
            if kind == "builtin":
                out.builtin.append(str(content["name"]))
            elif kind == "mcp":
                out.mcp_servers[name] = content["server"]
            else:
                from agentvm.tools.resource_tools import http_tool_spec

                out.http.append(http_tool_spec(name, node.pinned, content))
        if len(set(out.builtin)) != len(out.builtin):
            raise InvalidRequest("tools: each tool may be listed once", field="tools")
        names = [h["name"] for h in out.http]
        if len(set(names)) != len(names):
            raise InvalidRequest(f"tools: two HTTP tools are named {_dup(names)}", field="tools")
        return out

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


def _dup(names: list[str]) -> str:
    return next(n for n in names if names.count(n) > 1)
