"""Sessions over HTTP: an image may have several (each one conversation with the image's pinned
snapshot), created, read, listed and deleted here; a message sent to one queues a turn on it.
Following a turn live is the WebSocket's (`message_send_request` with `sessionId`) or the SSE chat
API's; here a turn is read back once it has ended (`/v1/sessions/{id}/turns`)."""

# no `from __future__ import annotations`: FastAPI reads these annotations (Depends, Body) at run time

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from agentvm.api.images_http import image_wire
from agentvm.domain.models import Image, Principal, Session, Turn
from agentvm.ids import MAX_EPOCH_MS
from agentvm.protocol.commands import content_not_empty
from agentvm.protocol.messages import UserContent, content_wire
from agentvm.services.image_sessions import MAX_TITLE_CHARS
from agentvm.services.use_cases import UseCases

JSON = dict[str, Any]


class _Body(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class NewSession(_Body):
    title: str | None = Field(None, max_length=MAX_TITLE_CHARS, description="shown in session lists")


class NewMessage(_Body):
    content: UserContent = Field(description="text, or content parts as in message_send_request")

    _not_empty = field_validator("content")(content_not_empty)


def session_wire(session: Session, image: Image | None = None) -> JSON:
    out: JSON = {"sessionId": session.session_id, "imageId": session.image_id,
                 "containerId": session.container_id, "title": session.title,
                 "createdAt": session.created_at, "updatedAt": session.updated_at}
    if image is not None:
        out["primary"] = image.session_id == session.session_id
    return out


def turn_wire(turn: Turn) -> JSON:
    u = turn.usage
    return {"turnId": turn.turn_id, "sessionId": turn.session_id, "imageId": turn.image_id,
            "containerId": turn.container_id, "userMessageId": turn.user_message_id,
            "agent": turn.agent, "task": turn.task, "options": turn.options,
            "status": str(turn.status), "tier": turn.tier, "model": turn.model, "durationMs": turn.duration_ms,
            "firstTokenMs": turn.first_token_ms,
            "usage": {"inputTokens": u.input_tokens, "outputTokens": u.output_tokens,
                      "cacheReadTokens": u.cache_read_tokens, "cacheWriteTokens": u.cache_write_tokens},
            "listCost": turn.list_cost, "billedCost": turn.billed_cost,
            "error": ({"code": turn.error_code, "message": turn.error_message} if turn.error_code else None),
            "createdAt": turn.created_at, "startedAt": turn.started_at, "endedAt": turn.ended_at}


def sessions_router(services: Callable[[], UseCases],
                    principal_for: Callable[[Request], Awaitable[Principal]]) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["sessions"])
    Caller = Annotated[Principal, Depends(principal_for)]

    @router.post("/images/{image_id}/sessions", status_code=201,
                 summary="A new session of an image: a conversation with the image as it was built")
    async def create(image_id: str, p: Caller, body: NewSession | None = None) -> JSON:
        s = services()
        session = await s.image_sessions.create(p, image_id, body.title if body else None)
        return session_wire(session, await s.images.require(p, image_id))

    @router.get("/images/{image_id}/sessions", summary="The sessions of an image, oldest (the primary) first")
    async def of_image(image_id: str, p: Caller) -> JSON:
        s = services()
        image = await s.images.require(p, image_id)
        return {"items": [session_wire(x, image) for x in await s.image_sessions.of_image(p, image_id)]}

    @router.get("/sessions", summary="The caller's sessions, newest first, in pages",
                description=("Every session of every image of the caller's tenant (of one image with "
                             "`imageId`), newest first by creation. Pass `nextCursor` back as `cursor` for "
                             "the next page; the list is over when it is null."))
    async def listed(p: Caller,
                     image_id: Annotated[str | None, Query(alias="imageId", min_length=1, max_length=200,
                                                           description="only this image's sessions")] = None,
                     limit: Annotated[int, Query(ge=1, le=200)] = 50,
                     cursor: Annotated[str | None, Query(max_length=200)] = None) -> JSON:
        items, next_cursor = await services().image_sessions.page(p, image_id, limit=limit, cursor=cursor)
        return {"items": [session_wire(x) for x in items], "nextCursor": next_cursor}

    @router.get("/sessions/{session_id}", summary="One session, with the image (and pins) it runs with")
    async def get(session_id: str, p: Caller) -> JSON:
        session, image = await services().image_sessions.with_image(p, session_id)
        primary = await services().images.require(p, image.image_id)
        return {**session_wire(session, primary), "image": image_wire(primary)}

    @router.delete("/sessions/{session_id}", status_code=204,
                   summary="Delete a session with its history (the primary one goes with its image)")
    async def delete(session_id: str, p: Caller) -> Response:
        await services().image_sessions.delete(p, session_id)
        return Response(status_code=204)

    @router.get("/sessions/{session_id}/messages", summary="The session's conversation, oldest first")
    async def messages(session_id: str, p: Caller) -> JSON:
        history = await services().image_sessions.messages(p, session_id)
        return {"items": [m.body for m in history]}

    @router.post("/sessions/{session_id}/messages", status_code=202,
                 summary="Store a user message and queue its turn (durable once answered)")
    async def send(session_id: str, body: NewMessage, p: Caller) -> JSON:
        s = services()
        session = await s.image_sessions.get(p, session_id)
        image, agent, turn = await s.turns.send(p, None, session.image_id, None, content_wire(body.content),
                                                session_id)
        return {"sessionId": image.session_id, "imageId": image.image_id, "agentId": agent.agent_id,
                "turnId": turn.turn_id, "messageId": turn.user_message_id}

    @router.get("/sessions/{session_id}/turns", summary="The session's turns: status, tier, usage, cost, error")
    async def turns(session_id: str, p: Caller) -> JSON:
        return {"items": [turn_wire(t) for t in await services().image_sessions.turns(p, session_id)]}

    @router.get("/turns", summary="The caller's turn log: finished turns, newest first")
    async def turn_log(p: Caller,
                       since: Annotated[int | None, Query(ge=0, le=MAX_EPOCH_MS, description="epoch ms, inclusive")]
                       = None,
                       until: Annotated[int | None, Query(ge=0, le=MAX_EPOCH_MS, description="epoch ms, exclusive")]
                       = None,
                       limit: Annotated[int, Query(ge=1, le=200)] = 50,
                       cursor: Annotated[str | None, Query(max_length=200)] = None) -> JSON:
        items, next_cursor = await services().deps.store.list_tenant_turns(
            p.tenant_id, since_ms=since, until_ms=until, limit=limit, cursor=cursor)
        return {"items": [turn_wire(t) for t in items], "nextCursor": next_cursor}

    return router
