"""The composition root of `avm serve`: the only place that chooses the local adapters."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI
from starlette.websockets import WebSocket

from agentvm import __version__
from agentvm.adapters.local.local_container_tier import LocalContainerTier
from agentvm.adapters.local.local_disk import LocalDisk
from agentvm.adapters.local.local_env import EnvLLMProvider, ProcessEnv
from agentvm.adapters.local.local_fs import LocalFileSystem
from agentvm.adapters.local.local_process import LocalProcessRunner, probe_host, reap_dead_tools
from agentvm.adapters.local.sqlite_config import SqliteConfigStore
from agentvm.adapters.local.sqlite_keys import SqliteKeys
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.adapters.local.sqlite_usage import SqliteUsageLedger
from agentvm.adapters.local.tool_sandbox import ToolSandbox, assess
from agentvm.api.console_http import CONSOLE_PATH
from agentvm.api.http_app import HttpApi, create_app
from agentvm.api.http_callers import HttpCallers
from agentvm.api.hub_feed import HubFeeds
from agentvm.api.ws_auth import frame_principal, upgrade_principal
from agentvm.api.ws_endpoint import WebSocketEndpoint
from agentvm.api.ws_hub import LocalHub
from agentvm.api.ws_router import CommandRouter
from agentvm.auth.api_keys import Authenticator
from agentvm.config import Settings, cors_origin_list
from agentvm.domain.models import DEFAULT_TENANT, Principal
from agentvm.domain.sandbox_limits import Limits
from agentvm.drivers.scripted import ScriptedDriver
from agentvm.engine.runner import EngineOptions
from agentvm.hosting.local_host import SessionRegistry
from agentvm.hosting.recovery import recover_unfinished_turns
from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.ids import now_ms
from agentvm.logs import CONSOLE_TEXT
from agentvm.observability import tracing
from agentvm.ports import Driver
from agentvm.sandbox.quota import DiskPolicy, free_space
from agentvm.sandbox.uids import ToolUids
from agentvm.services.agent_models import AgentModels
from agentvm.services.billing import BillingService
from agentvm.services.chat import ChatService
from agentvm.services.config import ConfigService, from_settings
from agentvm.services.keys import KeyService
from agentvm.services.metering import Meter
from agentvm.services.metrics import TurnMetrics
from agentvm.services.model_catalog import ModelCatalog, ProviderSpec
from agentvm.services.model_drivers import DriverFactory, ModelDrivers, upstream_factories
from agentvm.services.token_gateway import TokenGateway
from agentvm.services.use_cases import UseCases
from agentvm.tools.catalog import StdioSchemas, ToolCatalog
from agentvm.tools.mcp import McpPool
from agentvm.tools.provider import WorkspaceTools
from avm.http_protocol import JoinedWritesProtocol

if TYPE_CHECKING:
    from agentvm.drivers.anthropic_lite import AnthropicLiteDriver

log = logging.getLogger("agentvm.serve")

MAINTENANCE_INTERVAL_S = 60.0
CONSOLE_DIR = Path(__file__).with_name("console")  # the web console's files (docs/console.md)


def _anthropic_key(settings: Settings) -> str | None:
    explicit = settings.llm_api_key.get_secret_value() if settings.llm_api_key is not None else None
    return EnvLLMProvider(ProcessEnv(), explicit=explicit).api_key_now()


def build_driver(settings: Settings) -> Driver:
    """The Anthropic driver when a key is configured (Settings, else the process environment), else
    the offline scripted driver."""
    api_key = _anthropic_key(settings)
    if api_key:
        from agentvm.drivers.anthropic_sdk import AnthropicDriver

        return AnthropicDriver(api_key, base_url=settings.llm_base_url, timeout_s=settings.llm_timeout_s,
                               max_retries=settings.llm_max_retries)
    if settings.script_path is not None:
        return ScriptedDriver.from_file(settings.script_path)
    return ScriptedDriver()


def build_token_driver(settings: Settings) -> AnthropicLiteDriver | None:
    """The token API's Anthropic driver when a key is configured: the SDK-free one (drivers/anthropic_lite.py,
    the cloud's too), about 1 ms a call cheaper than the SDK's, over aiohttp, ~1 ms cheaper again than httpx
    (docs/benchmarks.md, token API overhead); agent turns keep the SDK driver."""
    api_key = _anthropic_key(settings)
    if not api_key:
        return None
    from agentvm.drivers.anthropic_lite import AnthropicLiteDriver

    return AnthropicLiteDriver(api_key, base_url=settings.llm_base_url, timeout_s=settings.llm_timeout_s,
                               max_retries=settings.llm_max_retries, http_client=settings.llm_http_client)


def driver_factories(settings: Settings) -> dict[str, DriverFactory]:
    """The driver families the token API's configured providers (`llm.providers`) may use, by kind."""

    def anthropic(spec: ProviderSpec, key: str | None) -> Driver:
        from agentvm.drivers.anthropic_lite import AnthropicLiteDriver

        return AnthropicLiteDriver(key or "", base_url=spec.base_url, timeout_s=settings.llm_timeout_s,
                                   max_retries=settings.llm_max_retries, http_client=settings.llm_http_client)

    return {"anthropic": anthropic,
            **upstream_factories(timeout_s=settings.llm_timeout_s, max_retries=settings.llm_max_retries,
                                 http_client=settings.llm_http_client)}


def token_gateway(settings: Settings, driver: Driver, config: ConfigService, meter: Meter) -> TokenGateway:
    """The token API over the runtime's own driver (Anthropic with a key, else the scripted model) and the
    configured providers."""
    anthropic = driver.name != "scripted"
    drivers = ModelDrivers(builtin={driver.name: driver}, factories=driver_factories(settings), env=ProcessEnv())

    async def catalog() -> tuple[ModelCatalog, Decimal]:
        return await config.catalog(anthropic=anthropic, anthropic_base_url=settings.llm_base_url)

    # the ledger is SQLite on one thread: a call's answer need not wait for its record's write
    return TokenGateway(catalog=catalog, drivers=drivers, meter=meter)


def auth_mode(settings: Settings) -> str:
    """`keys` or `open`: `auto` is open on a loopback address only."""
    if settings.auth != "auto":
        return settings.auth
    return "open" if is_loopback(settings.host) else "keys"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class Runtime:
    """Everything `avm serve` runs, wired together."""

    settings: Settings
    store: SqliteStore
    hub: LocalHub
    services: UseCases
    sessions: SessionRegistry
    router: CommandRouter
    endpoint: WebSocketEndpoint
    app: FastAPI
    driver: Driver
    container_tier: LocalContainerTier
    mcp: McpPool
    config: ConfigService
    tool_sandbox: ToolSandbox | None = None  # what tools get on this host (None: not assessed)
    console_path: str | None = None  # the web console's path when one is served (the banner shows its URL)


def build_runtime(settings: Settings, *, driver: Driver | None = None,
                  free_bytes: Callable[[], int] | None = None) -> Runtime:
    """`avm serve` wired together. `free_bytes`: how the free space of the data directory's filesystem
    is read (default: statvfs; tests give a nearly full disk)."""
    store = SqliteStore(settings.database_path())
    hub = LocalHub()
    drv = driver or build_driver(settings)
    # a driver given (tests) serves the token API too; without a key the scripted one does
    token_lite = build_token_driver(settings) if driver is None else None
    token_drv: Driver = token_lite or drv
    default_model = settings.llm_model if drv.name != "scripted" else "scripted"
    options = EngineOptions(default_model=default_model, max_tokens=settings.llm_max_tokens,
                            flush_ms=settings.stream_flush_ms, max_flush_ms=settings.stream_max_flush_ms,
                            max_iterations=settings.max_tool_iterations)
    # fail closed: no isolating sandbox here and no unsafe opt-in → sandbox tools are refused
    tool_sandbox = assess(probe_host(), settings.sandbox_isolation, unsafe=settings.unsafe_unsandboxed_tools)
    # tools' disk: a quota per workspace, and free space kept for the database (sandbox/quota.py)
    disk = DiskPolicy(settings.workspace_quota_bytes, settings.disk_reserve_bytes,
                      free_bytes or free_space(settings.data_dir))
    process_for = functools.partial(LocalProcessRunner, isolation=settings.sandbox_isolation,
                                     unsafe_unsandboxed=settings.unsafe_unsandboxed_tools, disk=disk)
    mcp, stdio = McpPool(idle_s=settings.mcp_idle_s, call_timeout_s=settings.tool_timeout_s), StdioSchemas()
    workspace_tools = WorkspaceTools(LocalDisk(settings.data_dir), LocalFileSystem, process_for,
                                     uids=ToolUids(settings.data_dir / "tool-uids.json"),
                                     limits=Limits(timeout_s=settings.tool_timeout_s),
                                     preview_bytes=settings.tool_preview_bytes, mcp=mcp, stdio=stdio,
                                     store=store, http_allow_private=settings.http_tools_allow_private,
                                     disk_policy=disk)
    sandbox = LocalContainerTier(workspace_tools)
    config = from_settings(settings, SqliteConfigStore(store), ProcessEnv(),
                           file=settings.config_file or settings.data_dir / "config.yaml")
    # turn metrics (docs/observability.md); `sessions` is built below, before anything reads the gauge
    metrics = TurnMetrics(connections=hub.per_tenant, containers=lambda: sessions.active_containers())
    ledger = SqliteUsageLedger(store)
    meter = Meter(ledger, budget_cache_s=5.0, on_overrun=metrics.observe_budget_overrun)
    deps = RuntimePorts(store=store, fanout=hub, driver=drv, options=options,
                        tools=ToolCatalog(pool=mcp, stdio=stdio, store=store,
                                          http_allow_private=settings.http_tools_allow_private),
                        container_tier=sandbox, sandbox_tools=sandbox,
                        turn_options=config, turn_observer=metrics.observe_turn, meter=meter,
                        sandbox_refusal=lambda: tool_sandbox.refusal, image_deleted=workspace_tools.release)
    sessions = SessionRegistry(deps)
    services = UseCases(deps, sessions)
    router = CommandRouter(services, hub, frame_traces=True)  # a trace per frame, not per connection
    open_principal = Principal(DEFAULT_TENANT)
    keys = SqliteKeys(store)
    authenticator = Authenticator(keys, cache_s=5.0)
    keyed = auth_mode(settings) == "keys"

    async def principal_for(ws: WebSocket) -> Principal | None:
        if not keyed:  # the open single-tenant mode: loopback only (architecture §5.3)
            return open_principal
        return await upgrade_principal(authenticator, ws.headers, ws.query_params)  # None: an `auth` frame next

    endpoint = WebSocketEndpoint(hub=hub, router=router, principal_for=principal_for,
                                 max_queue=settings.send_queue_max, wrap=settings.reliable_wrapper,
                                 auth_frame=functools.partial(frame_principal, authenticator),
                                 auth_timeout_s=settings.auth_timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        await store.open()
        await config.load_file()  # a bad config file stops the server here, naming the key
        await recover_unfinished_turns(store)
        # nothing runs yet: holds and tool processes still there were left by a crash (kill -9)
        await ledger.release_all_holds()
        await asyncio.to_thread(reap_dead_tools)
        maintenance = asyncio.get_running_loop().create_task(_maintain(runtime))
        try:
            yield
        finally:
            maintenance.cancel()
            await endpoint.drain()
            await sessions.shutdown()
            await mcp.close()
            await tokens.drain()  # the token API's settles under way, before the ledger closes
            if token_lite is not None:
                await token_lite.aclose()
            await store.close()
            # batched spans leave now: uvicorn ends the process by re-raising SIGTERM, with no atexit
            await asyncio.to_thread(tracing.flush)

    callers = HttpCallers(authenticator, open_tenant=None if keyed else DEFAULT_TENANT)

    async def health_problems() -> list[str]:
        disk_problem = disk.reserve_problem()  # tools that write are refused meanwhile
        return [*(await store.problems()), *([f"disk: {disk_problem}"] if disk_problem else [])]

    key_service = KeyService(keys, authenticator)
    billing = BillingService(ledger, keys, meter)

    chat = ChatService(services, HubFeeds(hub, sessions, max_queue=settings.send_queue_max))
    tokens = token_gateway(settings, token_drv, config, meter)

    async def chat_for(_p: Principal) -> ChatService:
        return chat

    agent_models = AgentModels(chat_for)
    app = create_app(lifespan=lifespan, api=HttpApi(resources=lambda: services.resources,
                                                     principal_for=callers.principal, config=lambda: config,
                                                     admin_for=callers.admin, keys=lambda: key_service,
                                                     key_caller=callers.key_caller, billing=lambda: billing,
                                                     services=lambda: services, chat=lambda: chat,
                                                     probe=store.probe, health_problems=health_problems,
                                                     archive_max_bytes=settings.archive_max_bytes,
                                                     spool_dir=settings.data_dir,
                                                     max_body_bytes=settings.http_max_body_bytes,
                                                     cors_origins=cors_origin_list(settings.cors_origins),
                                                     metrics=lambda: metrics, turn_log=lambda: store,
                                                     console_dir=CONSOLE_DIR,
                                                     console_auth="keys" if keyed else "open",
                                                     health_extra=lambda: {"auth": "keys" if keyed else "open",
                                                                   **tool_sandbox.health()},
                                                     token_gateway=lambda: tokens,
                                                     token_caller=callers.vendor_principal,
                                                     agent_models=lambda: agent_models,
                                                     token_max_body_bytes=settings.token_api_max_body_bytes))
    app.add_api_websocket_route("/ws", endpoint)
    app.add_api_websocket_route("/", endpoint)
    runtime = Runtime(settings, store, hub, services, sessions, router, endpoint, app, drv, sandbox, mcp, config,
                      tool_sandbox=tool_sandbox, console_path=CONSOLE_PATH)
    return runtime


async def _maintain(rt: Runtime) -> None:
    """Evict idle session actors, stop idle MCP servers, and prune the event log past its retention."""
    while True:
        await asyncio.sleep(MAINTENANCE_INTERVAL_S)
        try:
            await rt.sessions.evict_idle()
            await rt.mcp.reap_idle()
            cutoff = now_ms() - rt.settings.event_retention_hours * 3_600_000
            await rt.store.prune_events(cutoff)
        except Exception:
            log.exception("maintenance failed")


def uvicorn_config(rt: Runtime) -> uvicorn.Config:
    s = rt.settings
    # Frames are small JSON events: compressing each costs more CPU than it saves, and API
    # Gateway (the cloud edge) does not compress either.
    return uvicorn.Config(rt.app, host=s.host, port=s.port, log_config=None, lifespan="on", access_log=False,
                          ws="websockets-sansio", ws_max_size=s.max_frame_bytes, ws_per_message_deflate=False,
                          ws_ping_interval=s.ping_interval_s, ws_ping_timeout=s.ping_interval_s,
                          timeout_graceful_shutdown=15, loop="none", http=JoinedWritesProtocol)


def url_host(host: str) -> str:
    """`host` as it goes in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def llm_text(rt: Runtime) -> str:
    if rt.driver.name == "scripted":
        return "scripted (offline; set LLM_API_KEY to use Anthropic)"
    return f"{rt.driver.name} ({rt.settings.llm_model})"


def banner_lines(rt: Runtime, port: int) -> list[str]:
    """What a person reads when the server is up: where to reach it and what it runs."""
    s = rt.settings
    base = f"{url_host(s.host)}:{port}"
    rows = [("HTTP", f"http://{base}"), ("WebSocket", f"ws://{base}/ws"), ("API docs", f"http://{base}/docs")]
    if rt.console_path is not None:
        rows.append(("Console", f"http://{base}{rt.console_path}"))
    rows += [("LLM", llm_text(rt)), ("Data", str(s.data_dir)), ("Log file", str(s.data_dir / "logs" / "avm.log"))]
    if rt.tool_sandbox is not None:
        rows.append(("Sandbox", rt.tool_sandbox.mode))
    return [f"AgentVM {__version__} is running", *(f"  {name:<10} {value}" for name, value in rows),
            "Press Ctrl-C to stop."]


def banner(rt: Runtime, port: int) -> None:
    """The start-up line: readable lines on the console (the record's `console` text), the same facts
    as keys in the JSON log."""
    s = rt.settings
    base = f"{url_host(s.host)}:{port}"
    sandbox = rt.tool_sandbox
    tools = f" — tool sandbox: {sandbox.mode}" if sandbox is not None else ""
    log.info(f"AgentVM {__version__} listening on ws://{base}/ws — LLM: {llm_text(rt)}{tools}",
             extra={"event": "startup", "version": __version__, "host": s.host, "port": port,
                    "http_url": f"http://{base}", "ws_url": f"ws://{base}/ws", "docs_url": f"http://{base}/docs",
                    "console_url": f"http://{base}{rt.console_path}" if rt.console_path is not None else None,
                    "data_dir": str(s.data_dir), "driver": rt.driver.name,
                    "model": s.llm_model if rt.driver.name != "scripted" else None,
                    "sandbox": sandbox.mode if sandbox is not None else None, "flush_ms": s.stream_flush_ms,
                    CONSOLE_TEXT: "\n".join(banner_lines(rt, port))})
    if sandbox is not None and sandbox.warning is not None:
        log.warning(f"WARNING: {sandbox.warning}. Unset AVM_UNSAFE_UNSANDBOXED_TOOLS once bubblewrap is installed "
                    "or the server runs as root.", extra={"event": "startup", "sandbox": sandbox.mode})
    elif sandbox is not None and sandbox.refusal is not None:
        log.warning(f"Images with sandbox tools are refused: {sandbox.refusal}",
                    extra={"event": "startup", "sandbox": sandbox.mode})
