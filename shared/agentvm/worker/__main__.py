"""`python -m agentvm.worker`: the container task's entry point (infra/container/Dockerfile) and its
composition root, over the cloud one (`CloudRuntime`).

RunTask gives the task its container (AVM_WORKER_TENANT_ID, AVM_WORKER_CONTAINER_ID); everything
else comes from the task definition's environment, as for the functions. Exit code 0 after an idle
period, 2 when the environment is incomplete or the tenant role cannot be assumed (the task would
never get better by being retried).

Before anything else runs, the worker gives up the task role (adapters/aws/tenant_scope.py): it
reads the LLM key with it, removes the credential variables from its environment, and from then on
signs every request with the tenant role's credentials (its tenant's keys and workspaces only).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import sys
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from agentvm.cloud.runtime import CloudRuntime
from agentvm.config import Settings
from agentvm.logs import setup_logging
from agentvm.ports import Driver

if TYPE_CHECKING:
    from agentvm.hosting.session_worker import SessionWorker
    from agentvm.worker.container_worker import ContainerWorker

log = logging.getLogger("agentvm.worker")


def task_id() -> str:
    """This task's ARN from the ECS task metadata endpoint (v4); a random id elsewhere."""
    base = os.environ.get("ECS_CONTAINER_METADATA_URI_V4")
    if base:
        try:
            import json

            with urllib.request.urlopen(f"{base}/task", timeout=2) as resp:
                arn = json.load(resp).get("TaskARN")
            if isinstance(arn, str) and arn:
                return arn
        except (OSError, ValueError) as exc:
            log.warning("task metadata unavailable", extra={"error": str(exc)})
    return f"worker-{uuid.uuid4().hex}"


async def scoped_runtime(settings: Settings, tenant: str, container: str, me: str) -> CloudRuntime:
    """The runtime over the tenant role's credentials; the task role's are gone from the environment."""
    from botocore.exceptions import BotoCoreError, ClientError

    from agentvm.adapters.aws import tenant_scope as ts
    from agentvm.errors import AgentVMError

    if not settings.worker_tenant_role_arn:
        raise SystemExit("AVM_WORKER_TENANT_ROLE_ARN must be set: the worker runs tools only with credentials "
                         "scoped to its tenant (template.yaml: TenantWorkerRole)")
    if not settings.table_name or not settings.bucket:
        raise SystemExit("AVM_TABLE_NAME and AVM_BUCKET must be set (the task definition's environment)")
    try:
        ts.check_scopable(tenant)
        source = await asyncio.to_thread(ts.task_credentials)
        dropped = ts.drop_task_credentials()
        tenant_session = await asyncio.to_thread(functools.partial(
            ts.tenant_session, source=source, role_arn=settings.worker_tenant_role_arn, tenant_id=tenant,
            container_id=container, task_id=me, bucket=settings.bucket,
            region_name=settings.aws_region, endpoint_url=settings.aws_endpoint_url))
    except AgentVMError as exc:
        raise SystemExit(str(exc)) from exc
    except (ClientError, BotoCoreError) as exc:
        raise SystemExit(f"The worker could not assume its tenant role {settings.worker_tenant_role_arn}: "
                         f"{exc}") from exc
    log.info("tenant role assumed", extra={"tenant_id": tenant, "dropped": dropped})
    task_session = ts.credentials_session(source, settings.aws_region)  # the LLM key only, read at start
    return await CloudRuntime(settings, session=tenant_session, tenant_scope=tenant,
                              secrets_session=task_session).ready()


def container_worker(rt: CloudRuntime, tenant_id: str, container_id: str, task_id: str, *, driver: Driver,
                     workspaces: Path) -> ContainerWorker:
    """The container task's worker for one container, over the cloud runtime's clients."""
    from agentvm.adapters.aws.ecs_tasks import ContainerTaskRecord
    from agentvm.hosting.session_worker import SessionWorker
    from agentvm.worker.container_worker import ContainerWorker, WorkerOptions

    s = rt.settings
    disk = rt.workspace_disk(workspaces)

    def session_worker(before_release: Callable[[str], Awaitable[None]]) -> SessionWorker:
        inv = rt.invocation(tenant_id, role="worker", driver=driver, workspaces=workspaces)
        return SessionWorker(inv.deps, fanout=inv.fanout, leases=rt.leases, owner=task_id,
                             before_release=before_release)

    async def session_exists(session_id: str) -> bool:
        return await rt.store.get_session(tenant_id, session_id) is not None

    async def stop_mcp(servers: set[tuple[str, str]]) -> int:
        return await rt.stop_mcp_servers(tenant_id, container_id, servers)

    record = ContainerTaskRecord(rt.store, tenant_id, container_id, task_id)
    return ContainerWorker(tenant_id=tenant_id, container_id=container_id, record=record, disk=disk,
                           session_worker=session_worker, session_exists=session_exists,
                           options=WorkerOptions(idle_s=s.worker_idle_s, heartbeat_ttl_s=s.worker_heartbeat_ttl_s),
                           stop_mcp=stop_mcp)


async def serve(settings: Settings) -> int:
    tenant, container = settings.worker_tenant_id, settings.worker_container_id
    if not tenant or not container:
        raise SystemExit("AVM_WORKER_TENANT_ID and AVM_WORKER_CONTAINER_ID must be set (RunTask overrides)")
    me = task_id()  # before the metadata endpoint's variable is dropped
    rt = await scoped_runtime(settings, tenant, container, me)
    worker = container_worker(rt, tenant, container, me, driver=await rt.driver(), workspaces=settings.data_dir)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        return await worker.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await rt.close_sandbox()


def main() -> int:
    settings = Settings()
    setup_logging(settings.log_level)
    try:
        turns = asyncio.run(serve(settings))
    except SystemExit as exc:
        log.error(str(exc))
        return 2
    log.info("worker done", extra={"turns": turns})
    return 0


if __name__ == "__main__":
    sys.exit(main())
