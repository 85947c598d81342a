"""Cloud handler fixtures: see tests/aws_fixtures.py; `cloud` is a fresh table on moto and this
thread's runtime over it."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from agentvm.cloud import runtime as cloud_runtime
from tests.aws_fixtures import aws_env, aws_session, moto_endpoint

__all__ = ["aws_env", "aws_session", "cloud", "cloud_runtime_on", "moto_endpoint"]


@contextlib.contextmanager
def cloud_runtime_on(monkeypatch: pytest.MonkeyPatch, moto_endpoint: str,
                     **env: str) -> Iterator[cloud_runtime.CloudRuntime]:
    """The runtime of a fresh table on moto; `env`: more AVM_* variables, set before it is built."""
    monkeypatch.setenv("AVM_TABLE_NAME", f"agentvm-{uuid.uuid4().hex[:16]}")
    monkeypatch.setenv("AVM_AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AVM_WS_ENDPOINT", moto_endpoint)  # moto serves the management API too
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cloud_runtime.reset()
    rt = cloud_runtime.runtime()
    cloud_runtime.run(rt.ready())
    cloud_runtime.run(rt.store.create_table())
    try:
        yield rt
    finally:
        cloud_runtime.run(rt.store.close())
        cloud_runtime.reset()


@pytest.fixture
def cloud(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[cloud_runtime.CloudRuntime]:
    with cloud_runtime_on(monkeypatch, moto_endpoint) as rt:
        yield rt
