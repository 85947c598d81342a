"""Lambda handlers fed API Gateway events, against DynamoDB on moto."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agentvm import __version__
from agentvm.cloud import runtime as cloud_runtime
from agentvm.domain.models import ConnectionRecord, Subscription

ROOT = Path(__file__).resolve().parents[2]
EVENTS = Path(__file__).parent / "events"


def load_handler(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"functions_{name}", ROOT / "functions" / name / "handler.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def event(name: str) -> dict[str, Any]:
    return dict(json.loads((EVENTS / f"{name}.json").read_text()))


@pytest.fixture
def cloud(aws_env: None, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[cloud_runtime.CloudRuntime]:
    monkeypatch.setenv("AVM_TABLE_NAME", f"agentvm-{uuid.uuid4().hex[:16]}")
    monkeypatch.setenv("AVM_AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AVM_WS_ENDPOINT", "https://abc123.execute-api.us-east-1.amazonaws.com/prod")
    cloud_runtime.runtime.cache_clear()
    rt = cloud_runtime.runtime()
    cloud_runtime.run(rt.ready())
    cloud_runtime.run(rt.store.create_table())
    yield rt
    cloud_runtime.run(rt.store.close())
    cloud_runtime.runtime.cache_clear()


def test_disconnect_removes_the_connection_and_everything_it_subscribed(cloud: cloud_runtime.CloudRuntime) -> None:
    conn = event("ws_disconnect")["requestContext"]["connectionId"]
    reg = cloud.registry
    cloud_runtime.run(reg.put_connection(ConnectionRecord(conn, "t1", "key_1", 1)))
    cloud_runtime.run(reg.put_subscription("t1", "sess_1", Subscription(conn)))
    cloud_runtime.run(reg.put_subscription("t1", "sess_1", Subscription("other")))
    cloud_runtime.run(reg.watch("t1", "user-1", conn))

    assert load_handler("ws_disconnect").handler(event("ws_disconnect"), None) == {"statusCode": 200}

    assert cloud_runtime.run(reg.get_connection(conn)) is None
    assert [s.connection_id for s in cloud_runtime.run(reg.subscribers("t1", "sess_1"))] == ["other"]
    assert cloud_runtime.run(reg.watchers("t1", "user-1")) == []
    # a second $disconnect (API Gateway may repeat it) is harmless
    assert load_handler("ws_disconnect").handler(event("ws_disconnect"), None) == {"statusCode": 200}


def test_http_api_serves_health() -> None:
    response = load_handler("http_api").handler(event("http_health"), None)
    assert response["statusCode"] == 200
    assert json.loads(response["body"]) == {"status": "ok", "version": __version__}


def test_the_runtime_refuses_to_start_without_its_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AVM_TABLE_NAME", raising=False)
    cloud_runtime.runtime.cache_clear()
    with pytest.raises(Exception, match="AVM_TABLE_NAME is not set"):
        cloud_runtime.runtime()
    cloud_runtime.runtime.cache_clear()


@pytest.mark.parametrize(("name", "allowed"), [("ws_disconnect", set()), ("http_api", {"fastapi"})])
def test_handlers_import_nothing_heavy(name: str, allowed: set[str]) -> None:
    code = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('h', {str(ROOT / 'functions' / name / 'handler.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "heavy = ('anthropic', 'aioboto3', 'aiobotocore', 'aiohttp', 'uvicorn', 'fastapi')\n"
        "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules if n.split('.')[0] in heavy})))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         env={"PATH": "/usr/bin:/bin", "AVM_TABLE_NAME": "t"})
    assert set(json.loads(out.stdout.strip().splitlines()[-1])) == allowed
