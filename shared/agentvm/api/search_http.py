"""`GET /v1/sessions/search`: full-text search over the caller's messages (every session of every
image of its tenant), best first, with HTML snippets (`<mark>` around the matches) and pages.

Included before the `/v1/sessions/{id}` routes, so `search` is never read as a session id."""

# no `from __future__ import annotations`: FastAPI reads these annotations (Depends, Query) at run time

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from agentvm.domain.models import Principal, SearchHit
from agentvm.services.session_search import DEFAULT_LIMIT, MAX_LIMIT, MAX_QUERY_CHARS, SessionSearch
from agentvm.services.use_cases import UseCases

JSON = dict[str, Any]


def hit_wire(hit: SearchHit) -> JSON:
    return {"sessionId": hit.session_id, "imageId": hit.image_id, "messageId": hit.message_id, "role": hit.role,
            "subtype": hit.subtype, "timestamp": hit.timestamp, "snippet": hit.snippet}


def search_router(services: Callable[[], UseCases],
                  principal_for: Callable[[Request], Awaitable[Principal]]) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["sessions"])
    Caller = Annotated[Principal, Depends(principal_for)]

    @router.get("/sessions/search", summary="Full-text search of the caller's messages, best first",
                description=("Every word of `q` must appear (stemmed, case and accents folded); `q` is "
                             "plain words, never search syntax. `snippet` is HTML: the text around the "
                             "matches, escaped, each match in `<mark>…</mark>`. Pass `nextCursor` back as "
                             "`cursor` for the next page; a page may be short (even empty) while "
                             "`nextCursor` is set: the search is over when it is null."))
    async def search(p: Caller,
                     q: Annotated[str, Query(min_length=1, max_length=MAX_QUERY_CHARS, description="words")],
                     limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
                     cursor: Annotated[str | None, Query(max_length=4096)] = None) -> JSON:
        hits, next_cursor = await SessionSearch(services().deps.store).search(p, q, limit=limit, cursor=cursor)
        return {"items": [hit_wire(h) for h in hits], "nextCursor": next_cursor}

    return router
