"""The AgentX command router: one client frame in, responses and events out.

Transport-neutral: the local WebSocket endpoint and the cloud `$default` handler both call
`handle_frame`. Every `*_request` with a usable requestId gets exactly one response; failures send
`system_error` to the requester first (spec §2.1). Nothing a client sends is echoed to others.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from agentvm.api.plain_errors import json_path, plain_message
from agentvm.domain.models import Principal
from agentvm.errors import AgentVMError, InvalidRequest, public_message
from agentvm.observability import tracing
from agentvm.ports import Fanout
from agentvm.protocol import commands as cmd
from agentvm.protocol.envelope import Inbound, classify, encode, event, response
from agentvm.protocol.events import SystemError
from agentvm.protocol.messages import content_wire
from agentvm.protocol.refused import refused_request
from agentvm.services.use_cases import UseCases

log = logging.getLogger(__name__)

Handler = Callable[[Principal, str, Any], Awaitable[cmd.ResponseData]]


def validation_message(where: str, exc: ValidationError, data: Any = None) -> tuple[str, str]:
    """A one-line message in plain words naming the most specific invalid field, and that field's
    JSON path (`data.content[0].text`)."""
    errors = exc.errors()
    # For unions, the deepest error belongs to the branch that matched the input's shape.
    err = max(errors, key=lambda e: len(json_path(e["loc"], data)))
    loc = json_path(err["loc"], data)
    path = "data" if loc == "body" else f"data{loc}" if loc.startswith("[") else f"data.{loc}"
    return f"{where}: {path}: {plain_message(err)}", path


def _command(frame: Inbound) -> str | None:
    """A request's command name for its span (a known one only: the client chooses the text)."""
    if frame.kind != "request":
        return None
    name = str(frame.body.get("type"))[: -len("_request")]
    return name if name in cmd.COMMANDS else "unknown"


class CommandRouter:
    def __init__(self, services: UseCases, fanout: Fanout, *, frame_traces: bool = False) -> None:
        """`frame_traces`: each frame's span is the root of a trace of its own, linked to the current
        span (`avm serve`: its connection's, open for hours); else a child of the current span (a
        Lambda invocation's)."""
        self.s = services
        self.fanout = fanout
        self.frame_traces = frame_traces
        self._handlers: dict[str, Handler] = {
            "container_create": self._container_create,
            "container_get": self._container_get,
            "container_list": self._container_list,
            "image_create": self._image_create,
            "image_run": self._image_run,
            "image_stop": self._image_stop,
            "image_update": self._image_update,
            "image_list": self._image_list,
            "image_get": self._image_get,
            "image_delete": self._image_delete,
            "image_messages": self._image_messages,
            "message_send": self._message_send,
            "agent_interrupt": self._agent_interrupt,
            "agent_get": self._agent_get,
            "agent_list": self._agent_list,
            "agent_destroy": self._agent_destroy,
            "agent_destroy_all": self._agent_destroy_all,
        }
        assert set(self._handlers) == set(cmd.COMMANDS)

    # ---- frames ------------------------------------------------------------------------------

    async def handle_frame(self, principal: Principal, connection_id: str, text: str | bytes) -> None:
        frame = classify(text)
        if frame.kind == "ack":
            return  # transport-level: no span
        with tracing.span("ws.message", {"agentvm.frame": frame.kind, "agentvm.command": _command(frame),
                                         "agentvm.tenant_id": principal.tenant_id,
                                         "agentvm.connection_id": connection_id}, new_trace=self.frame_traces):
            await self._handle_frame(principal, connection_id, frame, text)

    async def _handle_frame(self, principal: Principal, connection_id: str, frame: Inbound, text: str | bytes) -> None:
        if frame.kind == "invalid":  # ignored (spec §1.2), unless it is JSON the parser refused
            refused = refused_request(text)
            if refused is None:
                return
            error = InvalidRequest(refused.message, field=refused.field)
            if refused.name is not None and refused.request_id is not None:
                self._fail(connection_id, refused.name, refused.request_id, error, None)
            else:  # no requestId to answer: say why in a system_error, as for a readable frame
                self._system_error(connection_id, error, None, None)
            return
        if frame.kind in ("ack", "auth"):
            return  # ACKs are transport-level; auth at the edge
        if frame.kind == "subscribe":
            await self._subscribe(principal, connection_id, frame.body)
        elif frame.kind == "request":
            await self._request(principal, connection_id, frame.body)
        else:
            t = frame.body.get("type")
            label = f"'{t}'" if isinstance(t, str) else "without a type"
            self._system_error(connection_id, InvalidRequest(
                f"Unsupported frame {label}: send *_request commands, subscribe, auth or ACK frames",
                field="type"), None, None)

    async def _subscribe(self, p: Principal, connection_id: str, body: dict[str, Any]) -> None:
        sid = body.get("sessionId")
        after = body.get("afterSeq")
        if not isinstance(sid, str) or not sid:
            self._system_error(connection_id, InvalidRequest("subscribe: sessionId: must be a non-empty string",
                                                             field="sessionId"), None, None)
            return
        if after is not None and (not isinstance(after, int) or isinstance(after, bool) or after < 0):
            self._system_error(connection_id, InvalidRequest(
                "subscribe: afterSeq: must be a non-negative integer", field="afterSeq"), None, None)
            return
        try:
            await self.s.sessions.subscribe(p.tenant_id, connection_id, sid, after)
        except AgentVMError as exc:
            self._system_error(connection_id, exc, None, None)

    async def _request(self, p: Principal, connection_id: str, body: dict[str, Any]) -> None:
        type_: str = body["type"]
        name = type_[: -len("_request")]
        data = body.get("data")
        request_id = data.get("requestId") if isinstance(data, dict) else None
        if not isinstance(request_id, str) or not request_id:
            where = "data.requestId" if isinstance(data, dict) else "data"
            problem = "is required" if request_id is None else "must be a non-empty string"
            if not isinstance(data, dict):
                problem = "must be an object"
            self._system_error(connection_id, InvalidRequest(f"{type_}: {where}: {problem}", field=where),
                               None, None)
            return
        model = cmd.COMMANDS.get(name)
        if model is None:
            self._fail(connection_id, name, request_id,
                       InvalidRequest(f"Unknown request type: {type_}", field="type"), None)
            return
        try:
            req = model.model_validate(data)
        except ValidationError as exc:
            message, path = validation_message(type_, exc, data)
            self._fail(connection_id, name, request_id, InvalidRequest(message, field=path), None)
            return
        container_id = getattr(req, "container_id", None)
        if isinstance(container_id, str):
            self.fanout.watch(connection_id, container_id)
        try:
            result = await self._handlers[name](p, connection_id, req)
        except AgentVMError as exc:
            self._fail(connection_id, name, request_id, exc, _lookup_context(data))
            return
        except Exception as exc:
            log.exception("command failed", extra={"command": name, "request_id": request_id})
            self._fail(connection_id, name, request_id, exc, _lookup_context(data))
            return
        self.fanout.to_connection(connection_id, encode(response(name, result)))

    def _fail(self, connection_id: str, name: str, request_id: str, exc: Exception,
              context: dict[str, str] | None) -> None:
        self._system_error(connection_id, exc, request_id, context)
        model = cmd.RESPONSES.get(name, cmd.ResponseData)
        fields: dict[str, Any] = dict(cmd.ERROR_FALLBACKS.get(name, {}))
        for key in ("image_id", "container_id", "agent_id"):
            if key in model.model_fields and context and _camel(key) in context and key not in fields:
                fields[key] = context[_camel(key)]
        code = exc.code if isinstance(exc, AgentVMError) else "internal_error"
        data = model(request_id=request_id, error=public_message(exc), error_code=code, **fields)
        self.fanout.to_connection(connection_id, encode(response(name, data)))

    def _system_error(self, connection_id: str, exc: Exception, request_id: str | None,
                      context: dict[str, str] | None) -> None:
        code = exc.code if isinstance(exc, AgentVMError) else "internal_error"
        data = SystemError(message=public_message(exc), severity="error", code=code)
        if request_id is not None:
            data.request_id = request_id
        self.fanout.to_connection(connection_id, encode(event("system_error", data, context or None)))

    # ---- containers --------------------------------------------------------------------------

    async def _container_create(self, p: Principal, conn: str, r: cmd.ContainerCreateRequest) -> cmd.ResponseData:
        await self.s.containers.ensure(p, r.container_id)
        return cmd.ContainerCreateResponse(request_id=r.request_id, container_id=r.container_id)

    async def _container_get(self, p: Principal, conn: str, r: cmd.ContainerGetRequest) -> cmd.ResponseData:
        found = await self.s.containers.get(p, r.container_id)
        if found is None:
            return cmd.ContainerGetResponse(request_id=r.request_id, exists=False)
        return cmd.ContainerGetResponse(request_id=r.request_id, container_id=found.container_id, exists=True)

    async def _container_list(self, p: Principal, conn: str, r: cmd.ContainerListRequest) -> cmd.ResponseData:
        ids = [c.container_id for c in await self.s.containers.list(p)]
        return cmd.ContainerListResponse(request_id=r.request_id, container_ids=ids)

    # ---- images ------------------------------------------------------------------------------

    async def _image_create(self, p: Principal, conn: str, r: cmd.ImageCreateRequest) -> cmd.ResponseData:
        image = await self.s.images.create(p, r.container_id, r.config)
        self.fanout.attach(conn, image.session_id, image.container_id)
        item = await self.s.images.item(p, image)
        return cmd.ImageCreateResponse(request_id=r.request_id, record=item, subscriptions=[image.session_id])

    async def _image_run(self, p: Principal, conn: str, r: cmd.ImageRunRequest) -> cmd.ResponseData:
        image = await self.s.images.require(p, r.image_id)
        self.fanout.attach(conn, image.session_id, image.container_id)
        agent, created = await self.s.agents.ensure(p, image)
        return cmd.ImageRunResponse(request_id=r.request_id, image_id=image.image_id, agent_id=agent.agent_id,
                                    reused=not created)

    async def _image_stop(self, p: Principal, conn: str, r: cmd.ImageStopRequest) -> cmd.ResponseData:
        image = await self.s.images.require(p, r.image_id)
        self.fanout.watch(conn, image.container_id)
        agent = await self.s.agents.get_for_image(p, image)
        if agent is not None:
            await self.s.agents.destroy(p, agent, image)
        return cmd.ImageStopResponse(request_id=r.request_id, image_id=image.image_id)

    async def _image_update(self, p: Principal, conn: str, r: cmd.ImageUpdateRequest) -> cmd.ResponseData:
        image = await self.s.images.update(p, r.image_id, r.updates.name, r.updates.description)
        return cmd.ImageUpdateResponse(request_id=r.request_id, record=await self.s.images.item(p, image))

    async def _image_list(self, p: Principal, conn: str, r: cmd.ImageListRequest) -> cmd.ResponseData:
        items = await self.s.images.list_items(p, r.container_id)
        return cmd.ImageListResponse(request_id=r.request_id, records=items,
                                     subscriptions=[i.session_id for i in items])

    async def _image_get(self, p: Principal, conn: str, r: cmd.ImageGetRequest) -> cmd.ResponseData:
        image = await self.s.images.get(p, r.image_id)
        if image is None:
            return cmd.ImageGetResponse(request_id=r.request_id, record=None)
        return cmd.ImageGetResponse(request_id=r.request_id, record=await self.s.images.item(p, image),
                                    subscriptions=[image.session_id])

    async def _image_delete(self, p: Principal, conn: str, r: cmd.ImageDeleteRequest) -> cmd.ResponseData:
        image = await self.s.images.require(p, r.image_id)
        self.fanout.watch(conn, image.container_id)
        await self.s.images.delete(p, image)
        return cmd.ImageDeleteResponse(request_id=r.request_id, image_id=r.image_id)

    async def _image_messages(self, p: Principal, conn: str, r: cmd.ImageMessagesRequest) -> cmd.ResponseData:
        image = await self.s.image_sessions.view(p, await self.s.images.require(p, r.image_id), r.session_id)
        history = await self.s.image_sessions.history(image)
        out = cmd.ImageMessagesResponse(request_id=r.request_id, image_id=r.image_id,
                                        messages=[m.body for m in history])
        if r.session_id is not None:
            out.session_id = image.session_id
        return out

    # ---- turns -------------------------------------------------------------------------------

    async def _message_send(self, p: Principal, conn: str, r: cmd.MessageSendRequest) -> cmd.ResponseData:
        image, agent, _turn = await self.s.turns.send(p, conn, r.image_id, r.agent_id, content_wire(r.content),
                                                      r.session_id)
        return cmd.MessageSendResponse(request_id=r.request_id, image_id=image.image_id, agent_id=agent.agent_id,
                                       session_id=image.session_id)

    async def _agent_interrupt(self, p: Principal, conn: str, r: cmd.AgentInterruptRequest) -> cmd.ResponseData:
        image, agent = await self.s.turns.interrupt(p, conn, r.image_id, r.agent_id, r.session_id)
        out = cmd.AgentInterruptResponse(request_id=r.request_id, image_id=image.image_id)
        if agent is not None:
            out.agent_id = agent.agent_id
        return out

    # ---- agents ------------------------------------------------------------------------------

    async def _agent_get(self, p: Principal, conn: str, r: cmd.AgentGetRequest) -> cmd.ResponseData:
        agent = await self.s.agents.get(p, r.agent_id)
        if agent is None:
            return cmd.AgentGetResponse(request_id=r.request_id, exists=False)
        return cmd.AgentGetResponse(request_id=r.request_id, agent_id=agent.agent_id,
                                    container_id=agent.container_id, exists=True)

    async def _agent_list(self, p: Principal, conn: str, r: cmd.AgentListRequest) -> cmd.ResponseData:
        agents = await self.s.agents.list(p, r.container_id)
        return cmd.AgentListResponse(request_id=r.request_id, agents=[
            cmd.AgentRef(agent_id=a.agent_id, container_id=a.container_id, image_id=a.image_id) for a in agents])

    async def _agent_destroy(self, p: Principal, conn: str, r: cmd.AgentDestroyRequest) -> cmd.ResponseData:
        agent = await self.s.agents.get(p, r.agent_id)
        if agent is None:
            return cmd.AgentDestroyResponse(request_id=r.request_id, agent_id=r.agent_id, success=False)
        self.fanout.watch(conn, agent.container_id)
        image = await self.s.images.get(p, agent.image_id)
        ok = await self.s.agents.destroy(p, agent, image)
        return cmd.AgentDestroyResponse(request_id=r.request_id, agent_id=r.agent_id, success=ok)

    async def _agent_destroy_all(self, p: Principal, conn: str, r: cmd.AgentDestroyAllRequest) -> cmd.ResponseData:
        for agent in await self.s.agents.list(p, r.container_id):
            await self.s.agents.destroy(p, agent, await self.s.images.get(p, agent.image_id))
        return cmd.AgentDestroyAllResponse(request_id=r.request_id, container_id=r.container_id)


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(w.title() for w in rest)


def _lookup_context(data: Any) -> dict[str, str] | None:
    """The lookup keys of a failed command, for `system_error.context` (never a sessionId)."""
    if not isinstance(data, dict):
        return None
    ctx = {k: v for k in ("containerId", "imageId", "agentId") if isinstance(v := data.get(k), str)}
    return ctx or None

