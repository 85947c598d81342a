"""`/v1/config`: the config center over HTTP (layered values, secrets masked, audited updates)."""

# no `from __future__ import annotations`: FastAPI reads these annotations (Depends, Query) at run time

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict

from agentvm.domain.models import Principal
from agentvm.services.config import ConfigService

JSON = dict[str, Any]


class SetBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: Any


def config_router(service: Callable[[], ConfigService],
                  principal_for: Callable[[Request], Awaitable[Principal]]) -> APIRouter:
    router = APIRouter(prefix="/v1/config", tags=["config"])
    Caller = Annotated[Principal, Depends(principal_for)]

    def actor(p: Principal) -> str:
        return p.key_id or "local"

    @router.get("", summary="Every key: effective value, source, layers (secrets masked)")
    async def all_values(_p: Caller) -> JSON:
        return {"values": await service().describe()}

    @router.get("/audit", summary="Changes of the runtime layer, newest first")
    async def audit(_p: Caller, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> JSON:
        changes = await service().changes(limit)
        return {"changes": [{"key": c.key, "old": c.old, "new": c.new, "actor": c.actor, "at": c.at}
                            for c in changes]}

    @router.get("/{key}", summary="One key")
    async def one(key: str, _p: Caller) -> JSON:
        return {"key": key, **(await service().describe(key))[key]}

    @router.put("/{key}", summary="Set a key in the runtime layer (validated, persisted, audited)")
    async def set_value(key: str, body: SetBody, p: Caller) -> JSON:
        return {"key": key, **(await service().set(key, body.value, actor=actor(p)))[key]}

    @router.delete("/{key}", summary="Remove a key from the runtime layer (the lower layers apply again)")
    async def unset(key: str, p: Caller) -> JSON:
        return {"key": key, **(await service().unset(key, actor=actor(p)))[key]}

    return router
