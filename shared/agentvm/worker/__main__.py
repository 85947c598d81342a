"""`python -m agentvm.worker`: the container task's entry point (infra/container/Dockerfile).

RunTask gives the task its container (AVM_WORKER_TENANT_ID, AVM_WORKER_CONTAINER_ID); everything
else comes from the task definition's environment, as for the functions. Exit code 0 after an idle
period, 2 when the environment is incomplete (the task would never get better by being retried).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import urllib.request
import uuid

from agentvm.cloud.runtime import CloudRuntime
from agentvm.config import Settings
from agentvm.logs import setup_logging

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


async def serve(settings: Settings) -> int:
    tenant, container = settings.worker_tenant_id, settings.worker_container_id
    if not tenant or not container:
        raise SystemExit("AVM_WORKER_TENANT_ID and AVM_WORKER_CONTAINER_ID must be set (RunTask overrides)")
    rt = await CloudRuntime(settings).ready()
    worker = rt.container_worker(tenant, container, task_id(), driver=await rt.driver(),
                                 workspaces=settings.data_dir)
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
