"""The cloud's streaming HTTP function (`chat_stream`): the whole FastAPI application (the chat API
with SSE, `/v1/images`, `/v1/sessions`, `/v1/resources`, …) behind a Lambda Function URL in
response-stream mode, run by the Lambda Web Adapter (`functions/chat_stream/run.sh`).

Each request gets the objects of one invocation for its caller's tenant (a `CloudFanout`, the
services over lease-hosted sessions), closed when its response has been sent. A chat turn runs
here, in this invocation, not in `chat_turn`: the session's turns are started in-process
(`InlineDispatcher`) and their events reach the SSE response straight from the publisher
(`TeeFanout`), as well as every WebSocket subscriber of the session. When another holder runs the
session (a turn sent over the WebSocket, running in `chat_turn`), the stream reads the session's
stored event log instead, every second (`CloudFeed`): it sees what that holder has checkpointed.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from agentvm.cloud import init_phase
from agentvm.domain.models import LeaseHandoff, Principal
from agentvm.errors import NotConfigured
from agentvm.observability import tracing

if TYPE_CHECKING:
    from fastapi import FastAPI

    from agentvm.adapters.aws.cloud_fanout import CloudFanout
    from agentvm.auth.api_keys import Authenticator
    from agentvm.cloud.runtime import CloudRuntime, Invocation
    from agentvm.domain.models import ConnectionRecord
    from agentvm.ports import EventSource
    from agentvm.services.agent_models import AgentModels
    from agentvm.services.chat import ChatService
    from agentvm.services.config import ConfigService
    from agentvm.services.keys import KeyService
    from agentvm.services.resources import ResourceService
    from agentvm.services.use_cases import UseCases

log = logging.getLogger("agentvm.chat_stream")

POLL_S = 1.0  # how often a stream reads the stored log when the turn runs elsewhere
LISTENER_MAX = 10_000  # events a slow SSE reader may fall behind before its stream is ended


class _Listener:
    """An SSE stream's queue of one session's events."""

    def __init__(self) -> None:
        self.queue: deque[tuple[int, str]] = deque()
        self.wake = asyncio.Event()
        self.overflow = False

    def push(self, seq: int, payload: str) -> None:
        if len(self.queue) >= LISTENER_MAX:
            self.overflow = True
        else:
            self.queue.append((seq, payload))
        self.wake.set()


class TeeFanout:
    """The invocation's `CloudFanout`, plus this process's SSE listeners of a session's events."""

    def __init__(self, inner: CloudFanout) -> None:
        self.inner = inner
        self.served = inner.served  # the same dict: the lease holder reads what the inner fanout served
        self._listeners: dict[str, list[_Listener]] = {}
        self._streamed: set[str] = set()  # sessions an SSE stream followed in this invocation

    def listen(self, session_id: str) -> _Listener:
        listener = _Listener()
        self._listeners.setdefault(session_id, []).append(listener)
        self._streamed.add(session_id)
        return listener

    def unlisten(self, session_id: str, listener: _Listener) -> None:
        members = self._listeners.get(session_id, [])
        if listener in members:
            members.remove(listener)

    def to_connection(self, connection_id: str, payload: str) -> None:
        self.inner.to_connection(connection_id, payload)

    def to_session(self, session_id: str, seq: int, payload: str, *, exclude: str | None = None) -> None:
        self.inner.to_session(session_id, seq, payload, exclude=exclude)
        for listener in self._listeners.get(session_id, ()):
            listener.push(seq, payload)

    def to_container(self, tenant_id: str, container_id: str, payload: str) -> None:
        self.inner.to_container(tenant_id, container_id, payload)

    def watch(self, connection_id: str, container_id: str) -> None:
        self.inner.watch(connection_id, container_id)

    def attach(self, connection_id: str, session_id: str, container_id: str) -> None:
        self.inner.attach(connection_id, session_id, container_id)

    async def subscribe(self, connection_id: str, session_id: str, container_id: str, after_seq: int | None,
                        source: EventSource) -> None:
        await self.inner.subscribe(connection_id, session_id, container_id, after_seq, source)

    def owe_replay(self, connection_id: str, session_id: str, container_id: str, after_seq: int) -> None:
        self.inner.owe_replay(connection_id, session_id, container_id, after_seq)

    def known(self, record: ConnectionRecord) -> None:
        self.inner.known(record)

    async def drain(self) -> None:
        await self.inner.drain()

    async def flushed(self) -> None:
        await self.inner.flushed()

    async def close(self) -> None:
        await self.inner.close()

    def serve_pending(self, session_id: str, *, consistent: bool = True) -> None:
        self.inner.serve_pending(session_id, consistent=consistent)

    def listeners(self, session_id: str) -> int:
        # A turn an SSE client started is never stopped for want of listeners: its client may come
        # back with Last-Event-ID, and a chat turn is paid for once it runs.
        return -1 if session_id in self._streamed else self.inner.listeners(session_id)


class InlineDispatcher:
    """Starts a session's turns in this invocation (the worker `chat_turn` would run), and lets the
    request wait for them before its invocation ends (Lambda freezes the environment after it)."""

    def __init__(self, rt: CloudRuntime, inv: Invocation, tee: TeeFanout) -> None:
        self.rt, self.inv, self.tee = rt, inv, tee
        self.tasks: set[asyncio.Task[Any]] = set()

    async def start_turns(self, tenant_id: str, session_id: str, *, handoff: LeaseHandoff | None = None) -> None:
        from agentvm.hosting.session_worker import SessionWorker

        worker = SessionWorker(self.inv.deps, fanout=self.tee, leases=self.rt.leases, owner=self.inv.owner)
        task = asyncio.get_running_loop().create_task(worker.run(tenant_id, session_id, handoff=handoff),
                                                      name=f"chat_stream-turns-{session_id}")
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("turns failed in chat_stream", exc_info=task.exception())

    async def wait(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)


class CloudFeed:
    """The chat API's feed in the cloud: events from this invocation's publisher when it runs the
    turn, else from the session's stored log (read every `POLL_S`)."""

    connection_id: str | None = None  # not a WebSocket connection: nothing is posted to it

    def __init__(self, scope: _RequestScope, tenant_id: str) -> None:
        self.scope = scope
        self.tenant_id = tenant_id
        self.session_id = ""
        self.last = 0
        self.listener: _Listener | None = None
        self._polled = 0.0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.listener is not None:
            self.scope.tee.unlisten(self.session_id, self.listener)

    async def follow(self, session_id: str, container_id: str, after_seq: int) -> None:
        self.session_id, self.last = session_id, after_seq
        self.listener = self.scope.tee.listen(session_id)
        await self._poll()

    async def receive(self, timeout: float) -> str | None:
        listener = self.listener
        assert listener is not None, "follow() first"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            while listener.queue:
                seq, payload = listener.queue.popleft()
                if seq > self.last:
                    self.last = seq
                    return payload
            if listener.overflow:
                raise ConnectionError("the stream fell too far behind its session")
            now = loop.time()
            if now >= deadline:
                return None
            listener.wake.clear()
            try:
                await asyncio.wait_for(listener.wake.wait(), min(deadline - now, POLL_S))
            except TimeoutError:
                if loop.time() - self._polled >= POLL_S:
                    await self._poll()

    async def _poll(self) -> None:
        self._polled = asyncio.get_running_loop().time()
        stored = await self.scope.rt.store.read_events(self.tenant_id, self.session_id, self.last)
        listener = self.listener
        if not stored or listener is None:
            return
        merged = {e.seq: e.payload for e in stored}  # stored events are older than what is queued live
        for seq, payload in listener.queue:
            merged.setdefault(seq, payload)
        listener.queue.clear()
        listener.queue.extend(sorted(merged.items()))


@dataclass(slots=True)
class _RequestScope:
    rt: CloudRuntime
    principal: Principal | None = None
    inv: Invocation | None = None
    tee: TeeFanout = field(init=False)
    inline: InlineDispatcher | None = None
    services: UseCases | None = None

    async def build(self, p: Principal) -> None:
        from agentvm.hosting.leased_host import LeasedSessions
        from agentvm.services.use_cases import UseCases

        self.principal = p
        inv = self.rt.invocation(p.tenant_id, role="chat_stream", driver=await self.rt.driver())
        self.inv = inv
        self.tee = TeeFanout(inv.fanout)
        inv.deps.fanout = self.tee
        self.inline = InlineDispatcher(self.rt, inv, self.tee)
        sessions = LeasedSessions(inv.deps, fanout=self.tee, leases=self.rt.leases, dispatcher=self.inline,
                                  owner=inv.owner)
        self.services = UseCases(inv.deps, sessions)

    async def close(self) -> None:
        if self.inline is not None:
            await self.inline.wait()
        if self.inv is not None:
            await self.tee.close()


_current: contextvars.ContextVar[_RequestScope | None] = contextvars.ContextVar("chat_stream_scope", default=None)


def _scope() -> _RequestScope:
    scope = _current.get()
    if scope is None:
        raise RuntimeError("no request scope: the app runs behind RequestScopes")
    return scope


class RequestScopes:
    """ASGI middleware: one scope per HTTP request, closed after the whole response was sent (a
    streamed one included) and after the turns the request started have ended."""

    def __init__(self, app: ASGIApp, runtime: Any) -> None:
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_scope = _RequestScope(await self.runtime().ready())
        token = _current.set(request_scope)
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(token)
            await asyncio.shield(request_scope.close())
            if tracing.enabled():  # the request's and its turns' spans, before Lambda freezes the process
                await asyncio.to_thread(tracing.flush)


def create_stream_app(runtime: Any = None) -> FastAPI:
    """The application of `chat_stream`; `runtime`: the environment's CloudRuntime factory. Its
    imports and build are the process's init phase: the collector paused (agentvm/cloud/init_phase.py)."""
    with init_phase.paused():
        return _create_stream_app(runtime)


def _create_stream_app(runtime: Any) -> FastAPI:
    # the services are imported by the requests that use them: a cold start loads its request's only
    from agentvm.api.http_app import HttpApi, create_app
    from agentvm.api.http_callers import HttpCallers
    from agentvm.cloud import runtime as cloud_runtime

    get_runtime = runtime or cloud_runtime.runtime

    async def authenticator() -> Authenticator:
        return _scope().rt.authenticator

    callers = HttpCallers(authenticator)

    async def principal_for(request: Request) -> Principal:
        p = await callers.principal(request)
        scope = _scope()
        if scope.principal is None:
            await scope.build(p)
        return p

    def services() -> UseCases:
        built = _scope().services
        if built is None:
            raise RuntimeError("the request's caller is not known yet")
        return built

    class _Feeds:
        def open(self, tenant_id: str) -> CloudFeed:
            return CloudFeed(_scope(), tenant_id)

    def chat() -> ChatService:
        from agentvm.services.chat import ChatService

        return ChatService(services(), _Feeds())

    def resources() -> ResourceService:
        from agentvm.services.resources import ResourceService

        return ResourceService(_scope().rt.store)

    def config() -> ConfigService:
        found = _scope().rt.config
        if found is None:
            raise NotConfigured("AVM_CONFIG_PATH is not set: this deployment has no runtime configuration")
        return found

    async def probe() -> object:
        return await _scope().rt.store.last_seq("health", "health")

    def keys() -> KeyService:
        from agentvm.services.keys import KeyService

        rt = _scope().rt
        return KeyService(rt.key_store, rt.authenticator)

    async def chat_for(p: Principal) -> ChatService:
        """The chat use case for a token API caller (`model: "agent/<imageId>"`): its tenant's scope."""
        scope = _scope()
        if scope.principal is None:
            await scope.build(p)
        return chat()

    @functools.cache
    def agent_models() -> AgentModels:
        from agentvm.services.agent_models import AgentModels

        return AgentModels(chat_for)

    app = create_app(api=HttpApi(resources=resources, principal_for=principal_for, config=config,
                                 admin_for=callers.admin, services=services, chat=chat, probe=probe, keys=keys,
                                 key_caller=callers.key_caller, billing=lambda: _scope().rt.billing,
                                 turn_log=lambda: _scope().rt.store,
                                 token_gateway=lambda: _scope().rt.token_gateway,
                                 token_caller=callers.vendor_principal, agent_models=agent_models))
    app.add_middleware(RequestScopes, runtime=get_runtime)
    return app
