"""The resource center: register, discover, version, delete and resolve resources.

Everything addressable as `resource://<kind>s/<name>[@<version spec>]` (prompts, tools, sandboxes,
agents, knowledge) is a resource: immutable versions with a content hash, owned by a tenant and
readable by every tenant once published. A reference resolves to the highest version its spec
allows among those the caller may read (its own resource of that name first, else a published
one); `resolve` also resolves the dependencies, transitively, and refuses cycles and references
that do not resolve, naming the path that led there.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from agentvm.domain.models import RESOURCE_KINDS, Principal, ResourceVersion
from agentvm.domain.resource_uri import (
    ResourceRef,
    choose_version,
    is_valid_name,
    parse_resource_uri,
    resource_uri,
)
from agentvm.domain.sandbox_spec import check_sandbox_content
from agentvm.domain.semver import Version, version_key
from agentvm.errors import Conflict, InvalidRequest, NotFound
from agentvm.ids import now_ms, resource_id
from agentvm.ports import Store
from agentvm.tools.knowledge import check_content
from agentvm.tools.resource_tools import check_tool_content

JSON = dict[str, Any]

MAX_CONTENT_BYTES = 256 << 10  # as JSON: a version is one DynamoDB item (400 KB); big documents go to blobs
MAX_DEPENDENCIES = 64
# the content of these kinds is checked when a version is written (the others are free-form)
CONTENT_CHECKS: dict[str, Callable[[Mapping[str, Any]], None]] = {
    "knowledge": check_content, "tool": check_tool_content, "sandbox": check_sandbox_content}
MAX_TAGS = 32
MAX_DEPTH = 32


def content_hash(content: JSON) -> str:
    return "sha256:" + hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(slots=True)
class Resolved:
    """A resolved reference: the version chosen and what its dependencies resolved to."""

    uri: str  # the reference as asked
    resource: ResourceVersion
    dependencies: list[Resolved] = field(default_factory=list)

    @property
    def pinned(self) -> str:
        return resource_uri(self.resource.kind, self.resource.name, self.resource.version)

    def pins(self) -> dict[str, str]:
        """Every resource of the tree by its unversioned URI → the version it resolved to."""
        out = {resource_uri(self.resource.kind, self.resource.name): self.resource.version}
        for dep in self.dependencies:
            out.update(dep.pins())
        return out


class ResourceService:
    def __init__(self, store: Store) -> None:
        self.store = store

    # ---- writing ---------------------------------------------------------------------------------

    async def register(self, p: Principal, *, kind: str, name: str, version: str, content: JSON,
                       dependencies: list[str] | None = None, description: str = "",
                       tags: list[str] | None = None, published: bool = False) -> ResourceVersion:
        if kind not in RESOURCE_KINDS:
            raise InvalidRequest(f"kind: must be one of {', '.join(RESOURCE_KINDS)}", field="kind")
        if not is_valid_name(name):
            raise InvalidRequest("name: lowercase letters, digits, '.', '_' and '-', starting with a letter or "
                                 "digit, at most 100 characters", field="name")
        rv = await self._version(p, resource_id(), kind, name, version, content, dependencies, description,
                                 tags, published)
        await self.store.create_resource(rv)
        return rv

    async def add_version(self, p: Principal, rid: str, *, version: str, content: JSON,
                          dependencies: list[str] | None = None, description: str | None = None,
                          tags: list[str] | None = None, published: bool | None = None) -> ResourceVersion:
        """A new immutable version of the caller's own resource (omitted fields keep the latest's)."""
        versions = await self.store.resource_versions(p.tenant_id, rid)
        own = [v for v in versions if v.tenant_id == p.tenant_id]
        if not own:
            raise NotFound(f"Resource not found: {rid}", field="resourceId")
        latest = own[0]
        rv = await self._version(
            p, rid, latest.kind, latest.name, version, content,
            list(latest.dependencies) if dependencies is None else dependencies,
            latest.description if description is None else description,
            list(latest.tags) if tags is None else tags, latest.published if published is None else published)
        await self.store.add_resource_version(rv)
        return rv

    async def delete(self, p: Principal, rid: str, *, force: bool = False) -> None:
        """Delete every version; refused while an image of the caller pins it, unless forced."""
        versions = await self.store.resource_versions(p.tenant_id, rid)
        own = [v for v in versions if v.tenant_id == p.tenant_id]
        if not own:
            raise NotFound(f"Resource not found: {rid}", field="resourceId")
        if not force:
            uri = resource_uri(own[0].kind, own[0].name)
            pinned_by = [i.image_id for i in await self.store.list_images(p.tenant_id)
                         if uri in (i.config.get("pins") or {})]
            if pinned_by:
                raise Conflict(f"{uri} is pinned by {len(pinned_by)} image(s) ({', '.join(pinned_by[:5])}); "
                               "delete them first or delete with force=true")
        await self.store.delete_resource(p.tenant_id, rid)

    async def _version(self, p: Principal, rid: str, kind: str, name: str, version: str, content: JSON,
                       dependencies: list[str] | None, description: str, tags: list[str] | None,
                       published: bool) -> ResourceVersion:
        try:
            parsed = Version.parse(version)
        except ValueError as exc:
            raise InvalidRequest(f"version: {exc}", field="version") from exc
        if not isinstance(content, dict):
            raise InvalidRequest("content: must be a JSON object", field="content")
        check = CONTENT_CHECKS.get(kind)
        if check is not None:
            try:
                check(content)
            except ValueError as exc:
                raise InvalidRequest(f"content.{exc}", field="content") from None
        size = len(orjson.dumps(content))
        if size > MAX_CONTENT_BYTES:
            raise InvalidRequest(f"content: {size:,} bytes, more than {MAX_CONTENT_BYTES:,}", field="content")
        deps = list(dependencies or [])
        if len(deps) > MAX_DEPENDENCIES:
            raise InvalidRequest(f"dependencies: at most {MAX_DEPENDENCIES}", field="dependencies")
        tag_list = list(tags or [])
        if len(tag_list) > MAX_TAGS or any(not isinstance(t, str) or not 0 < len(t) <= 64 for t in tag_list):
            raise InvalidRequest(f"tags: at most {MAX_TAGS} tags of 1 to 64 characters", field="tags")
        for i, uri in enumerate(deps):
            try:
                ref = parse_resource_uri(uri)
            except ValueError as exc:
                raise InvalidRequest(f"dependencies[{i}]: {exc}", field="dependencies") from exc
            if (ref.kind, ref.name) == (kind, name):
                raise InvalidRequest(f"dependencies[{i}]: a resource cannot depend on itself", field="dependencies")
            # the graph stays valid: every dependency resolves now, and none leads back here
            await self._resolve(p, ref, uri, path=(resource_uri(kind, name),), depth=1)
        return ResourceVersion(
            tenant_id=p.tenant_id, resource_id=rid, kind=kind, name=name, version=str(parsed),
            version_key=version_key(parsed), content=content, content_hash=content_hash(content),
            dependencies=tuple(deps), description=description, tags=tuple(dict.fromkeys(tag_list)),
            published=published, created_at=now_ms())

    # ---- reading ---------------------------------------------------------------------------------

    async def get(self, p: Principal, rid: str) -> list[ResourceVersion]:
        """Every version the caller may read, highest first."""
        versions = await self.store.resource_versions(p.tenant_id, rid)
        if not versions:
            raise NotFound(f"Resource not found: {rid}", field="resourceId")
        return versions

    async def discover(self, p: Principal, *, kind: str | None = None, name: str | None = None,
                       tag: str | None = None, query: str | None = None, limit: int = 50,
                       cursor: str | None = None) -> tuple[list[ResourceVersion], str | None]:
        if kind is not None and kind not in RESOURCE_KINDS:
            raise InvalidRequest(f"kind: must be one of {', '.join(RESOURCE_KINDS)}", field="kind")
        if not 1 <= limit <= 200:
            raise InvalidRequest("limit: between 1 and 200", field="limit")
        return await self.store.list_resources(p.tenant_id, kind=kind, name=name, tag=tag, query=query,
                                                    limit=limit, cursor=cursor)

    async def resolve(self, p: Principal, uri: str) -> Resolved:
        try:
            ref = parse_resource_uri(uri)
        except ValueError as exc:
            raise InvalidRequest(f"uri: {exc}", field="uri") from exc
        return await self._resolve(p, ref, uri, path=(), depth=0)

    async def _resolve(self, p: Principal, ref: ResourceRef, uri: str, *, path: tuple[str, ...],
                       depth: int) -> Resolved:
        key = ref.unversioned
        if key in path:
            cycle = " → ".join([*path[path.index(key):], key])
            raise InvalidRequest(f"dependency cycle: {cycle}", field="dependencies")
        if depth > MAX_DEPTH:
            raise InvalidRequest(f"dependencies nest deeper than {MAX_DEPTH} levels at {uri}", field="dependencies")
        versions = await self.store.find_resource(p.tenant_id, ref.kind, ref.name)
        chosen = choose_version(versions, ref.spec)
        if chosen is None:
            via = f" (required by {' → '.join(path)})" if path else ""
            what = "no resource" if not versions else f"no version matching '{ref.spec}'"
            raise NotFound(f"{uri}: {what}{via}", field="uri")
        node = Resolved(uri, chosen)
        for dep in chosen.dependencies:
            node.dependencies.append(await self._resolve(p, parse_resource_uri(dep), dep, path=(*path, key),
                                                         depth=depth + 1))
        return node
