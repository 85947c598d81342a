"""A turn host in this process (its own thread and event loop, like a warm ECS task) and the SQS
queue it reads, on moto. The host is `agentvm.turnhost`'s, over a `CloudRuntime` built from the
environment on its thread (the handlers' variables must be set before `start`)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

from agentvm.adapters.aws.botocore_async import dummy_session
from agentvm.turnhost.host import TurnHost
from tests.support import aws_calls

REGION = "us-east-1"


def create_queue(moto_endpoint: str, name: str | None = None) -> str:
    """A fresh SQS queue on moto; returns its URL."""
    sqs: Any = dummy_session(REGION).create_client("sqs", endpoint_url=moto_endpoint, region_name=REGION)
    try:
        return str(sqs.create_queue(QueueName=name or f"turns-{uuid.uuid4().hex[:12]}")["QueueUrl"])
    finally:
        sqs.close()


def queue_depth(moto_endpoint: str, url: str) -> int:
    sqs: Any = dummy_session(REGION).create_client("sqs", endpoint_url=moto_endpoint, region_name=REGION)
    try:
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])
    finally:
        sqs.close()


class InProcessHost:
    """`start()` runs a TurnHost on a thread of its own until `stop()` (a drain, as on SIGTERM)."""

    def __init__(self, name: str | None = None, *, front: bool = False) -> None:
        """`front`: also its own WebSocket front and internal endpoint, on the ports of
        AVM_TURN_HOST_WS_PORT and AVM_TURN_HOST_PEER_PORT (`self.front`)."""
        self.name = name or f"host-test-{uuid.uuid4().hex[:8]}"
        self.with_front = front
        self.front: Any = None
        self.host: TurnHost | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self.drained: bool | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)

    def start(self, timeout: float = 10.0) -> InProcessHost:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not (self.host is not None and self.host.registered):
            if self.error is not None:
                raise self.error
            if time.monotonic() > deadline:
                raise TimeoutError("the turn host did not register")
            time.sleep(0.01)
        return self

    def idle(self) -> bool:
        return self.host is not None and not self.host.running

    def stop(self, timeout: float = 30.0) -> None:
        if self.loop is not None and self.host is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.host.stop)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("the turn host did not drain")
        if self.error is not None:
            raise self.error

    def _main(self) -> None:
        from agentvm.cloud import runtime as cloud_runtime
        from agentvm.turnhost.__main__ import build, new_front, start_front
        from tests.support.cloud_edge import _teardown_environment

        aws_calls.install()
        token = aws_calls.CURRENT.set("turn_host")  # its AWS calls are the task role's
        try:
            self.loop = cloud_runtime.loop()
            rt = cloud_runtime.runtime()
            self.loop.run_until_complete(rt.ready())
            if not self.with_front:
                self.host = build(rt, name=self.name)
                self.drained = self.loop.run_until_complete(self.host.serve())
                return
            front, endpoint = self.loop.run_until_complete(new_front(rt, self.name))
            host = build(rt, name=self.name, endpoint=endpoint)
            self.loop.run_until_complete(start_front(rt, front, host))
            self.front, self.host = front, host
            try:
                self.drained = self.loop.run_until_complete(host.serve())
            finally:
                self.loop.run_until_complete(front.stop())
                self.loop.run_until_complete(host.deregister())
        except BaseException as exc:
            self.error = exc
        finally:
            _teardown_environment()
            aws_calls.CURRENT.reset(token)
