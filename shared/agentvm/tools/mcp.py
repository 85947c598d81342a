"""The MCP servers of an image: their config, client sessions to them, and their tools for the model.

An image's `mcpServers` (AgentX shape) names stdio servers (a command the container starts in its sandbox) and remote
ones (streamable HTTP, or the older SSE transport). `parse_mcp_servers` checks that config; `McpPool` keeps one
`McpConnection` per server of a container and hands a turn its tools as `McpTools` (the turn engine's `ToolRunner`),
named `mcp__<server>__<tool>`.

Why a dedicated task per connection: the SDK's transports and `ClientSession` are anyio context managers built on task
groups, which must be exited by the task that entered them. A connection lives across turns, so no turn's task can own
it: `McpConnection` enters everything in its own task (one `AsyncExitStack`), which then waits until it is told to
stop or the transport ends. `start()` and `stop()` only signal that task and wait for it, so any task may call them;
calls to the session are plain requests and work from any task.

Reuse: connections are keyed by (tenant, container, server name, config fingerprint). Later turns of the container
reuse a running server (its state, its start-up time); a changed config is a new key. A server that died is restarted
by the next `tools()`, or by the next call after the call that reported its death. Idle stop: `reap_idle()` (called
periodically by the composition root) stops connections unused for `idle_s`; a turn that still holds one restarts it
on its next call. A server that fails to start costs the turn only its tools (a call of one says why:
`mcp_failures.py`; logged once) and is not retried for `retry_s`, so a hanging command does not slow every turn.

Environment of a stdio server: exactly the caller's base environment (the scrubbed tool env, without the server's
secrets) plus the server config's `env`. The SDK merges its own `get_default_environment()` (HOME, LOGNAME, PATH,
SHELL, TERM, USER of this process) under the env it is given; the names the given env lacks are removed again by
starting the command through `env -u NAME…` (names only on the command line, never values). Its stderr is kept in
memory (the last few KiB, for the reason it stopped) and never reaches our own stdout or stderr. The SDK (~1 s of
imports, httpx2) is imported only when a connection starts: parsing a config stays cheap for the function tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from agentvm import __version__
from agentvm.domain.config_secrets import REDACTED_MARK, redacted_fields, secret_values
from agentvm.drivers.base import ToolOutcome
from agentvm.engine.tools import unavailable
from agentvm.errors import AgentVMError, InvalidRequest
from agentvm.logs import register_secrets
from agentvm.tools.mcp_failures import TOOL_PREFIX, not_started

if TYPE_CHECKING:
    import anyio
    from anyio.streams.memory import MemoryObjectSendStream
    from mcp.client._transport import ReadStream, TransportStreams
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters
    from mcp.shared.message import SessionMessage
    from mcp_types import CallToolResult

log = logging.getLogger(__name__)

JSON = dict[str, Any]
Transport = Literal["stdio", "http", "sse"]
PoolKey = tuple[str, str, str, str]  # tenant id, container id, server name, config fingerprint

SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,48}$")
MAX_SERVERS = 32
_TOOL_NAME_MAX = 128
_UNSAFE_TOOL_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_EMPTY_SCHEMA: JSON = {"type": "object", "properties": {}}

_HTTP_TIMEOUT_S = 30.0  # connect and write; reads wait for the call's own timeout
_HTTP_READ_TIMEOUT_S = 300.0
_STOP_GRACE_S = 8.0  # stdio: the SDK closes stdin, waits 2 s, SIGTERMs the group, waits 2 s, SIGKILLs
_PING_TIMEOUT_S = 5.0
_MAX_PAGES = 100  # tools/list pages followed
_STDERR_KEEP = 4096

_orphans: set[asyncio.Task[None]] = set()  # connection tasks still shutting down after a cancelled start


# -- config -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    """One validated entry of `mcpServers`. The args, env and headers may hold secrets: not in the repr."""

    name: str
    transport: Transport
    command: str | None = None
    args: tuple[str, ...] = field(default=(), repr=False)
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    url: str | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @property
    def needs_sandbox(self) -> bool:
        """A stdio server runs in the container's sandbox; a remote one can be called from anywhere."""
        return self.transport == "stdio"


def parse_mcp_servers(raw: object) -> dict[str, McpServerConfig]:
    """The `mcpServers` value of an image config, validated (None or absent: no servers).

    Raises InvalidRequest naming the field path and the problem, e.g.
    `mcpServers.files.command: must be a non-empty string`."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _invalid("mcpServers", "must be an object mapping server names to server configs")
    if len(raw) > MAX_SERVERS:
        raise _invalid("mcpServers", f"at most {MAX_SERVERS} servers")
    return {name: _parse_server(name, value) for name, value in raw.items()}


def config_fingerprint(cfg: McpServerConfig) -> str:
    """A stable hash of the whole config (reuse keys: a changed config starts a new server)."""
    data = [cfg.name, cfg.transport, cfg.command, list(cfg.args), list(cfg.env), cfg.url, list(cfg.headers)]
    return hashlib.sha256(json.dumps(data, separators=(",", ":")).encode()).hexdigest()[:32]


def _invalid(path: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"{path}: {problem}", field=path)


def _parse_server(name: object, value: object) -> McpServerConfig:
    if not isinstance(name, str) or not SERVER_NAME.match(name):
        raise _invalid(f"mcpServers[{json.dumps(str(name))[:64]}]",
                       "server names must be 1 to 48 letters, digits, '_' or '-'")
    path = f"mcpServers.{name}"
    if not isinstance(value, Mapping):
        raise _invalid(path, "must be an object")
    kind = value.get("type") or "stdio"
    if kind == "sdk":
        raise _invalid(f"{path}.type", "in-process (sdk) servers run inside the client's own program and "
                                       "cannot be configured over the wire; use stdio, http or sse")
    if kind not in ("stdio", "http", "sse"):
        raise _invalid(f"{path}.type", "must be one of stdio, http, sse")
    present = {k for k in ("command", "args", "env", "url", "headers") if value.get(k) is not None}
    if kind == "stdio":
        if wrong := sorted(present & {"url", "headers"}):
            raise _invalid(f"{path}.{wrong[0]}", 'only http and sse servers take a url and headers (set "type")')
        command = value.get("command")
        if not isinstance(command, str) or not command.strip() or "\0" in command:
            raise _invalid(f"{path}.command", "must be a non-empty string")
        if "=" in command:  # `env -u … -- command` would take it for an assignment
            raise _invalid(f"{path}.command", "must not contain '='")
        return McpServerConfig(name, "stdio", command=command, args=_args(value.get("args"), f"{path}.args"),
                               env=_pairs(value.get("env"), f"{path}.env", _ENV_NAME,
                                          "names must be letters, digits and '_', not starting with a digit"))
    if wrong := sorted(present & {"command", "args", "env"}):
        raise _invalid(f"{path}.{wrong[0]}", "only stdio servers take a command, args and env")
    url = value.get("url")
    if not isinstance(url, str) or not _is_http_url(url):
        raise _invalid(f"{path}.url", "must be an http(s) URL")
    headers = _pairs(value.get("headers"), f"{path}.headers", _HEADER_NAME, "names must be HTTP header names")
    for key, text in headers:
        if any(c in text for c in "\0\r\n"):
            raise _invalid(f"{path}.headers.{key}", "must not contain line breaks")
    return McpServerConfig(name, "sse" if kind == "sse" else "http", url=url, headers=headers)


def _is_http_url(url: str) -> bool:
    if any(c in url for c in "\0\r\n\t "):
        return False
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _args(raw: object, path: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(a, str) and "\0" not in a for a in raw):
        raise _invalid(path, "must be a list of strings")
    return tuple(raw)


def _pairs(raw: object, path: str, names: re.Pattern[str], name_problem: str) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise _invalid(path, "must be an object of strings")
    for key, text in raw.items():
        if not isinstance(key, str) or not names.match(key):
            raise _invalid(path, f"{name_problem} ({json.dumps(str(key))[:64]})")
        if not isinstance(text, str) or "\0" in text:
            raise _invalid(f"{path}.{key}", "must be a string")
    return tuple(sorted(raw.items()))


# -- launching ----------------------------------------------------------------------------------------


class Launcher(Protocol):
    """Turns a stdio server's argv and cwd into what to spawn: the composition root passes
    `functools.partial(LocalProcessRunner.sandboxed_argv, limits=...)`."""

    def __call__(self, argv: Sequence[str], *, cwd: str) -> Awaitable[tuple[list[str], str]]: ...


async def unconfined(argv: Sequence[str], *, cwd: str) -> tuple[list[str], str]:
    """A `Launcher` that starts the command as it is (tests; hosts that run tools unsandboxed)."""
    return list(argv), cwd


@dataclass(frozen=True, slots=True)
class Launch:
    """How a container's stdio servers start: their cwd, the base environment and the launcher."""

    cwd: Path
    env: Mapping[str, str] = field(repr=False)
    launcher: Launcher


class _StderrTail(asyncio.Protocol):
    """A server's stderr: the last few KiB kept (for the reason it stopped), the rest dropped."""

    def __init__(self) -> None:
        self.data = bytearray()

    def data_received(self, data: bytes) -> None:
        self.data += data
        del self.data[:-_STDERR_KEEP]

    def last_line(self) -> str:
        lines = bytes(self.data).decode(errors="replace").strip().splitlines()
        return lines[-1].strip()[:300] if lines else ""


# -- one connection -----------------------------------------------------------------------------------


class McpStartError(Exception):
    """A server could not be started; the message says why."""


@dataclass(frozen=True, slots=True)
class RemoteTool:
    """A tool as its server lists it."""

    name: str
    description: str
    input_schema: JSON


class McpConnection:
    """One client session to one MCP server, owned by a dedicated task (see the module docstring).

    `start()` raises McpStartError; `call()` never raises (failures are error outcomes); `stop()`
    may be called from any task, any number of times."""

    def __init__(self, config: McpServerConfig, *, cwd: Path, env: Mapping[str, str], launcher: Launcher,
                 start_timeout_s: float = 20.0, log_extra: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.cwd = cwd
        self.env = {**env, **dict(config.env)}
        self.launcher = launcher
        self.start_timeout_s = start_timeout_s
        self.tools: list[RemoteTool] = []
        self.failure: str | None = None  # why it stopped without being asked to
        self.failure_reported = False  # a call has told the model so
        self.suspect = False  # a call timed out: ping before reusing it
        self.busy = 0  # calls in flight
        self.last_used = time.monotonic()
        self._session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._scope: anyio.CancelScope | None = None
        self._ready = asyncio.Event()  # initialized, tools listed
        self._wake = asyncio.Event()  # stop requested, or the transport ended
        self._stop_requested = False
        self._stderr: _StderrTail | None = None
        self._log = {**(log_extra or {}), "server": config.name, "transport": config.transport}

    @property
    def running(self) -> bool:
        return self._session is not None

    async def start(self) -> None:
        """Connect, initialize and list the tools, within `start_timeout_s`."""
        import anyio

        if self._task is not None:
            raise RuntimeError("an McpConnection starts once")
        self._scope = anyio.CancelScope()
        task = self._task = asyncio.get_running_loop().create_task(self._run(), name=f"mcp:{self.config.name}")
        started = asyncio.ensure_future(self._ready.wait())
        try:
            await asyncio.wait({started, task}, timeout=self.start_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the turn was cancelled: the connection winds down on its own
            self._stop_requested = True
            self._scope.cancel()
            _orphans.add(task)
            task.add_done_callback(_orphans.discard)
            raise
        finally:
            started.cancel()
        if self.running:
            return
        if self._wake.is_set():  # it ended by itself: wait for the reason
            await asyncio.wait({task}, timeout=_STOP_GRACE_S)
        else:
            await self._halt(graceful=False)
            self.failure = f"did not start within {self.start_timeout_s:g} s"
        raise McpStartError(self.failure or "stopped while starting")

    async def stop(self) -> None:
        """Close the session and end the server (stdio: its whole process group)."""
        await self._halt(graceful=True)

    async def ping(self) -> bool:
        """Whether the server still answers (after a timed-out call)."""
        import mcp_types as types

        session = self._session
        if session is None:
            return False
        try:
            await session.send_request(types.PingRequest(), types.EmptyResult,
                                       request_read_timeout_seconds=_PING_TIMEOUT_S)
        except Exception:
            return False
        self.suspect = False
        return True

    async def call(self, tool: str, arguments: JSON, timeout_s: float, *, label: str) -> ToolOutcome:
        """Call `tool`; `label` (the name the model knows) starts every error message."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        session = self._session
        if session is None:
            return self.down(label)
        self.busy += 1
        started = time.monotonic()
        try:
            result = await session.call_tool(tool, arguments, read_timeout_seconds=timeout_s)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                self.suspect = True
                return ToolOutcome(f"{label}: timed out after {timeout_s:g} s", is_error=True)
            if exc.code == CONNECTION_CLOSED:
                if self._task is not None:  # for the reason it ended
                    await asyncio.wait({self._task}, timeout=_STOP_GRACE_S)
                return self.down(label)
            return ToolOutcome(f"{label}: {exc.message}", is_error=True)
        except Exception as exc:  # a result the SDK rejects (e.g. against the tool's output schema)
            return ToolOutcome(f"{label}: {_reason(exc)}", is_error=True)
        finally:
            self.busy -= 1
            self.last_used = time.monotonic()
        log.debug("mcp tool called", extra={**self._log, "tool": tool, "is_error": result.is_error,
                                            "duration_ms": int((time.monotonic() - started) * 1000)})
        return ToolOutcome(render_result(result), is_error=result.is_error)

    async def settled(self) -> None:
        """Wait (at most the stop grace) for the connection's task to record how it ended: the transport's
        end makes it not `running` a moment before `failure` is set."""
        task = self._task
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=_STOP_GRACE_S)

    def down(self, label: str) -> ToolOutcome:
        """The outcome of a call to a server that is not running (the model is told once per death)."""
        self.failure_reported = True
        reason = self.failure or "it was stopped"
        return ToolOutcome(f"{label}: MCP server '{self.config.name}' is not running: {reason}. "
                           f"It is restarted at its next use.", is_error=True)

    # -- the connection's own task ----------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._scope is not None
        started = time.monotonic()
        error: Exception | None = None
        try:
            with self._scope:
                async with contextlib.AsyncExitStack() as stack:
                    session = await self._open(stack)
                    if self._wake.is_set():  # the transport ended, or a stop came, while starting
                        return
                    self._session = session
                    self._ready.set()
                    log.info("mcp server started", extra={
                        **self._log, "tools": len(self.tools), "duration_ms": int((time.monotonic() - started) * 1000)})
                    await self._wake.wait()
                    self._session = None
        except Exception as exc:  # the SDK's task groups raise ExceptionGroups
            error = exc
        finally:
            self._session = None
            self._wake.set()
            if not self._stop_requested:
                self.failure = self._describe(error)
                if self._ready.is_set():  # a start failure is the pool's to log
                    log.warning("mcp server stopped", extra={**self._log, "reason": self.failure})

    async def _open(self, stack: contextlib.AsyncExitStack) -> ClientSession:
        """Transport, then a forwarder that notices its end, then the session: initialized, tools listed."""
        import anyio
        import mcp_types as types
        from mcp.client.session import ClientSession
        from mcp.shared.message import SessionMessage

        read, write = await (self._open_stdio(stack) if self.config.transport == "stdio" else self._open_http(stack))
        sink, source = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        stack.callback(source.close)
        stack.callback(sink.close)
        forwarders = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(forwarders.cancel_scope.cancel)
        forwarders.start_soon(self._forward, read, sink)
        info = types.Implementation(name="agentvm", version=__version__)
        session = await stack.enter_async_context(ClientSession(source, write, client_info=info))
        await session.initialize()
        self.tools = await _list_tools(session)
        return session

    async def _forward(self, read: ReadStream[SessionMessage | Exception],
                       sink: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        """Pass the transport's messages to the session; its end (a stdio server exited) wakes `_run`."""
        import anyio

        try:
            async with sink:
                async for item in read:
                    await sink.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            self._session = None
            self._wake.set()

    async def _open_stdio(self, stack: contextlib.AsyncExitStack) -> TransportStreams:
        from mcp.client.stdio import StdioServerParameters, get_default_environment

        cfg = self.config
        assert cfg.command is not None
        argv, workdir = await self.launcher([cfg.command, *cfg.args], cwd=str(self.cwd))
        # The SDK adds these from our own environment under the given env: take them out again.
        extra = sorted(set(get_default_environment()) - set(self.env))
        if extra:
            env_bin = shutil.which("env", path="/usr/bin:/bin")
            if env_bin is None:
                raise McpStartError("env(1) is missing: needed to keep this server's environment to its own")
            argv = [env_bin, *(arg for name in extra for arg in ("-u", name)), "--", *argv]
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=self.env, cwd=workdir)
        return await self._spawn(stack, params)

    async def _spawn(self, stack: contextlib.AsyncExitStack, params: StdioServerParameters) -> TransportStreams:
        """stdio_client with the server's stderr going to a `_StderrTail` (through a pipe)."""
        from mcp.client.stdio import stdio_client

        read_fd, write_fd = os.pipe()
        errlog = os.fdopen(write_fd, "w")
        try:
            tail = _StderrTail()
            pipe, _ = await asyncio.get_running_loop().connect_read_pipe(lambda: tail, os.fdopen(read_fd, "rb", 0))
            stack.callback(pipe.close)
            self._stderr = tail
            return await stack.enter_async_context(stdio_client(params, errlog=errlog))
        finally:
            errlog.close()  # the server has its own copy

    async def _open_http(self, stack: contextlib.AsyncExitStack) -> TransportStreams:
        import httpx2
        from mcp.client.sse import sse_client
        from mcp.client.streamable_http import streamable_http_client

        cfg = self.config
        assert cfg.url is not None
        headers = dict(cfg.headers)
        streams: TransportStreams
        if cfg.transport == "sse":
            streams = await stack.enter_async_context(
                sse_client(cfg.url, headers=headers, timeout=_HTTP_TIMEOUT_S, sse_read_timeout=_HTTP_READ_TIMEOUT_S))
            return streams
        client = await stack.enter_async_context(
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(_HTTP_TIMEOUT_S, read=_HTTP_READ_TIMEOUT_S)))
        streams = await stack.enter_async_context(streamable_http_client(cfg.url, http_client=client))
        return streams

    async def _halt(self, *, graceful: bool) -> None:
        """End `_run`: wake it, then cancel its anyio scope (the SDK's shielded shutdown still runs), then
        the task itself; each step after a bounded wait."""
        task = self._task
        if task is None or task.done():
            return
        self._stop_requested = True
        self._wake.set()
        assert self._scope is not None
        steps: list[Callable[[], Any]] = [self._scope.cancel, task.cancel]
        if not graceful:
            steps[0]()
        for step in steps:
            done, _ = await asyncio.wait({task}, timeout=_STOP_GRACE_S)
            if done:
                return
            log.warning("mcp server slow to stop", extra=self._log)
            step()
        await asyncio.wait({task}, timeout=_STOP_GRACE_S)

    def _describe(self, error: Exception | None) -> str:
        """Why the connection ended without being asked to (stdio: with the server's last stderr line)."""
        ended = "the server process exited" if self.config.transport == "stdio" else "the server closed the connection"
        reason = ended if error is None else _reason(error, closed=ended)
        if self.config.url:  # a URL in a message may carry a token in its query
            reason = reason.replace(self.config.url, _safe_url(self.config.url))
        tail = self._stderr.last_line() if self._stderr is not None else ""
        return f"{reason} ({tail})" if tail else reason


async def _list_tools(session: ClientSession) -> list[RemoteTool]:
    import mcp_types as types

    tools: list[RemoteTool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools += [RemoteTool(t.name, t.description or t.title or "", t.input_schema) for t in page.tools]
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _reason(exc: BaseException, *, closed: str = "the connection closed") -> str:
    """A short text for an exception (the most telling leaf of an exception group)."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    leaves: list[BaseException] = []

    def collect(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for inner in e.exceptions:
                collect(inner)
        else:
            leaves.append(e)

    collect(exc)
    telling = [e for e in leaves if not (isinstance(e, MCPError) and e.code == CONNECTION_CLOSED)]
    leaf = (telling or leaves)[0]
    if isinstance(leaf, MCPError) and leaf.code == CONNECTION_CLOSED:
        return closed
    if isinstance(leaf, AgentVMError):
        return leaf.message
    if isinstance(leaf, McpStartError):
        return str(leaf)
    if isinstance(leaf, OSError) and leaf.strerror:
        return f"{leaf.strerror}: {leaf.filename}" if leaf.filename else leaf.strerror
    text = str(leaf).strip().splitlines()
    return f"{type(leaf).__name__}: {text[0][:300]}" if text else type(leaf).__name__


def _safe_url(url: str) -> str:
    """The URL without credentials, query or fragment (for messages and logs)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


# -- results ------------------------------------------------------------------------------------------


def render_result(result: CallToolResult) -> str:
    """A tool result as text for the model: text blocks as they are, other content described."""
    from mcp_types import AudioContent, EmbeddedResource, ImageContent, ResourceLink, TextContent, TextResourceContents

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, ImageContent | AudioContent):
            parts.append(f"[{block.type} {block.mime_type}, {_b64_size(block.data):,} bytes]")
        elif isinstance(block, ResourceLink):
            parts.append(f"[resource link {block.uri}" + (f" ({block.mime_type})]" if block.mime_type else "]"))
        elif isinstance(block, EmbeddedResource):
            res = block.resource
            if isinstance(res, TextResourceContents):
                parts.append(f"[resource {res.uri}]\n{res.text}")
            else:
                parts.append(f"[resource {res.uri} {res.mime_type or 'binary'}, {_b64_size(res.blob):,} bytes]")
    if not any(isinstance(b, TextContent) for b in result.content) and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _b64_size(data: str) -> int:
    return len(data.rstrip("=")) * 3 // 4


def cap_output(text: str, max_bytes: int) -> str:
    """At most `max_bytes` of UTF-8, with a note saying how much there was."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode(errors="ignore") + f"\n[output truncated: {len(data):,} bytes in total]"


def qualified_names(tools: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """`mcp__<server>__<tool>` for each (server, tool), valid as an Anthropic tool name and unique.

    Names that need no change are assigned first, so they keep their natural form; the others get
    `_`-for-invalid characters, a cut to 128 and, on a collision, a `_2`, `_3`… suffix, in sorted
    order (the same tools always get the same names)."""
    natural = {st: f"{TOOL_PREFIX}{st[0]}__{st[1]}" for st in tools}
    clean = {st: _UNSAFE_TOOL_CHARS.sub("_", name)[:_TOOL_NAME_MAX] for st, name in natural.items()}
    names: dict[tuple[str, str], str] = {}
    taken: set[str] = set()
    for st in sorted(natural, key=lambda st: (natural[st] != clean[st], st)):
        name, n = clean[st], 1
        while name in taken:
            n += 1
            name = f"{clean[st][:_TOOL_NAME_MAX - len(str(n)) - 1]}_{n}"
        taken.add(name)
        names[st] = name
    return names


# -- a turn's tools -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Route:
    server: str
    tool: str
    schema: JSON = field(repr=False)


class McpTools:
    """The tools of a turn's MCP servers (`ToolRunner`): server-qualified names, calls routed to the
    server's connection, a connection that stopped restarted through the pool."""

    def __init__(self, pool: McpPool, key_prefix: tuple[str, str], launch: Launch,
                 connections: Mapping[str, McpConnection], problems: list[str],
                 failed: Mapping[str, str] | None = None) -> None:
        self._pool = pool
        self._prefix = key_prefix
        self._launch = launch
        self._connections = dict(connections)
        self.problems = problems
        self.failed = dict(failed or {})  # server -> why it did not start
        listed: dict[tuple[str, str], RemoteTool] = {}
        for server, conn in sorted(self._connections.items()):
            for tool in conn.tools:
                schema = tool.input_schema or _EMPTY_SCHEMA
                if schema.get("type") != "object":
                    problems.append(f"{server}: tool {tool.name!r} left out: its input schema is not an object")
                    continue
                listed[(server, tool.name)] = RemoteTool(tool.name, tool.description, schema)
        self._routes: dict[str, _Route] = {}
        for (server, tool_name), name in qualified_names(list(listed)).items():
            tool = listed[(server, tool_name)]
            self._routes[name] = _Route(server, tool_name, {"name": name, "description": tool.description,
                                                            "input_schema": tool.input_schema})

    def schemas(self) -> list[JSON]:
        return [route.schema for route in self._routes.values()]

    def names(self) -> set[str]:
        return set(self._routes)

    def schemas_of(self, server: str) -> list[JSON] | None:
        """The tools one server offers this turn (its qualified names); None when it is not connected."""
        if server not in self._connections:
            return None
        return [route.schema for route in self._routes.values() if route.server == server]

    def unknown(self, name: str) -> ToolOutcome | None:
        return not_started(name, self.failed)

    def needs_sandbox(self, name: str) -> bool:
        route = self._routes.get(name)
        return route is not None and self._connections[route.server].config.needs_sandbox

    async def run(self, name: str, input_: JSON) -> ToolOutcome:
        route = self._routes.get(name)
        if route is None:
            return self.unknown(name) or unavailable(name)
        conn = self._connections[route.server]
        if not conn.running:
            await conn.settled()
            if conn.failure is not None and not conn.failure_reported:
                return conn.down(name)
            revived = await self._pool.connect(self._prefix, conn.config, self._launch)
            if isinstance(revived, str):
                return ToolOutcome(f"{name}: MCP server '{route.server}' could not be restarted: {revived}",
                                   is_error=True)
            self._connections[route.server] = conn = revived
        outcome = await conn.call(route.tool, input_, self._pool.call_timeout_s, label=name)
        return ToolOutcome(cap_output(outcome.output, self._pool.max_output_bytes), is_error=outcome.is_error)


# -- the pool -----------------------------------------------------------------------------------------


class McpPool:
    """The running MCP connections of this process, shared by the turns of each container."""

    def __init__(self, *, idle_s: float = 300.0, start_timeout_s: float = 20.0, call_timeout_s: float = 120.0,
                 retry_s: float = 30.0, max_output_bytes: int = 16 << 10) -> None:
        self.idle_s = idle_s
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        self.retry_s = retry_s
        self.max_output_bytes = max_output_bytes
        self._connections: dict[PoolKey, McpConnection] = {}
        self._locks: dict[PoolKey, asyncio.Lock] = {}
        self._failed: dict[PoolKey, tuple[str, float]] = {}  # start failures: reason, when
        self._closed = False

    async def tools(self, key_prefix: tuple[str, str], servers: Mapping[str, McpServerConfig], *, cwd: Path,
                    env: Mapping[str, str], launcher: Launcher) -> McpTools:
        """The tools of `servers` for a turn of container `key_prefix` (tenant id, container id): running
        servers reused, the others started in parallel. `cwd` and `env` (the scrubbed tool environment)
        are for stdio servers, which `launcher` confines."""
        launch = Launch(cwd, dict(env), launcher)
        configs = list(servers.values())
        found = await asyncio.gather(*(self.connect(key_prefix, cfg, launch) for cfg in configs))
        connections = {cfg.name: c for cfg, c in zip(configs, found, strict=True) if isinstance(c, McpConnection)}
        failed = {cfg.name: c for cfg, c in zip(configs, found, strict=True) if isinstance(c, str)}
        return McpTools(self, key_prefix, launch, connections, [f"{n}: {why}" for n, why in failed.items()], failed)

    async def connect(self, key_prefix: tuple[str, str], cfg: McpServerConfig,
                      launch: Launch) -> McpConnection | str:
        """The running connection to `cfg`'s server (started or restarted when needed), or why there is none."""
        key: PoolKey = (*key_prefix, cfg.name, config_fingerprint(cfg))
        labels = {"tenant_id": key[0], "container_id": key[1], "server": cfg.name, "transport": cfg.transport}
        async with self._locks.setdefault(key, asyncio.Lock()):
            if self._closed:
                return "the server is shutting down"
            conn = self._connections.get(key)
            if conn is not None and conn.running and conn.suspect and not await conn.ping():
                conn.failure = "it stopped answering after a call timed out"
            if conn is not None and conn.running and conn.failure is None:
                conn.last_used = time.monotonic()
                return conn
            if conn is not None:
                del self._connections[key]
                log.info("mcp server restarting", extra={**labels, "reason": conn.failure})
                await conn.stop()
            failed = self._failed.get(key)
            if failed is not None and time.monotonic() - failed[1] < self.retry_s:
                return failed[0]
            if redacted := redacted_fields(cfg):  # never started with a placeholder for a credential
                return (f"imported without its secrets: {', '.join(redacted)} "
                        f"{'holds' if len(redacted) == 1 else 'hold'} \"{REDACTED_MARK}\"")
            register_secrets(secret_values(cfg))
            conn = McpConnection(cfg, cwd=launch.cwd, env=launch.env, launcher=launch.launcher,
                                 start_timeout_s=self.start_timeout_s, log_extra=labels)
            try:
                await conn.start()
            except McpStartError as exc:
                reason = str(exc)
                if failed is None or failed[0] != reason:
                    log.warning("mcp server did not start", extra={**labels, "reason": reason})
                self._failed[key] = (reason, time.monotonic())
                return reason
            self._failed.pop(key, None)
            conn.last_used = time.monotonic()
            self._connections[key] = conn
            return conn

    def running(self) -> list[PoolKey]:
        """The keys of the running connections."""
        return [key for key, conn in self._connections.items() if conn.running]

    async def stop_servers(self, key_prefix: tuple[str, str], servers: Iterable[tuple[str, str]]) -> int:
        """Stop these (name, config fingerprint) servers of container `key_prefix`; how many were connected."""
        keys = {(*key_prefix, name, fingerprint) for name, fingerprint in servers}
        stopping = [self._connections.pop(key) for key in keys & self._connections.keys()]
        await asyncio.gather(*(conn.stop() for conn in stopping))
        return len(stopping)

    async def reap_idle(self, now: float | None = None) -> int:
        """Stop the connections unused for `idle_s` at `now` (`time.monotonic()`), and forget the ones that
        died; how many were stopped or forgotten."""
        now = time.monotonic() if now is None else now
        idle = [key for key, conn in self._connections.items()
                if not conn.running or (conn.busy == 0 and now - conn.last_used >= self.idle_s)]
        stopping = [self._connections.pop(key) for key in idle]
        await asyncio.gather(*(conn.stop() for conn in stopping))
        for key in [k for k, (_, at) in self._failed.items() if now - at >= self.idle_s]:
            del self._failed[key]
        for key in [k for k, lock in self._locks.items() if k not in self._connections and not lock.locked()]:
            del self._locks[key]
        if stopping:
            log.info("mcp servers stopped when idle", extra={"count": len(stopping)})
        return len(stopping)

    async def close(self) -> None:
        """Stop every connection (server shutdown); no server starts after this."""
        self._closed = True
        stopping = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(conn.stop() for conn in stopping))
        if _orphans:  # connections whose start was cancelled, still winding down
            await asyncio.wait(set(_orphans), timeout=2 * _STOP_GRACE_S)
