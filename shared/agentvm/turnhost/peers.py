"""The turn host's internal endpoint (AVM_TURN_HOST_PEER_PORT, reachable only inside the tasks'
security group): other turn hosts, and functions with a route to it, post frames for this host's
sockets here, shaped like API Gateway's management API:

* `POST /@connections/{id}`, the frame as the body: 200 (queued for the socket) or 410 (gone);
* `DELETE /@connections/{id}`: close the socket (1008, after what was queued): 204 or 410.

Every request must carry `Authorization: Bearer <token>`, the random token this host wrote into its
registry item: anything else is 401 and nothing is delivered. An empty token refuses everything
(fail closed). A body above `max_bytes` (AVM_MAX_FRAME_BYTES, what a socket takes from its client) is
413, refused by its declared length or cut off while it is read. Nothing else is served (404); a
frame is never logged.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from agentvm.protocol.frames import POLICY_VIOLATION
from agentvm.turnhost.front import HostSockets

log = logging.getLogger("agentvm.turnhost.peers")

PREFIX = "/@connections/"
DEFAULT_MAX_BYTES = 4 * 1024 * 1024  # config.py's max_frame_bytes default


class _TooLarge(Exception):
    pass


class PeerEndpoint:
    def __init__(self, sockets: HostSockets, token: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.sockets = sockets
        self.max_bytes = max_bytes
        self._expected = f"Bearer {token}".encode() if token else b""
        #: requests by outcome: "posted" | "gone" | "closed" | "refused"
        self.counts: dict[str, int] = {"posted": 0, "gone": 0, "closed": 0, "refused": 0}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        response = await self._handle(Request(scope, receive))
        await response(scope, receive, send)

    def _authorized(self, request: Request) -> bool:
        given = request.headers.get("authorization", "").encode()
        return bool(self._expected) and hmac.compare_digest(given, self._expected)

    async def _handle(self, request: Request) -> Response:
        path = request.url.path
        if not path.startswith(PREFIX) or len(path) == len(PREFIX):
            return PlainTextResponse("not found", 404)
        if not self._authorized(request):
            self.counts["refused"] += 1
            log.warning("a frame post was refused: missing or wrong token")
            return PlainTextResponse("unauthorized", 401)
        cid = unquote(path[len(PREFIX):])
        if request.method == "POST":
            try:
                body = await self._body(request)
            except _TooLarge:
                return PlainTextResponse(f"the frame is larger than {self.max_bytes} bytes", 413)
            try:
                frame = body.decode()
            except UnicodeDecodeError:
                return PlainTextResponse("the frame is not UTF-8 text", 400)
            if await self.sockets.post(cid, frame):
                self.counts["posted"] += 1
                return Response(status_code=200)
            self.counts["gone"] += 1
            return PlainTextResponse("gone", 410)
        if request.method == "DELETE":
            if await self.sockets.close(cid, POLICY_VIOLATION, "unauthorized"):
                self.counts["closed"] += 1
                return Response(status_code=204)
            return PlainTextResponse("gone", 410)
        return PlainTextResponse("method not allowed", 405)

    async def _body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise _TooLarge
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
        return b"".join(chunks)
