"""`/v1/definitions` and `/v1/images`: agent definitions (code and resources) and the images built
from them, with what each image pinned."""

# no `from __future__ import annotations`: FastAPI reads these annotations (Depends, Query) at run time

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from agentvm.api.plain_errors import json_path, plain_message
from agentvm.definitions import code_definition, code_definitions
from agentvm.domain.models import Image, Principal
from agentvm.errors import InvalidRequest, NotFound
from agentvm.protocol.commands import ImageConfig
from agentvm.services.use_cases import UseCases

JSON = dict[str, Any]


class BuildBody(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    container_id: str = Field(description="the container (workspace) the image belongs to")
    agent: str | None = Field(None, description="a code definition name or resource://agents/...")
    config: JSON = Field(default_factory=dict, description="image config (AgentX shape); wins over the definition")


def image_wire(image: Image) -> JSON:
    cfg = image.config
    return {"imageId": image.image_id, "containerId": image.container_id, "sessionId": image.session_id,
            "name": image.name, "description": image.description, "systemPrompt": image.system_prompt,
            "model": cfg.get("model"), "tools": cfg.get("tools", []), "knowledge": cfg.get("knowledge", []),
            "mcpServers": sorted(cfg.get("mcpServers") or {}), "pins": cfg.get("pins", {}),
            "sources": cfg.get("sources", {}), "createdAt": image.created_at, "updatedAt": image.updated_at}


def images_router(services: Callable[[], UseCases],
                  principal_for: Callable[[Request], Awaitable[Principal]]) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["definitions and images"])
    Caller = Annotated[Principal, Depends(principal_for)]

    @router.get("/definitions", summary="Agent definitions: registered in code, and agent resources")
    async def definitions(p: Caller) -> JSON:
        items: list[JSON] = [{"name": n, "source": "code", "description": c.get("description", "")}
                             for n, c in code_definitions().items()]
        agents, _ = await services().resources.discover(p, kind="agent", limit=200)
        items += [{"name": a.name, "source": "resource", "uri": f"resource://agents/{a.name}",
                   "version": a.version, "description": a.description} for a in agents]
        return {"items": items}

    @router.get("/definitions/{name}", summary="One definition's content")
    async def definition(name: str, p: Caller) -> JSON:
        code = code_definition(name)
        if code is not None:
            return {"name": name, "source": "code", "content": code}
        node = await services().resources.resolve(p, f"resource://agents/{name}")
        return {"name": name, "source": "resource", "uri": node.pinned, "content": node.resource.content}

    @router.post("/images", status_code=201, summary="Build an image: every reference resolved and pinned")
    async def build(body: BuildBody, p: Caller) -> JSON:
        raw = {**body.config, **({"agent": body.agent} if body.agent else {})}
        try:
            config = ImageConfig.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = json_path(err["loc"], raw)
            where = "agent" if where == "agent" and body.agent else f"config.{where}"
            raise InvalidRequest(f"{where}: {plain_message(err)}", field=where) from None
        return image_wire(await services().images.create(p, body.container_id, config))

    @router.get("/images", summary="Images of the caller, newest first")
    async def list_images(p: Caller, container_id: Annotated[str | None, Query(alias="containerId")] = None) -> JSON:
        images = await services().deps.store.list_images(p.tenant_id, container_id)
        return {"items": [image_wire(i) for i in images]}

    @router.get("/images/{image_id}", summary="One image, with its pinned resources")
    async def get_image(image_id: str, p: Caller) -> JSON:
        return image_wire(await services().images.require(p, image_id))

    @router.delete("/images/{image_id}", status_code=204, summary="Delete an image with its session")
    async def delete_image(image_id: str, p: Caller) -> Response:
        image = await services().images.get(p, image_id)
        if image is None:
            raise NotFound(f"Image not found: {image_id}", field="imageId")
        await services().images.delete(p, image)
        return Response(status_code=204)

    return router
