"""Images: built definitions with their primary session. The config is frozen at build time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentvm.domain.models import Agent, Image, Principal, Session
from agentvm.errors import InvalidRequest, NotFound, SandboxUnavailable, UnknownModel
from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.hosting.session_host import SessionHost, session_views
from agentvm.ids import image_id, now_ms, session_id
from agentvm.money import is_known_model, known_models
from agentvm.protocol.commands import ImageConfig, ImageListItem
from agentvm.services.agents import AgentService
from agentvm.services.containers import ContainerService
from agentvm.services.image_builder import ImageBuilder
from agentvm.tools.mcp import parse_mcp_servers

DEFAULT_IMAGE_NAME = "New Conversation"


def list_item(image: Image, agent: Agent | None) -> ImageListItem:
    item = ImageListItem(image_id=image.image_id, container_id=image.container_id, session_id=image.session_id,
                         name=image.name, created_at=image.created_at, updated_at=image.updated_at,
                         online=agent is not None)
    if image.description is not None:
        item.description = image.description
    if image.system_prompt is not None:
        item.system_prompt = image.system_prompt
    if agent is not None:
        item.agent_id = agent.agent_id
    return item


def sandbox_tools_of(config: Mapping[str, Any]) -> list[str]:
    """An image's tools that run in its container's sandbox: built-in tools and stdio MCP servers."""
    names = [str(t) for t in config.get("tools") or ()]
    servers = parse_mcp_servers(config.get("mcpServers"))
    return names + [f"MCP server '{name}'" for name, cfg in servers.items() if cfg.needs_sandbox]


def require_sandbox(deps: RuntimePorts, config: Mapping[str, Any], *, field: str | None = None) -> None:
    """Refuse an image with sandbox tools where this host has no isolating sandbox (fail closed)."""
    refusal = deps.sandbox_refusal() if deps.sandbox_refusal is not None else None
    if refusal is None:
        return
    needs = sandbox_tools_of(config)
    if needs:
        if field is None:
            field = "tools" if config.get("tools") else "mcpServers"
        raise SandboxUnavailable(f"The image's tools ({', '.join(needs)}) run in the tool sandbox, and {refusal}",
                                 field=field)


class ImageService:
    def __init__(self, deps: RuntimePorts, sessions: SessionHost, containers: ContainerService,
                 agents: AgentService, builder: ImageBuilder) -> None:
        self.deps = deps
        self.builder = builder
        self.sessions = sessions
        self.containers = containers
        self.agents = agents

    async def create(self, p: Principal, container_id: str, config: ImageConfig) -> Image:
        built = await self.builder.build(p, agent=config.agent, system_prompt=config.system_prompt)
        ts = now_ms()
        values = built.values  # from the agent definition; the config's own values win
        snapshot: dict[str, Any] = {}
        model = config.model or values.get("model")
        if model:
            await self._require_known_model(str(model), "config.model" if config.model else "agent")
            snapshot["model"] = model
        max_tokens = config.max_tokens or values.get("maxTokens")
        if max_tokens:
            snapshot["maxTokens"] = max_tokens
        entries = list(config.tools) if config.tools else values.get("tools") or []
        if not isinstance(entries, list) or not all(isinstance(t, str) for t in entries):
            raise InvalidRequest("tools: a list of built-in tool names and resource://tools/... references",
                                 field="tools")
        tools = await self.builder.tools(p, entries, built)
        if tools.builtin:
            snapshot["tools"] = tools.builtin
            from agentvm.tools.builtin import check_builtin_names  # not on ws_default's cold path

            check_builtin_names(snapshot["tools"])
        servers: dict[str, Any] = {}
        if config.mcp_servers:
            servers = {k: v.model_dump(exclude_none=True) for k, v in config.mcp_servers.items()}
        elif values.get("mcpServers"):
            servers = dict(values["mcpServers"])
        for name, server in tools.mcp_servers.items():
            if name in servers:
                raise InvalidRequest(f"tools: resource://tools/{name} is an MCP server named like one in "
                                     "mcpServers", field="tools")
            servers[name] = server
        if servers:
            snapshot["mcpServers"] = servers
            parse_mcp_servers(servers)  # a bad config is refused now, not at the first turn
        if tools.http:
            snapshot["httpTools"] = tools.http
        require_sandbox(self.deps, snapshot)  # before anything is stored, the container included
        await self.containers.ensure(p, container_id)
        if built.sandbox is not None:
            snapshot["sandbox"] = built.sandbox
        if built.knowledge:
            snapshot["knowledge"] = built.knowledge
        if built.pins:
            snapshot["pins"] = built.pins
        if built.sources:
            snapshot["sources"] = built.sources
        description = config.description if config.description is not None else values.get("description")
        image = Image(p.tenant_id, image_id(), container_id, session_id(), config.name or DEFAULT_IMAGE_NAME,
                      ts, ts, description, built.system_prompt, snapshot)
        await self.deps.store.create_image(image, Session(p.tenant_id, image.session_id, image.image_id,
                                                           container_id, ts, ts))
        return image

    async def _require_known_model(self, model: str, field: str) -> None:
        """Refuse a model this server neither prices nor runs (it would be billed at a guess, or fail
        at the first turn): the error lists the known ones."""
        options = self.deps.options
        if self.deps.turn_options is not None:  # the runtime configuration's prices (billing.prices)
            options = await self.deps.turn_options.engine_options(options)
        driver = self.deps.driver
        offline = self.deps.offline_llm if driver is None else driver.name == "scripted"
        names = known_models(options.prices, offline=offline)
        if not is_known_model(model, names):
            raise UnknownModel(f"{field}: unknown model {model!r}; known models: {', '.join(names)} (a name may "
                               "go on, as in claude-sonnet-4-5-20250929)", field=field)

    async def get(self, p: Principal, image_id_: str) -> Image | None:
        return await self.deps.store.get_image(p.tenant_id, image_id_)

    async def require(self, p: Principal, image_id_: str) -> Image:
        image = await self.deps.store.get_image(p.tenant_id, image_id_)
        if image is None:
            raise NotFound(f"Image not found: {image_id_}", field="imageId")
        return image

    async def require_with_agent(self, p: Principal, image_id_: str) -> tuple[Image, Agent | None]:
        """`require`, and the image's agent read with it (one read in the cloud)."""
        image, agent = await self.deps.store.get_image_and_agent(p.tenant_id, image_id_)
        if image is None:
            raise NotFound(f"Image not found: {image_id_}", field="imageId")
        return image, agent

    async def item(self, p: Principal, image: Image) -> ImageListItem:
        return list_item(image, await self.deps.store.get_agent_for_image(p.tenant_id, image.image_id))

    async def list_items(self, p: Principal, container_id: str | None) -> list[ImageListItem]:
        store = self.deps.store
        images = await store.list_images(p.tenant_id, container_id)
        agents = {a.image_id: a for a in await store.list_agents(p.tenant_id, container_id)}
        return [list_item(i, agents.get(i.image_id)) for i in images]

    async def update(self, p: Principal, image_id_: str, name: str | None, description: str | None) -> Image:
        require_sandbox(self.deps, (await self.require(p, image_id_)).config, field="imageId")
        image = await self.deps.store.update_image(p.tenant_id, image_id_, name=name, description=description,
                                                   updated_at=now_ms())
        if image is None:
            raise NotFound(f"Image not found: {image_id_}", field="imageId")
        return image

    async def delete(self, p: Principal, image: Image) -> None:
        agent = await self.deps.store.get_agent_for_image(p.tenant_id, image.image_id)
        if agent is not None:
            await self.agents.destroy(p, agent, image)
        for session in await session_views(self.deps.store, image):
            await self.sessions.forget(session)
        await self.deps.store.delete_image(p.tenant_id, image.image_id)
        if self.deps.image_deleted is not None:
            await self.deps.image_deleted(image)
