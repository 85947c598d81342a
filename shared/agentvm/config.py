"""Settings: the one place that reads the environment. Every knob has a default and a doc string."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_ORIGIN = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?")


def cors_origin_list(value: str) -> list[str]:
    """AVM_CORS_ORIGINS as a list (empty: no cross-origin access)."""
    return [o.strip() for o in value.split(",") if o.strip()]


def _default_data_dir() -> Path:
    return Path.home() / ".agentvm"


class EnvSettings(BaseModel):
    """A model whose fields are read from the environment as pydantic-settings reads them: keyword
    arguments first, then the variable `<env_prefix><FIELD>` (names compared without case) or, for a field
    with `AliasChoices`, the first of its variables that is set; else the default. Values are validated
    as pydantic validates strings (`"8080"` → 8080, `"true"` → True). Hand-written because
    pydantic-settings costs every Lambda cold start ~55 ms of imports for these few lines."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, validate_default=True)
    env_prefix: ClassVar[str] = "AVM_"

    @model_validator(mode="before")
    @classmethod
    def _environment(cls, given: Any) -> Any:
        if not isinstance(given, dict):
            return given
        env = {name.lower(): value for name, value in os.environ.items()}
        found: dict[str, str] = {}
        for name, field in cls.model_fields.items():
            if name in given:
                continue
            alias = field.validation_alias
            names = [str(c) for c in alias.choices] if isinstance(alias, AliasChoices) else [cls.env_prefix + name]
            value = next((env[n.lower()] for n in names if n.lower() in env), None)
            if value is not None:
                found[name] = value
        return {**found, **given}


class Settings(EnvSettings):
    """Runtime settings. Environment variables use the `AVM_` prefix unless noted."""

    # no NaN or ±Infinity in any float setting (every number also has an upper bound: docs/configuration.md)
    model_config = ConfigDict(extra="ignore", populate_by_name=True, validate_default=True, allow_inf_nan=False)

    host: str = Field("127.0.0.1", description="Address `avm serve` binds.")
    port: int = Field(8080, ge=0, le=65535, description="Port `avm serve` binds (0 picks a free one).")
    data_dir: Path = Field(default_factory=_default_data_dir,
                           description="Where the SQLite database and blob files live.")
    db_check_s: float = Field(30.0, ge=0, le=3600, description=(
        "Time limit of the database integrity check (PRAGMA quick_check) `avm serve` runs before it "
        "listens; past it the server starts with a warning. 0 skips the check."))

    llm_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("LLM_API_KEY", "AVM_LLM_API_KEY", "ANTHROPIC_API_KEY"),
        description="Anthropic API key; without one the offline scripted driver is used.")
    llm_base_url: str | None = Field(None, description="Override of the Anthropic API base URL.")
    llm_model: str = Field("claude-sonnet-4-6", description="Model for images that do not name one.")
    llm_max_tokens: int = Field(4096, ge=1, le=200_000, description="max_tokens for each LLM call.")
    llm_timeout_s: float = Field(600.0, gt=0, le=3600, description="Timeout of one LLM call.")
    llm_max_retries: int = Field(2, ge=0, le=10,
                                 description="Retries of retryable LLM errors before any output.")
    llm_http_client: Literal["aiohttp", "httpx"] = Field("aiohttp", description=(
        "HTTP client of avm serve's token API calls to Anthropic and OpenAI-compatible providers "
        "(agentvm/drivers/upstream_http.py): aiohttp (about 1 ms a call less) or httpx, which the cloud uses."))
    script_path: Path | None = Field(None, description="Script file for the scripted driver.")

    stream_flush_ms: int = Field(0, ge=0, le=5000, description=(
        "Text-delta coalescing window: the first delta goes at once, later ones are merged per window. "
        "0 sends every delta."))
    stream_max_flush_ms: int = Field(0, ge=0, le=10_000, description=(
        "Upper bound of the coalescing window, which doubles after each frame; 0 keeps it at "
        "stream_flush_ms. The cloud uses 2000 so that long replies cost few API Gateway frames "
        "(bound: docs/protocol.md, 'Text frames per reply')."))
    history_cache_mb: int = Field(32, ge=0, le=4096, description=(
        "Session histories a cloud runner (chat_turn's environment, a turn host) keeps between turns, "
        "in MB: a turn then reads only the messages stored since. 0 reads every history in full."))
    definition_cache_s: int = Field(60, ge=0, le=3600, description=(
        "Cloud runners keep a session's image and agent between its turns for at most this many "
        "seconds (an image's name or description edit reaches turns after at most this long; a "
        "destroyed agent or deleted image is seen at once). 0 reads them for every turn."))
    max_frame_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024,
                                 description="Largest accepted client frame.")
    send_queue_max: int = Field(10_000, ge=16, le=1_000_000, description=(
        "Frames queued for one connection before it is closed as too slow."))
    ping_interval_s: float = Field(30.0, gt=0, le=3600, description="WebSocket ping interval.")
    auth: Literal["auto", "keys", "open"] = Field("auto", description=(
        "Who may use `avm serve`: `keys` (an API key on every request and connection), `open` (no keys: "
        "loopback only), `auto` (open on a loopback address, keys on any other)."))
    auth_timeout_s: float = Field(5.0, gt=0, le=300, description="Deadline for a first `auth` frame when required.")
    event_retention_hours: int = Field(48, ge=24, le=87_600, description="How long the session event log is kept.")
    history_hot_days: int = Field(30, ge=0, le=3650, description=(
        "Cloud: days a session's messages, turns and search items stay in DynamoDB after their last "
        "write; DynamoDB's TTL then moves them to the S3 archive (`archive/` in AVM_BUCKET). 0 keeps "
        "them in the table forever (no archive). `avm serve` keeps everything."))
    max_tool_iterations: int = Field(25, ge=1, le=1000, description="LLM calls allowed in one turn.")
    tool_timeout_s: float = Field(30.0, gt=0, le=3600, description=(
        "Run time limit of one tool call; then its whole process group is killed."))
    tool_preview_bytes: int = Field(16 * 1024, ge=1024, le=1 << 20, description=(
        "Tool output given to the model; the rest is kept in the workspace's output/ with a note."))
    sandbox_isolation: Literal["auto", "bwrap", "none"] = Field("auto", description=(
        "Tool sandbox: bubblewrap when usable (auto), required (bwrap), or never (none: rlimits, a "
        "scrubbed environment, path confinement and, as root, a uid per container in its own network "
        "namespace). Without bubblewrap and without root, tools are refused unless unsafe_unsandboxed_tools."))
    workspace_quota_bytes: int = Field(1 << 30, ge=1 << 20, le=1 << 50, description=(
        "Disk a container's workspace may use (bytes): write_file/edit_file past it are refused, a tool "
        "call's writes fail past it and the call is killed; the result names the quota."))
    disk_reserve_bytes: int = Field(512 << 20, ge=0, le=1 << 50, description=(
        "Free space kept on the data directory's filesystem for the database (bytes): under it, tools that "
        "write are refused and running calls killed, and /health says degraded. 0: not watched."))
    unsafe_unsandboxed_tools: bool = Field(False, description=(
        "UNSAFE opt-in: run tools on a host with no isolating sandbox (no bubblewrap, not root) as the "
        "server's own user, able to read its keys, database and logs and call its API. Off: such a host "
        "refuses images with sandbox tools."))
    config_file: Path | None = Field(None, description=(
        "The config center's file layer (default <data-dir>/config.yaml; docs/configuration.md)."))
    http_tools_allow_private: bool = Field(False, description=(
        "Let HTTP tools (tool resources of type http) call loopback, private and link-local addresses. "
        "Off: they reach public addresses only (no metadata endpoint, nothing next to the server)."))
    mcp_idle_s: float = Field(300.0, gt=0, le=86_400,
                              description="A container's MCP servers stop after this long unused.")
    archive_max_bytes: int = Field(64 * 1024 * 1024, ge=1024, le=1 << 36, description=(
        "Largest session archive `POST /v1/sessions/import` accepts (bytes); larger ones get a 413."))
    http_max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=1 << 30, description=(
        "Largest body of any other HTTP request (bytes); larger ones get a 413, unread."))
    token_api_max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, le=1 << 30, description=(
        "Largest body of a token API request (/v1/chat/completions, /v1/responses, /v1/messages: images "
        "travel in it as base64; Anthropic's own limit is 32 MB); larger ones get a 413, unread."))
    cors_origins: str = Field("", description=(
        "Origins whose browser pages may call the HTTP APIs (comma-separated, e.g. "
        "https://console.example.com); empty: no cross-origin access. No wildcard: name each origin."))
    log_level: str = Field("INFO", description=(
        "Log level of the structured log: DEBUG, INFO, WARNING, ERROR or CRITICAL (any case)."))
    log_format: Literal["auto", "console", "json"] = Field("auto", description=(
        "`avm serve`'s stderr lines: readable `console` lines, `json` lines, or `auto` (console when stderr "
        "is a terminal, JSON otherwise). The log file is JSON whatever this says."))
    reliable_wrapper: bool = Field(True, description=(
        "Wrap frames as {__msgId, __payload} and accept ACKs. Off in the cloud: every ACK would be a billed "
        "frame and a $default invocation."))

    # cloud tier (set by template.yaml)
    table_name: str | None = Field(None, description="DynamoDB table of the cloud tier.")
    bucket: str | None = Field(None, description="S3 bucket for large payloads and exports.")
    ws_endpoint: str | None = Field(None, description="API Gateway management endpoint (https://…/stage).")
    chat_turn_function: str | None = Field(None, description="ARN or name of the chat_turn function alias.")
    llm_secret_arn: str | None = Field(None, description="Secrets Manager secret holding the LLM key.")
    config_path: str | None = Field(None, description="SSM parameter path of the runtime configuration.")
    ecs_cluster: str | None = Field(None, description="ECS cluster of the container tier (unset: no container tier).")
    ecs_task_definition: str | None = Field(None, description="Task definition of the container tier's worker.")
    ecs_subnets: str = Field("", description="Comma-separated subnets for worker tasks (public: no NAT gateway).")
    ecs_security_groups: str = Field("", description="Comma-separated security groups for worker tasks.")
    ecs_container_name: str = Field("worker", description="The worker's container name in the task definition.")
    ecs_endpoint_url: str | None = Field(None, description="Override of the ECS endpoint (tests).")
    worker_tenant_id: str | None = Field(None, description="The container task's tenant (set by RunTask).")
    worker_container_id: str | None = Field(None, description="The container task's container (set by RunTask).")
    worker_idle_s: float = Field(90.0, gt=0, le=86_400,
                                 description="A container task exits after this long without work.")
    worker_heartbeat_ttl_s: int = Field(60, ge=10, le=3600, description="How long a container task's heartbeat holds.")
    worker_tenant_role_arn: str | None = Field(None, description=(
        "The role a container task assumes for its tenant (template.yaml: TenantWorkerRole); the worker "
        "refuses to start without it (adapters/aws/tenant_scope.py)."))
    session_lease_s: int = Field(60, ge=3, le=900, description=(
        "How long a turn runner's session lease holds without renewal (it renews every third of it); "
        "a runner that dies is replaced after at most this long."))
    turn_queue_url: str = Field("", description=(
        "SQS queue of the turn-host tier; empty: no host tier (every turn runs on chat_turn)."))
    turn_host_capacity: int = Field(200, ge=1, le=10_000, description="Sessions one turn host runs at once.")
    turn_host_max_cpu: float = Field(0.7, gt=0, le=1, description=(
        "CPU use (of the host's vCPUs, over the last seconds) above which a turn host refuses new turns."))
    turn_host_heartbeat_s: float = Field(10.0, ge=0.2, le=300, description=(
        "Heartbeat period of a turn host; its record counts as live for three periods."))
    turn_host_vcpu: float = Field(0.0, ge=0, le=256, description=(
        "vCPUs of a turn host for its CPU limit; 0: read the cgroup's CPU quota, else the CPU count."))
    aws_threads: int = Field(16, ge=1, le=512, description=(
        "Threads that run AWS calls (and connections per AWS client): 16 for a Lambda function; a turn "
        "host running many turns at once needs more (the template sets 64)."))
    turn_host_poll_s: int = Field(20, ge=0, le=20, description="Long-polling wait of a turn host's queue receive.")
    turn_host_drain_s: float = Field(100.0, ge=0, le=3600, description=(
        "On SIGTERM (scale-in, a Fargate Spot interruption) a turn host lets its running turns finish for up to "
        "this long, then interrupts them and gives them 10 s to release their leases: 100 + 10 s stays within "
        "ECS's stopTimeout (120 s, the Spot warning)."))
    turn_host_ws_port: int = Field(0, ge=0, le=65_535, description=(
        "Port of a turn host's own WebSocket front (behind a load balancer); 0: no front."))
    turn_host_peer_port: int = Field(8081, ge=1, le=65_535, description=(
        "Port of a turn host's internal endpoint where other hosts post frames for its sockets (with a front)."))
    turn_host_address: str = Field("", description=(
        "The private address other hosts reach a turn host's internal endpoint at; empty: the ECS task's "
        "address from its metadata endpoint, else the host name's."))
    aws_endpoint_url: str | None = Field(None, description=(
        "Endpoint override for DynamoDB/S3/Lambda (moto or LocalStack in tests); unset in AWS."))
    lambda_endpoint_url: str | None = Field(None, description=(
        "Endpoint override for the Lambda Invoke API only (tests emulate async invokes); falls back to "
        "aws_endpoint_url."))
    aws_region: str | None = Field(None, validation_alias=AliasChoices("AWS_REGION", "AVM_AWS_REGION"),
                                   description="AWS region (set by Lambda).")

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: str) -> str:
        for origin in cors_origin_list(value):
            if not _ORIGIN.fullmatch(origin):
                raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], no path, no wildcard)")
        return value

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        level = value.strip().upper()
        if level not in LOG_LEVELS:
            raise ValueError(f"{value!r} is not a log level; use {', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]}")
        return level

    def database_path(self) -> Path:
        return self.data_dir / "agentvm.db"

    def blob_dir(self) -> Path:
        return self.data_dir / "blobs"


class ClientSettings(EnvSettings):
    """Settings of the `avm` client commands (`avm chat`)."""

    url: str = Field("ws://127.0.0.1:8080/ws", description="WebSocket URL of the server.")
    token: SecretStr | None = Field(None, description="API key sent as a Bearer token.")
    chat_history: Path | None = Field(None, description="File keeping the lines typed in `avm chat`.")
