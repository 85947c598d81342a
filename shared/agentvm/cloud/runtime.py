"""The cloud composition root: the only place that chooses the AWS adapters.

One `CloudRuntime` per Lambda execution environment: clients are created on first use and reused by
every invocation; one event loop is kept for the environment (botocore clients are loop-independent,
and asyncio primitives must not hop between loops). Per invocation, `invocation()` wires a fresh
`CloudFanout` (its delivery state belongs to one invocation) with the services over it.

An execution environment is a thread here: Lambda runs one invocation at a time per environment,
and the test harness emulates several warm environments with several threads.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import botocore.session

from agentvm.adapters.aws.apigw_gateway import MAX_FRAME_BYTES, ApiGatewayGateway
from agentvm.adapters.aws.aws_env import SecretLLMProvider, SecretValues
from agentvm.adapters.aws.botocore_async import set_threads
from agentvm.adapters.aws.dynamodb_connections import DynamoDBConnections
from agentvm.adapters.aws.dynamodb_keys import DynamoDBKeys
from agentvm.adapters.aws.dynamodb_leases import DynamoDBLeases
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.frame_offload import S3FrameOffload
from agentvm.adapters.aws.lambda_dispatcher import LambdaDispatcher
from agentvm.adapters.aws.s3_blobs import S3BlobStore
from agentvm.adapters.aws.s3_history_archive import S3HistoryArchive
from agentvm.auth.api_keys import Authenticator
from agentvm.config import Settings
from agentvm.domain.models import Image, LeaseHandoff, LoggedEvent, Turn
from agentvm.engine.history_cache import HistoryCache
from agentvm.errors import InvalidRequest
from agentvm.ids import lease_owner
from agentvm.ports import Dispatcher, Driver

if TYPE_CHECKING:
    from pathlib import Path

    from agentvm.adapters.aws.cloud_fanout import CloudFanout
    from agentvm.adapters.aws.dynamodb_turn_hosts import DynamoDBTurnHosts
    from agentvm.adapters.aws.ecs_tasks import EcsContainerTier
    from agentvm.adapters.aws.routed_gateway import LocalSockets, RoutedGateway
    from agentvm.adapters.aws.sqs_turn_queue import SqsTurnQueue
    from agentvm.api.ws_router import CommandRouter
    from agentvm.engine.runner import EngineOptions
    from agentvm.hosting.definition_cache import DefinitionCache
    from agentvm.hosting.drain import Drain
    from agentvm.hosting.runtime_ports import RuntimePorts
    from agentvm.hosting.session_worker import DeadRunner, SessionWorker
    from agentvm.services.billing import BillingService
    from agentvm.services.config import ConfigService
    from agentvm.services.metering import Meter
    from agentvm.services.token_gateway import TokenGateway

T = TypeVar("T")


class _Environment(threading.local):
    loop: asyncio.AbstractEventLoop | None = None
    runtime: CloudRuntime | None = None


_env = _Environment()


def loop() -> asyncio.AbstractEventLoop:
    """The environment's event loop, made the thread's current one (Mangum runs the HTTP app on the
    current loop: the runtime's clients and the app must share one)."""
    if _env.loop is None or _env.loop.is_closed():
        _env.loop = asyncio.new_event_loop()
    asyncio.set_event_loop(_env.loop)
    return _env.loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one invocation's work on the environment's event loop."""
    return loop().run_until_complete(coro)


def build_driver(settings: Settings, api_key: str | None) -> Driver:
    """The function tier's LLM driver: the SDK-free Anthropic driver when a key is configured, else
    the offline scripted driver. Imported here, so only `chat_turn` pays for loading a driver."""
    if api_key:
        from agentvm.drivers.anthropic_lite import AnthropicLiteDriver

        return AnthropicLiteDriver(api_key, base_url=settings.llm_base_url, timeout_s=settings.llm_timeout_s,
                                   max_retries=settings.llm_max_retries)
    from agentvm.drivers.scripted import ScriptedDriver

    if settings.script_path is not None:
        return ScriptedDriver.from_file(settings.script_path)
    return ScriptedDriver()


@dataclass(slots=True)
class Invocation:
    """The objects of one invocation, over the environment's clients."""

    owner: str
    fanout: CloudFanout
    deps: RuntimePorts


class CloudRuntime:
    def __init__(self, settings: Settings, *, session: botocore.session.Session | None = None,
                 tenant_scope: str | None = None, secrets_session: botocore.session.Session | None = None) -> None:
        """`session`: where every AWS client gets its credentials (None: the environment's default).
        The container task passes its tenant-scoped session (adapters/aws/tenant_scope.py) with
        `tenant_scope`, its tenant: then nothing here touches a table item outside that tenant's
        keys; `secrets_session` reads the LLM key (the task role's, before it is dropped)."""
        if not settings.table_name:
            raise InvalidRequest("AVM_TABLE_NAME is not set: the cloud runtime needs its DynamoDB table",
                                 field="table_name")
        set_threads(settings.aws_threads)  # before any client: a turn host runs many turns at once
        self.settings = settings
        self.session = session
        self.secrets_session = secrets_session or session
        # the archive of the history TTL removed (functions/history_archive writes it): reads merge it back
        self.history_archive = S3HistoryArchive(settings.bucket, session=session,
                                                endpoint_url=settings.aws_endpoint_url,
                                                region_name=settings.aws_region) if settings.bucket else None
        self.store = DynamoDBStore(settings.table_name, session=session, endpoint_url=settings.aws_endpoint_url,
                                   region_name=settings.aws_region, history_hot_days=settings.history_hot_days,
                                   archive=self.history_archive)
        self.registry = DynamoDBConnections(self.store, tenant_scope=tenant_scope)
        self.leases = DynamoDBLeases(self.store)
        self.key_store = DynamoDBKeys(self.store)
        self.authenticator = Authenticator(self.key_store)
        self._driver: Driver | None = None
        self._sandbox: Any = None  # the container task's WorkspaceTools (agentvm.worker only)
        self._workspace_disk: Any = None  # and its S3Disk
        # every runner of this process shares it: a warm environment's next turn of a session reads
        # only what was stored since (engine/history_cache.py)
        self.history_cache = HistoryCache(settings.history_cache_mb * 1024 * 1024) \
            if settings.history_cache_mb > 0 else None

    @functools.cached_property
    def gateway(self) -> ApiGatewayGateway | RoutedGateway:
        """Where frames to connections go: API Gateway's management API; with a turn-host tier also
        the sockets of the hosts' own fronts (`h-…` connection ids, adapters/aws/routed_gateway.py).
        A turn host with a front replaces it with one that knows its own sockets (`use_front`)."""
        if not self.settings.turn_queue_url:
            return self.api_gateway
        from agentvm.adapters.aws.routed_gateway import RoutedGateway

        return RoutedGateway(lambda: self.api_gateway, self.turn_hosts)

    def use_front(self, *, local: LocalSockets, dispatcher: Dispatcher) -> None:
        """The turn host's own WebSocket front (turnhost/front.py): frames to its sockets (`local`) go
        straight to them, turns of its connections start with `dispatcher` (on the host when it has room)."""
        from agentvm.adapters.aws.routed_gateway import RoutedGateway

        self.__dict__["gateway"] = RoutedGateway(lambda: self.api_gateway, self.turn_hosts, local=local)
        self.__dict__["dispatcher"] = dispatcher

    @functools.cached_property
    def api_gateway(self) -> ApiGatewayGateway:
        s = self.settings
        if not s.ws_endpoint:
            raise InvalidRequest("AVM_WS_ENDPOINT is not set: cannot post to WebSocket connections",
                                 field="ws_endpoint")
        # Offload only what API Gateway cannot carry: below 128 KB, extra 32 KB units ($1 per million
        # each) cost less than an S3 PUT ($5 per million) plus the GET and the reference frame.
        offload = None
        if s.bucket:
            offload = S3FrameOffload(S3BlobStore(s.bucket, prefix="tmp", session=self.session,
                                                 endpoint_url=s.aws_endpoint_url, region_name=s.aws_region))
        return ApiGatewayGateway(s.ws_endpoint, session=self.session, region_name=s.aws_region, blobs=offload,
                                 inline_limit=MAX_FRAME_BYTES)

    @functools.cached_property
    def lambda_dispatcher(self) -> LambdaDispatcher:
        """The per-turn function tier: an async invoke of `chat_turn`."""
        s = self.settings
        if not s.chat_turn_function:
            raise InvalidRequest("AVM_CHAT_TURN_FUNCTION is not set: cannot start turns", field="chat_turn_function")
        return LambdaDispatcher(s.chat_turn_function, session=self.session,
                                endpoint_url=s.lambda_endpoint_url or s.aws_endpoint_url, region_name=s.aws_region)

    @functools.cached_property
    def dispatcher(self) -> Dispatcher:
        """How `ws_default` and `turn_sweep` start turns: the tiered scheduler (a turn host when one
        accepts, else `chat_turn`) when the deployment has a turn queue, else `chat_turn` directly."""
        if not self.settings.turn_queue_url:
            return self.lambda_dispatcher
        from agentvm.hosting.turn_tiers import TieredDispatcher

        return TieredDispatcher(self.turn_queue, self.turn_hosts, self.lambda_dispatcher)

    @functools.cached_property
    def turn_queue(self) -> SqsTurnQueue:
        s = self.settings
        if not s.turn_queue_url:
            raise InvalidRequest("AVM_TURN_QUEUE_URL is not set: there is no turn-host tier", field="turn_queue_url")
        from agentvm.adapters.aws.sqs_turn_queue import SqsTurnQueue

        return SqsTurnQueue(s.turn_queue_url, session=self.session, endpoint_url=s.aws_endpoint_url,
                            region_name=s.aws_region)

    @functools.cached_property
    def turn_hosts(self) -> DynamoDBTurnHosts:
        from agentvm.adapters.aws.dynamodb_turn_hosts import DynamoDBTurnHosts

        return DynamoDBTurnHosts(self.store)

    @functools.cached_property
    def container_tier(self) -> EcsContainerTier | None:
        """The ECS container tier, when the deployment has one (template.yaml: WorkerImageUri)."""
        s = self.settings
        if not s.ecs_cluster or not s.ecs_task_definition:
            return None
        from agentvm.adapters.aws.clients import LazyClient
        from agentvm.adapters.aws.ecs_tasks import EcsContainerTier

        ecs = LazyClient("ecs", session=self.session, endpoint_url=s.ecs_endpoint_url or s.aws_endpoint_url,
                         region_name=s.aws_region)
        return EcsContainerTier(self.store, ecs, cluster=s.ecs_cluster, task_definition=s.ecs_task_definition,
                                subnets=_csv(s.ecs_subnets), security_groups=_csv(s.ecs_security_groups),
                                container_name=s.ecs_container_name, heartbeat_ttl_s=s.worker_heartbeat_ttl_s)

    @functools.cached_property
    def secrets(self) -> SecretValues:
        return SecretValues(session=self.secrets_session, endpoint_url=self.settings.aws_endpoint_url,
                            region_name=self.settings.aws_region)

    @functools.cached_property
    def llm(self) -> SecretLLMProvider:
        """The LLM key: AVM_LLM_API_KEY (or its aliases) when set, else the secret AVM_LLM_SECRET_ARN."""
        s = self.settings
        explicit = s.llm_api_key.get_secret_value() if s.llm_api_key is not None else None
        return SecretLLMProvider(self.secrets, s.llm_secret_arn, explicit=explicit)

    @functools.cached_property
    def config(self) -> ConfigService | None:
        """The config center: built-in defaults < the function's environment < the runtime layer
        under the template's SSM path (cached 30 s per environment). None without AVM_CONFIG_PATH."""
        s = self.settings
        if not s.config_path:
            return None
        from agentvm.adapters.aws.ssm_config import SsmConfigStore
        from agentvm.adapters.local.local_env import ProcessEnv
        from agentvm.services.config import from_settings

        store = SsmConfigStore(s.config_path, self.store, endpoint_url=s.aws_endpoint_url, region_name=s.aws_region,
                               session=self.session)
        return from_settings(s, store, ProcessEnv(), file=None)

    @functools.cached_property
    def meter(self) -> Meter:
        """Budgets, rate limits and the usage ledger of every LLM call (budgets cached 30 s)."""
        from agentvm.adapters.aws.dynamodb_usage import DynamoDBUsageLedger
        from agentvm.services.metering import Meter

        return Meter(DynamoDBUsageLedger(self.store), budget_cache_s=30.0)

    @functools.cached_property
    def billing(self) -> BillingService:
        """/v1/budgets and /v1/usage over the ledger."""
        from agentvm.services.billing import BillingService

        return BillingService(self.meter.ledger, self.key_store, self.meter)

    @functools.cached_property
    def token_gateway(self) -> TokenGateway:
        """The token API (docs/token-api.md) over this environment's driver (Anthropic with a key, else the
        scripted model), the config center's catalog and the meter. Configured providers' keys are read by
        name from the SSM parameters under AVM_CONFIG_PATH (`secret:` values from Secrets Manager)."""
        from decimal import Decimal

        from agentvm.money import DEFAULT_MARKUP, DEFAULT_PRICES
        from agentvm.ports import Env
        from agentvm.services.model_catalog import ModelCatalog, ProviderSpec, build_catalog
        from agentvm.services.model_drivers import ModelDrivers, upstream_factories
        from agentvm.services.token_gateway import TokenGateway

        s = self.settings
        env: Env
        if s.config_path:
            from agentvm.adapters.aws.aws_env import AwsEnv, ParameterValues

            env = AwsEnv(ParameterValues(session=self.session, endpoint_url=s.aws_endpoint_url,
                                         region_name=s.aws_region), s.config_path, self.secrets)
        else:
            from agentvm.adapters.local.local_env import ProcessEnv

            env = ProcessEnv()

        async def catalog() -> tuple[ModelCatalog, Decimal]:
            anthropic = (await self.driver()).name != "scripted"
            if self.config is None:
                return build_catalog(DEFAULT_PRICES, {}, anthropic=anthropic), DEFAULT_MARKUP
            return await self.config.catalog(anthropic=anthropic, anthropic_base_url=s.llm_base_url)

        def anthropic(spec: ProviderSpec, key: str | None) -> Driver:
            from agentvm.drivers.anthropic_lite import AnthropicLiteDriver

            return AnthropicLiteDriver(key or "", base_url=spec.base_url, timeout_s=s.llm_timeout_s,
                                       max_retries=s.llm_max_retries)

        drivers = ModelDrivers(builtin={}, lazy={"anthropic": self.driver, "scripted": self.driver},
                               factories={"anthropic": anthropic,
                                          **upstream_factories(timeout_s=s.llm_timeout_s,
                                                               max_retries=s.llm_max_retries)},
                               env=env)
        return TokenGateway(catalog=catalog, drivers=drivers, meter=self.meter)

    async def ready(self) -> CloudRuntime:
        await self.store.open()
        return self

    async def driver(self) -> Driver:
        """The LLM driver, with its key from `llm` (the driver is kept for the environment)."""
        if self._driver is None:
            self._driver = build_driver(self.settings, await self.llm.api_key())
        return self._driver

    def options(self, driver: Driver | None, *, tier: str = "function") -> EngineOptions:
        from agentvm.engine.runner import EngineOptions

        s = self.settings
        model = "scripted" if driver is not None and driver.name == "scripted" else s.llm_model
        return EngineOptions(default_model=model, max_tokens=s.llm_max_tokens, flush_ms=s.stream_flush_ms,
                             max_flush_ms=s.stream_max_flush_ms, max_iterations=s.max_tool_iterations,
                             tier=tier)

    def invocation(self, tenant_id: str, *, role: str, driver: Driver | None = None,
                   workspaces: Path | None = None, request_id: str | None = None) -> Invocation:
        """`workspaces`: the container task's base directory of workspaces (the worker runs turns in
        the container tier); otherwise turns run in the function tier and escalate to `container_tier`.
        `request_id`: the Lambda request id, which names the invocation's leases (its failure record
        names them too: hosting/turn_failure.py); else a random id."""
        # imported here: $connect and $disconnect never load the engine (ws_default and chat_turn
        # load it at init through their own imports)
        from agentvm.adapters.aws.cloud_fanout import CloudFanout
        from agentvm.hosting.runtime_ports import RuntimePorts

        store = self.store

        async def replay(session_id: str, after_seq: int) -> list[LoggedEvent]:
            return await store.read_events(tenant_id, session_id, after_seq)

        async def head(session_id: str) -> int:
            return await store.last_seq(tenant_id, session_id)

        owner = lease_owner(role, request_id or uuid.uuid4().hex)
        fanout = CloudFanout(gateway=self.gateway, registry=self.registry, tenant_id=tenant_id, replay_source=replay,
                             head_source=head)
        if workspaces is not None:
            sandbox = self._sandbox_tools(workspaces)
            deps = RuntimePorts(store=store, fanout=fanout, driver=driver,
                                options=self.options(driver, tier="container"), tools=sandbox, sandbox_tools=sandbox)
        elif driver is not None:
            from agentvm.tools.catalog import ToolCatalog

            # without a container tier images get no sandbox tools (docs/cloud-design.md); tools that
            # need none (knowledge_search) run here either way
            tier = self.container_tier
            deps = RuntimePorts(store=store, fanout=fanout, driver=driver, options=self.options(driver),
                                tools=ToolCatalog(store=store, sandbox=tier is not None,
                                                  http_allow_private=self.settings.http_tools_allow_private),
                                container_tier=tier)
        else:
            deps = RuntimePorts(store=store, fanout=fanout, driver=driver, options=self.options(driver),
                                offline_llm=self.settings.llm_api_key is None and not self.settings.llm_secret_arn)
        deps.image_deleted = self.image_deleted
        if driver is not None:
            deps.turn_options = self.config  # each turn takes the current configuration
            deps.meter = self.meter
            deps.history_cache, deps.recent_messages = self.history_cache, store
        return Invocation(owner, fanout, deps)

    def _sandbox_tools(self, workspaces: Path) -> Any:
        """The container task's tools, one set for the task's life (its MCP servers are reused), on
        the workspace the task's disk mounted."""
        if self._sandbox is None:
            import functools as ft

            from agentvm.adapters.local.local_fs import LocalFileSystem
            from agentvm.adapters.local.local_process import LocalProcessRunner
            from agentvm.domain.sandbox_limits import Limits
            from agentvm.sandbox.quota import DiskPolicy
            from agentvm.sandbox.uids import ToolUids
            from agentvm.tools.mcp import McpPool
            from agentvm.tools.provider import WorkspaceTools

            s = self.settings
            # the workspace quota; no disk reserve: the task's disk holds no database (DynamoDB does)
            disk = DiskPolicy(s.workspace_quota_bytes, 0)
            self._sandbox = WorkspaceTools(
                # the worker listens on no socket: where the platform grants no network namespace (Fargate)
                # the uid drop alone keeps tools off the server's files (docs/security.md)
                self.workspace_disk(workspaces), LocalFileSystem,
                ft.partial(LocalProcessRunner, isolation=s.sandbox_isolation,
                           unsafe_unsandboxed=s.unsafe_unsandboxed_tools, private_network=False, disk=disk),
                uids=ToolUids(workspaces / "tool-uids.json"), limits=Limits(timeout_s=s.tool_timeout_s),
                preview_bytes=s.tool_preview_bytes, mcp=McpPool(idle_s=s.mcp_idle_s, call_timeout_s=s.tool_timeout_s),
                store=self.store, http_allow_private=s.http_tools_allow_private, disk_policy=disk)
        return self._sandbox

    def workspace_disk(self, workspaces: Path) -> Any:
        """The container task's `S3Disk` (one for the task: the worker mounts, the tools find it mounted)."""
        if self._workspace_disk is None:
            from agentvm.adapters.aws.s3_disk import S3Disk

            s = self.settings
            if not s.bucket:
                raise InvalidRequest("AVM_BUCKET is not set: the worker keeps workspaces in S3", field="bucket")
            blobs = S3BlobStore(s.bucket, session=self.session, endpoint_url=s.aws_endpoint_url,
                                region_name=s.aws_region)
            self._workspace_disk = S3Disk(s.bucket, workspaces, blobs.s3)
        return self._workspace_disk

    async def stop_mcp_servers(self, tenant_id: str, container_id: str, servers: set[tuple[str, str]]) -> int:
        """The container task: stop these (name, config fingerprint) MCP servers of a deleted image."""
        if self._sandbox is None:
            return 0
        return int(await self._sandbox.mcp.stop_servers((tenant_id, container_id), servers))

    async def image_deleted(self, image: Image) -> None:
        """A deleted image's MCP servers that no other image of its container uses are stopped in the
        container's task, when one runs (`EcsContainerTier.stop_mcp_servers`)."""
        tier = self.container_tier
        if tier is None or not image.config.get("mcpServers"):
            return
        from agentvm.tools.catalog import released_servers

        if servers := await released_servers(self.store, image):
            await tier.stop_mcp_servers(image.tenant_id, image.container_id, servers)

    async def close_sandbox(self) -> None:
        """Stop the container task's MCP servers."""
        if self._sandbox is not None:
            await self._sandbox.mcp.close()

    def router(self, invocation: Invocation) -> CommandRouter:
        """`ws_default`: the AgentX command router over the services, sessions hosted by lease.
        (Imported here for the same reason as in `invocation`.)"""
        from agentvm.api.ws_router import CommandRouter
        from agentvm.hosting.leased_host import LeasedSessions
        from agentvm.services.use_cases import UseCases

        sessions = LeasedSessions(invocation.deps, fanout=invocation.fanout, leases=self.leases,
                                  dispatcher=self.dispatcher, owner=invocation.owner)
        return CommandRouter(UseCases(invocation.deps, sessions), invocation.fanout)

    @functools.cached_property
    def definitions(self) -> DefinitionCache | None:
        """Sessions' images and agents, kept between turns of this process (hosting/definition_cache.py)."""
        if self.settings.definition_cache_s <= 0:
            return None
        from agentvm.hosting.definition_cache import DefinitionCache

        return DefinitionCache(self.settings.definition_cache_s)

    def worker(self, invocation: Invocation, drain: Drain | None = None) -> SessionWorker:
        from agentvm.hosting.session_worker import SessionWorker

        return SessionWorker(invocation.deps, fanout=invocation.fanout, leases=self.leases, owner=invocation.owner,
                             lease_ms=self.settings.session_lease_s * 1000, definitions=self.definitions,
                             drain=drain)

    async def run_session(self, tenant_id: str, session_id: str, *, role: str,
                          request_id: str | None = None, handoff: LeaseHandoff | None = None,
                          drain: Drain | None = None) -> list[Turn]:
        """Run a session's queued turns under its lease, as one `chat_turn` invocation does (and a
        turn host per request, with its `drain`): a fresh fan-out for the run, closed afterwards."""
        inv = self.invocation(tenant_id, role=role, driver=await self.driver(), request_id=request_id)
        try:
            return await self.worker(inv, drain).run(tenant_id, session_id, handoff=handoff)
        finally:
            await inv.fanout.close()

    async def fail_dead_runner(self, tenant_id: str, session_id: str, dead_runner: str) -> DeadRunner | None:
        """`turn_failed`: take the lease of a runner Lambda reported dead and fail its turn
        (`SessionWorker.fail_dead_runner`); no LLM driver, the meter for the budget hold."""
        inv = self.invocation(tenant_id, role="turn_failed")
        inv.deps.meter = self.meter
        try:
            return await self.worker(inv).fail_dead_runner(tenant_id, session_id, dead_runner)
        finally:
            await inv.fanout.close()


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def runtime() -> CloudRuntime:
    """The execution environment's runtime, built from the environment on first use."""
    if _env.runtime is None:
        _env.runtime = CloudRuntime(Settings())
    return _env.runtime


def reset() -> None:
    """Forget this environment's runtime (tests: a new execution environment)."""
    _env.runtime = None
