"""`/v1/auth/keys`: a tenant's API keys. The token of a new key is in the creation answer only."""

# no `from __future__ import annotations`: FastAPI reads these annotations (Depends) at run time

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from agentvm.ids import now_ms
from agentvm.services.keys import Caller, KeyService, key_wire

JSON = dict[str, Any]


Scope = Literal["user", "admin"]


def _user_only() -> list[Scope]:
    return ["user"]


class NewKey(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    scopes: list[Scope] = Field(default_factory=_user_only, min_length=1, max_length=2)
    name: str | None = Field(None, min_length=1, max_length=100, description="a label to recognise the key by")
    expires_days: int | None = Field(None, ge=1, le=3650, description="expire after this many days")


def keys_router(keys: Callable[[], KeyService], caller_for: Callable[[Request], Awaitable[Caller]]) -> APIRouter:
    router = APIRouter(prefix="/v1/auth", tags=["API keys"])
    Who = Annotated[Caller, Depends(caller_for)]

    @router.post("/keys", status_code=201, summary="Create a key of the caller's tenant (admin); the token once")
    async def create(body: NewKey, caller: Who) -> JSON:
        key, token = await keys().create(caller, scopes=list(body.scopes), name=body.name,
                                         expires_days=body.expires_days)
        return {**key_wire(key, now_ms()), "token": token}

    @router.get("/keys", summary="The caller's tenant's keys, newest first (no secrets)")
    async def listing(caller: Who) -> JSON:
        now = now_ms()
        return {"items": [key_wire(k, now) for k in await keys().list(caller)]}

    @router.delete("/keys/{key_id}", status_code=204, summary="Revoke a key (admin)")
    async def revoke(key_id: str, caller: Who) -> Response:
        await keys().revoke(caller, key_id)
        return Response(status_code=204)

    return router
