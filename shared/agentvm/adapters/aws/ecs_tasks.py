"""The ContainerTier port on ECS Fargate, and the container-task record its workers keep.

A container (a tenant's workspace) has at most one Fargate task: started when a turn of one of its
sessions needs a sandbox, reused while it has work, exiting after an idle period. Who runs for the
container, and which sessions wait for it, is one item of the AgentVM table:

| attribute         | meaning                                                                        |
|-------------------|--------------------------------------------------------------------------------|
| PK, SK            | `CTASK#{tenant}#{container}` (ids escaped with `_k`), `CTASK`                  |
| tenant_id, container_id | plain ids (for reading the item; never part of a condition)              |
| pending (SS)      | sessions with an escalated turn for this container; absent when empty          |
| task_owner        | `starting:<uuid>` while a RunTask is in flight, then the worker's task id      |
| task_until        | epoch ms: the claim or heartbeat is live while `task_until > now`              |
| task_arn, task_started_at | the last task RunTask started, and when (epoch ms; informational)      |
| last_start_error  | the reason of the last failed RunTask (informational)                         |
| stop_mcp (SS)     | MCP servers (`name:fingerprint`) of deleted images the task must stop; absent when empty |

States:

* **no item / no `task_until`**: no task. The next `EcsContainerTier.start` claims the start.
* **starting**: `task_owner = starting:<uuid>`, `task_until = now + start_grace_s` (120 s by
  default). One escalation won the conditional claim and calls RunTask; concurrent escalations see
  a live `task_until` and leave it to that task. If RunTask fails, the claim is removed at once (the
  next escalation retries); if the caller dies mid-call the claim simply expires.
* **running**: the task's worker `register`ed (`task_owner` = its task id) and `beat`s (extends
  `task_until` by its heartbeat TTL, 60 s by default). A worker may take over a `starting:*` claim,
  an expired record, or its own.
* **expired**: `task_until <= now` with an owner: the worker died or stalled. The next `start`
  claims it and runs a new task; the old worker's `beat` then fails and it must stop.
* **finished**: the worker deleted the item (`finish`), which it may only do while `pending` is
  absent (DynamoDB removes an emptied set) and it still owns the record.

Why no escalated session is ever stranded:

* `start` first ADDs the session to `pending` (one UpdateItem returning ALL_NEW) and only then
  looks at liveness, in what that same write returned. So either it saw a live task, which finds
  the session in `pending` at its next `pending()` read or whose `finish` fails because `pending`
  is not empty; or it saw none and claims the start itself.
* The worker's `finish` is one conditional DeleteItem: it succeeds only if `pending` is absent *at
  that instant*. A session added after the worker's last `pending()` read makes `finish` return
  False, and the worker goes on (release-then-recheck in one request). A session added after a
  successful `finish` finds no live task and starts one.
* A failed RunTask leaves the session in `pending` (and raises `ContainerStartFailed`): the next
  task started for the container picks it up. Sessions left pending by a task that died are picked
  up by the next task the container starts; recovering them without a new escalation is the
  reliability sweep's job (their turns are stored as escalated).
* `done(session_ids)` removes handled sessions from the set. A worker calls it while it still holds
  the session's lease, so a new escalation of that session (which needs the lease) cannot fall
  between its last look at the session and the removal.

Deleting an image whose MCP servers no other image of the container runs: `stop_mcp_servers` ADDs
them to `stop_mcp` only while a task is live or starting (one conditional write; none runs: nothing
to stop, and the write fails harmlessly). The worker's `poll` reads `stop_mcp` with `pending` (the same
read), stops those servers of its pool, then `stopped` DELETEs them from the set.

Request counts: `start` 1 W when a task is live, else 3 W + 1 RunTask (ADD, claim, record the ARN;
a failed RunTask: release instead of record). Worker: `register`/`beat`/`done`/`finish` 1 W each,
`poll` (`pending`) 1 strongly consistent R; `stopped` 1 W after an image delete. Image delete: 1 W
when it leaves MCP servers without a user.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from agentvm.adapters.aws.dynamodb_items import Item, _conditional_failed, _k, _key, _n, _s
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.tenant_scope import check_scopable
from agentvm.errors import AgentVMError

if TYPE_CHECKING:
    from agentvm.adapters.aws.botocore_async import AsyncBotocoreClient
    from agentvm.ports import ContainerTier

log = logging.getLogger(__name__)

SK: Final = "CTASK"
STARTING: Final = "starting:"
#: The environment a task's worker receives through the RunTask container override.
ENV_TENANT_ID: Final = "AVM_WORKER_TENANT_ID"
ENV_CONTAINER_ID: Final = "AVM_WORKER_CONTAINER_ID"
ENV_HEARTBEAT_TTL_S: Final = "AVM_WORKER_HEARTBEAT_TTL_S"
DEFAULT_START_GRACE_S: Final = 120
DEFAULT_HEARTBEAT_TTL_S: Final = 60


class ContainerStartFailed(AgentVMError):
    """RunTask did not start the container's task. The session stays pending for the next start."""

    code = "container_start_failed"
    http_status = 503


class EcsClientSource(Protocol):
    """Where the ECS client comes from: a `clients.LazyClient` for "ecs" (created on first use)."""

    async def get(self) -> AsyncBotocoreClient: ...


def container_task_pk(tenant_id: str, container_id: str) -> str:
    return f"CTASK#{_k(tenant_id)}#{_k(container_id)}"


def _server_keys(servers: Iterable[tuple[str, str]]) -> list[str]:
    """(name, config fingerprint) pairs as `stop_mcp` strings (a server name holds no ':')."""
    return sorted({f"{name}:{fingerprint}" for name, fingerprint in servers})


@dataclass(frozen=True, slots=True)
class TaskWork:
    """What one read of the record gives the worker: sessions to serve, MCP servers to stop."""

    pending: set[str] = field(default_factory=set)
    stop_mcp: set[tuple[str, str]] = field(default_factory=set)  # (name, config fingerprint)

class EcsContainerTier:
    """`ContainerTier`: make sure the container's task runs, and queue the session for it."""

    def __init__(self, store: DynamoDBStore, ecs: EcsClientSource, *, cluster: str, task_definition: str,
                 subnets: list[str], security_groups: list[str], container_name: str,
                 assign_public_ip: bool = True, heartbeat_ttl_s: int = DEFAULT_HEARTBEAT_TTL_S,
                 start_grace_s: int = DEFAULT_START_GRACE_S) -> None:
        if not subnets:
            raise ValueError("EcsContainerTier needs at least one subnet (awsvpc networking)")
        if heartbeat_ttl_s <= 0 or start_grace_s <= 0:
            raise ValueError("heartbeat_ttl_s and start_grace_s must be positive")
        self.store = store
        self._ecs = ecs
        self.cluster = cluster
        self.task_definition = task_definition
        self.subnets = list(subnets)
        self.security_groups = list(security_groups)
        self.container_name = container_name
        self.assign_public_ip = assign_public_ip
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.start_grace_s = start_grace_s

    def _now_ms(self) -> int:
        clock: Callable[[], float] = self.store._clock
        return int(clock() * 1000)

    async def start(self, tenant_id: str, container_id: str, session_id: str) -> None:
        # a task runs with its tenant's scoped credentials only: refuse before queueing what none could run
        check_scopable(tenant_id)
        key = _key(container_task_pk(tenant_id, container_id), SK)
        extra = {"tenant_id": tenant_id, "container_id": container_id, "session_id": session_id}
        # (a) queue the session first: whoever runs (or will run) for the container sees it.
        resp = await self.store.client.update_item(
            TableName=self.store.table_name, Key=key,
            UpdateExpression="SET tenant_id = :t, container_id = :c ADD pending :s",
            ExpressionAttributeValues={":t": _s(tenant_id), ":c": _s(container_id), ":s": {"SS": [session_id]}},
            ReturnValues="ALL_NEW")
        now = self._now_ms()
        # (b) a live task or a start in flight: it reads `pending` before it may finish.
        if _live(resp.get("Attributes", {}), now):
            log.debug("container task live: session queued", extra=extra)
            return
        # (c) claim the start, so concurrent escalations do not each run a task.
        claim = f"{STARTING}{uuid.uuid4().hex}"
        try:
            await self.store.client.update_item(
                TableName=self.store.table_name, Key=key,
                UpdateExpression="SET task_owner = :o, task_until = :u",
                ConditionExpression="attribute_not_exists(task_until) OR task_until <= :now",
                ExpressionAttributeValues={":o": _s(claim), ":u": _n(now + self.start_grace_s * 1000),
                                           ":now": _n(now)})
        except ClientError as exc:
            if _conditional_failed(exc):
                log.debug("container task start claimed by another escalation", extra=extra)
                return
            raise
        arn = await self._run_task(key, claim, tenant_id, container_id, extra)
        try:  # informational: the worker's own registration decides ownership
            await self.store.client.update_item(
                TableName=self.store.table_name, Key=key,
                UpdateExpression="SET task_arn = :a, task_started_at = :now REMOVE last_start_error",
                ConditionExpression="attribute_exists(PK)",
                ExpressionAttributeValues={":a": _s(arn), ":now": _n(now)})
        except ClientError as exc:
            if not _conditional_failed(exc):  # gone already: the task ran and finished
                raise
        log.info("container task started", extra={**extra, "task_arn": arn})

    async def stop_mcp_servers(self, tenant_id: str, container_id: str, servers: Collection[tuple[str, str]]) -> bool:
        """Ask the container's live (or starting) task to stop these (name, config fingerprint) MCP servers
        of a deleted image. False: no task runs, so none of them runs either."""
        if not servers:
            return False
        try:
            await self.store.client.update_item(
                TableName=self.store.table_name, Key=_key(container_task_pk(tenant_id, container_id), SK),
                UpdateExpression="ADD stop_mcp :s", ConditionExpression="task_until > :now",
                ExpressionAttributeValues={":s": {"SS": _server_keys(servers)}, ":now": _n(self._now_ms())})
        except ClientError as exc:
            if _conditional_failed(exc):
                return False
            raise
        log.info("container task asked to stop MCP servers",
                 extra={"tenant_id": tenant_id, "container_id": container_id, "count": len(servers)})
        return True

    async def _run_task(self, key: Item, claim: str, tenant_id: str, container_id: str,
                        extra: Mapping[str, str]) -> str:
        environment = [{"name": ENV_TENANT_ID, "value": tenant_id},
                       {"name": ENV_CONTAINER_ID, "value": container_id},
                       {"name": ENV_HEARTBEAT_TTL_S, "value": str(self.heartbeat_ttl_s)}]
        network: dict[str, Any] = {"subnets": self.subnets,
                                   "assignPublicIp": "ENABLED" if self.assign_public_ip else "DISABLED"}
        if self.security_groups:
            network["securityGroups"] = self.security_groups
        try:
            ecs = await self._ecs.get()
            resp: Mapping[str, Any] = await ecs.run_task(
                cluster=self.cluster, taskDefinition=self.task_definition, launchType="FARGATE", count=1,
                networkConfiguration={"awsvpcConfiguration": network},
                overrides={"containerOverrides": [{"name": self.container_name, "environment": environment}]},
                startedBy="agentvm", propagateTags="TASK_DEFINITION",
                # the claim makes RunTask idempotent: botocore's own retries never start a second task
                clientToken=claim.removeprefix(STARTING))
        except (ClientError, BotoCoreError) as exc:
            reason = _error_code(exc)
            log.warning("RunTask failed", extra={**extra, "reason": reason, "error": str(exc)})
            await self._release_claim(key, claim, reason)
            raise ContainerStartFailed(f"Could not start the sandbox of container {container_id}: "
                                       f"ECS RunTask failed ({reason})") from exc
        tasks = resp.get("tasks") or []
        failures = resp.get("failures") or []
        if failures or not tasks:
            reason = ", ".join(sorted({str(f.get("reason") or "unknown") for f in failures})) or "no task started"
            log.warning("RunTask started no task", extra={**extra, "reason": reason, "failures": failures})
            await self._release_claim(key, claim, reason)
            raise ContainerStartFailed(f"Could not start the sandbox of container {container_id}: "
                                       f"ECS RunTask failed ({reason})")
        return str(tasks[0]["taskArn"])

    async def _release_claim(self, key: Item, claim: str, reason: str) -> None:
        """Drop our start claim so the next escalation retries; `pending` keeps the session."""
        try:
            await self.store.client.update_item(
                TableName=self.store.table_name, Key=key,
                UpdateExpression="SET last_start_error = :e REMOVE task_owner, task_until",
                ConditionExpression="task_owner = :o",
                ExpressionAttributeValues={":o": _s(claim), ":e": _s(reason[:500])})
        except ClientError as exc:
            if not _conditional_failed(exc):  # someone took it over meanwhile: theirs now
                raise


class ContainerTaskRecord:
    """The worker's side of the container-task record (see the module docstring).

    `task_id` identifies this worker (its ECS task ARN); it must not look like a start claim."""

    def __init__(self, store: DynamoDBStore, tenant_id: str, container_id: str, task_id: str) -> None:
        if not task_id or task_id.startswith(STARTING):
            raise ValueError(f"invalid worker task id: {task_id!r}")
        self.store = store
        self.tenant_id = tenant_id
        self.container_id = container_id
        self.task_id = task_id
        self._key = _key(container_task_pk(tenant_id, container_id), SK)

    def _now_ms(self) -> int:
        clock: Callable[[], float] = self.store._clock
        return int(clock() * 1000)

    async def _update(self, expression: str, condition: str, values: Item) -> bool:
        try:
            await self.store.client.update_item(
                TableName=self.store.table_name, Key=self._key, UpdateExpression=expression,
                ConditionExpression=condition, ExpressionAttributeValues=values)
        except ClientError as exc:
            if _conditional_failed(exc):
                return False
            raise
        return True

    async def register(self, ttl_s: int) -> bool:
        """Take the record over: allowed when it is a start claim, expired, absent or already ours.
        False: another live task owns the container (this worker should exit)."""
        now = self._now_ms()
        return await self._update(
            "SET task_owner = :me, task_until = :u, tenant_id = :t, container_id = :c",
            "attribute_not_exists(task_until) OR task_until <= :now OR task_owner = :me "
            "OR begins_with(task_owner, :starting)",
            {":me": _s(self.task_id), ":u": _n(now + ttl_s * 1000), ":now": _n(now), ":starting": _s(STARTING),
             ":t": _s(self.tenant_id), ":c": _s(self.container_id)})

    async def beat(self, ttl_s: int) -> bool:
        """Extend the heartbeat. False: another task took the container over (stop working)."""
        return await self._update("SET task_until = :u", "task_owner = :me",
                                  {":me": _s(self.task_id), ":u": _n(self._now_ms() + ttl_s * 1000)})

    async def poll(self) -> TaskWork:
        """The sessions waiting for this container and the MCP servers to stop (a strongly consistent read)."""
        resp = await self.store.client.get_item(TableName=self.store.table_name, Key=self._key,
                                                ProjectionExpression="pending, stop_mcp", ConsistentRead=True)
        item = resp.get("Item", {})
        pending, stop = item.get("pending"), item.get("stop_mcp")
        servers = {(name, fingerprint) for name, _, fingerprint in (k.partition(":") for k in stop["SS"])} \
            if stop else set()
        return TaskWork(set(pending["SS"]) if pending else set(), servers)

    async def pending(self) -> set[str]:
        """The sessions waiting for this container (a strongly consistent read)."""
        return (await self.poll()).pending

    async def stopped(self, servers: Collection[tuple[str, str]]) -> None:
        """Remove MCP servers the worker has stopped from `stop_mcp`."""
        if servers:
            await self._update("DELETE stop_mcp :d", "attribute_exists(PK)", {":d": {"SS": _server_keys(servers)}})

    async def done(self, session_ids: Collection[str]) -> None:
        """Remove handled sessions from `pending` (call it while still holding each session's lease)."""
        if not session_ids:
            return
        await self._update("DELETE pending :d", "attribute_exists(PK)", {":d": {"SS": sorted(set(session_ids))}})

    async def finish(self) -> bool:
        """Delete the record if nothing is pending and it is still ours: the worker may then exit.
        False: a session arrived meanwhile, or another task owns the container (`beat` tells which)."""
        try:
            await self.store.client.delete_item(
                TableName=self.store.table_name, Key=self._key,
                ConditionExpression="task_owner = :me AND attribute_not_exists(pending)",
                ExpressionAttributeValues={":me": _s(self.task_id)})
        except ClientError as exc:
            if _conditional_failed(exc):
                return False
            raise
        return True

    async def release(self) -> bool:
        """Give up ownership with work still pending (shutdown, SIGTERM): the next escalation starts a
        new task at once instead of waiting for the heartbeat to expire. False if not the owner."""
        return await self._update("REMOVE task_owner, task_until", "task_owner = :me", {":me": _s(self.task_id)})


def _live(attrs: Mapping[str, Any], now_ms: int) -> bool:
    until = attrs.get("task_until")
    return until is not None and int(until["N"]) > now_ms


def _error_code(exc: ClientError | BotoCoreError) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code") or "ClientError")
    return type(exc).__name__


if TYPE_CHECKING:
    def _implements_container_tier(tier: EcsContainerTier) -> ContainerTier:  # mypy checks the port's signature
        return tier
