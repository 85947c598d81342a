"""`/v1/resources`: the resource center over HTTP (register, discover, versions, delete, resolve)."""

# no `from __future__ import annotations`: FastAPI reads these annotations (Depends, Query) at run time

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from agentvm.domain.models import Principal, ResourceVersion
from agentvm.domain.resource_uri import resource_uri
from agentvm.services.resources import Resolved, ResourceService

JSON = dict[str, Any]


class _Body(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class RegisterBody(_Body):
    kind: str = Field(description="prompt, tool, sandbox, agent or knowledge")
    name: str = Field(description="lowercase name, unique per kind within the tenant")
    version: str = Field(description="semantic version, e.g. 1.0.0")
    content: JSON = Field(description="the resource itself (kind-specific JSON)")
    dependencies: list[str] = Field(default_factory=list, description="resource:// URIs, with version specs")
    description: str = Field("", max_length=2000)
    tags: list[str] = Field(default_factory=list)
    published: bool = Field(False, description="readable by every tenant")


class VersionBody(_Body):
    version: str
    content: JSON
    dependencies: list[str] | None = None
    description: str | None = Field(None, max_length=2000)
    tags: list[str] | None = None
    published: bool | None = None


def wire(rv: ResourceVersion, *, principal: Principal, with_content: bool) -> JSON:
    out: JSON = {
        "resourceId": rv.resource_id, "kind": rv.kind, "name": rv.name, "version": rv.version,
        "uri": resource_uri(rv.kind, rv.name, rv.version), "contentHash": rv.content_hash,
        "dependencies": list(rv.dependencies), "description": rv.description, "tags": list(rv.tags),
        "published": rv.published, "own": rv.tenant_id == principal.tenant_id, "createdAt": rv.created_at}
    if with_content:
        out["content"] = rv.content
    return out


def _tree(node: Resolved, principal: Principal) -> JSON:
    return {"uri": node.uri, "resolved": node.pinned, "resource": wire(node.resource, principal=principal,
                                                                          with_content=False),
            "dependencies": [_tree(d, principal) for d in node.dependencies]}


def resources_router(service: Callable[[], ResourceService],
                     principal_for: Callable[[Request], Awaitable[Principal]]) -> APIRouter:
    router = APIRouter(prefix="/v1/resources", tags=["resources"])
    Caller = Annotated[Principal, Depends(principal_for)]

    @router.post("", status_code=201, summary="Register a resource (its first version)")
    async def register(body: RegisterBody, p: Caller) -> JSON:
        rv = await service().register(p, kind=body.kind, name=body.name, version=body.version,
                                      content=body.content, dependencies=body.dependencies,
                                      description=body.description, tags=body.tags, published=body.published)
        return wire(rv, principal=p, with_content=True)

    @router.get("", summary="Discover resources (the latest version of each)")
    async def discover(p: Caller, kind: str | None = None, name: str | None = None, tag: str | None = None,
                       q: str | None = None, limit: Annotated[int, Query(ge=1, le=200)] = 50,
                       cursor: str | None = None) -> JSON:
        items, next_cursor = await service().discover(p, kind=kind, name=name, tag=tag, query=q, limit=limit,
                                                      cursor=cursor)
        return {"items": [wire(i, principal=p, with_content=False) for i in items], "nextCursor": next_cursor}

    @router.get("/resolve", summary="Resolve a resource:// reference with its dependency tree")
    async def resolve(p: Caller, uri: str) -> JSON:
        node = await service().resolve(p, uri)
        return {"resource": wire(node.resource, principal=p, with_content=True), "resolved": node.pinned,
                "dependencies": [_tree(d, p) for d in node.dependencies], "pins": node.pins()}

    @router.get("/{resource_id}", summary="A resource: one version (default the latest) and the list of versions")
    async def get(resource_id: str, p: Caller, version: str | None = None) -> JSON:
        versions = await service().get(p, resource_id)
        chosen = versions[0] if version is None else next((v for v in versions if v.version == version), None)
        if chosen is None:
            from agentvm.errors import NotFound

            raise NotFound(f"Version {version} of {resource_id} not found", field="version")
        return {**wire(chosen, principal=p, with_content=True),
                "versions": [{"version": v.version, "contentHash": v.content_hash, "createdAt": v.created_at}
                             for v in versions]}

    @router.put("/{resource_id}", status_code=201, summary="Publish a new (immutable) version")
    async def add_version(resource_id: str, body: VersionBody, p: Caller) -> JSON:
        rv = await service().add_version(p, resource_id, version=body.version, content=body.content,
                                         dependencies=body.dependencies, description=body.description,
                                         tags=body.tags, published=body.published)
        return wire(rv, principal=p, with_content=True)

    @router.delete("/{resource_id}", status_code=204, summary="Delete every version")
    async def delete(resource_id: str, p: Caller, force: bool = False) -> Response:
        await service().delete(p, resource_id, force=force)
        return Response(status_code=204)

    return router
