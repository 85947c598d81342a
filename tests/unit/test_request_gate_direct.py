"""The request gate calls a `direct` route's endpoint itself (agentvm/api/request_gate.py, point 3): only a
listed route whose endpoint takes the request alone; its body is still counted against its limit."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentvm.api.request_gate import BodyLimit, RequestGate
from agentvm.errors import PayloadTooLarge

LIMIT = 100


def _app() -> FastAPI:
    app = FastAPI()
    router = APIRouter()

    async def seen(request: Request) -> Response:
        body = await request.body()
        # the router puts the route it matched into the scope: a direct call never went through it
        return JSONResponse({"routed": "route" in request.scope, "bytes": len(body)})

    async def streamed(request: Request) -> Response:
        async def parts() -> Any:
            yield b"a"
            yield b"b"
        return StreamingResponse(parts(), media_type="text/plain")

    async def with_param(request: Request, n: int = 0) -> Response:
        return JSONResponse({"routed": "route" in request.scope, "n": n})

    router.add_api_route("/direct", seen, methods=["POST"])
    router.add_api_route("/stream", streamed, methods=["POST"])
    router.add_api_route("/param", with_param, methods=["POST"])
    router.add_api_route("/routed", seen, methods=["POST"])
    app.include_router(router)
    limit = BodyLimit(lambda: LIMIT, lambda n: PayloadTooLarge(f"body: over {n}", field="body"))
    app.add_middleware(RequestGate, routes=lambda: router.routes, public=(), callers=(), default_caller=None,
                       default_limit=limit, direct=("/direct", "/stream", "/param"))
    return app


async def test_a_direct_route_is_called_by_the_gate_and_the_others_through_the_router() -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://t") as client:
        assert (await client.post("/direct", content=b"x" * 10)).json() == {"routed": False, "bytes": 10}
        assert (await client.post("/routed", content=b"x" * 10)).json() == {"routed": True, "bytes": 10}
        # an endpoint with a parameter is FastAPI's to resolve, listed or not
        assert (await client.post("/param?n=3")).json() == {"routed": True, "n": 3}
        assert (await client.post("/stream")).text == "ab"
        assert (await client.get("/direct")).status_code == 405  # the wrong method: the router's answer


async def test_a_direct_routes_body_is_still_cut_at_its_limit() -> None:
    async def chunks() -> Any:
        for _ in range(5):
            yield b"y" * 40

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://t") as client:
        declared = await client.post("/direct", content=b"x" * (LIMIT + 1))
        streamed = await client.post("/direct", content=chunks())
    assert declared.status_code == streamed.status_code == 413
    assert streamed.json() == {"error": {"code": "payload_too_large", "message": "body: over 100", "field": "body"}}
