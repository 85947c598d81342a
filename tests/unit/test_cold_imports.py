"""Cold-start guard: the lightweight Anthropic driver never loads the `anthropic` SDK.

Each check runs in a fresh interpreter, since this test process has long imported the SDK.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.fake_anthropic import FakeAnthropic, Reply, Text

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED = REPO_ROOT / "shared"
FORBIDDEN = ("anthropic", "httpx2")

# Prints the loaded modules that belong to a forbidden top-level package, as a JSON list.
_REPORT = textwrap.dedent(f"""
    import json, sys
    print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {FORBIDDEN!r})))
""")


def _run(code: str, *args: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(SHARED)}
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(loaded, list)
    return [str(m) for m in loaded]


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


def test_the_harness_sees_the_sdk() -> None:
    # The check itself works: importing the SDK driver does load the SDK.
    loaded = _run("import agentvm.drivers.anthropic_sdk\n" + _REPORT)
    assert "anthropic" in loaded
    assert "httpx2" in loaded


def test_importing_the_lite_driver_does_not_load_the_sdk() -> None:
    assert _run("import agentvm.drivers.anthropic_lite\n" + _REPORT) == []


def test_streaming_with_the_lite_driver_does_not_load_the_sdk(fake: FakeAnthropic) -> None:
    fake.enqueue(Reply([Text(["cold ", "start"])]))
    code = textwrap.dedent("""
        import asyncio, sys
        from agentvm.drivers.anthropic_lite import AnthropicLiteDriver
        from agentvm.drivers.base import LLMRequest, TextDelta

        async def main() -> None:
            driver = AnthropicLiteDriver("sk-test", base_url=sys.argv[1], timeout_s=10, max_retries=0)
            request = LLMRequest(model="m", max_tokens=16, messages=[{"role": "user", "content": "Hi"}])
            try:
                texts = [e.text async for e in driver.stream(request) if isinstance(e, TextDelta)]
            finally:
                await driver.aclose()
            assert texts == ["cold ", "start"], texts

        asyncio.run(main())
    """) + _REPORT

    assert _run(code, fake.base_url) == []
    assert len(fake.requests) == 1


def test_the_aws_adapters_load_neither_aioboto3_nor_aiohttp() -> None:
    # aioboto3 + aiohttp cost ~1 s of cold start (docs/cloud-design.md): botocore on a thread pool.
    code = textwrap.dedent("""
        import json, sys
        import agentvm.adapters.aws.dynamodb_store, agentvm.adapters.aws.dynamodb_connections
        import agentvm.adapters.aws.s3_blobs, agentvm.adapters.aws.apigw_gateway
        import agentvm.adapters.aws.lambda_dispatcher, agentvm.adapters.aws.cloud_fanout
        heavy = ("aioboto3", "aiobotocore", "aiohttp", "anthropic", "fastapi")
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
    """)
    assert _run(code) == []


@pytest.mark.parametrize("module", ["agentvm.drivers.openai_compat", "agentvm.drivers.bedrock_converse"])
def test_the_other_upstream_drivers_load_no_vendor_sdk(module: str) -> None:
    """The OpenAI-compatible and Bedrock drivers speak their wire formats themselves (httpx, botocore):
    neither the `anthropic` nor the `openai` SDK is loaded."""
    report = _REPORT.replace(repr(FORBIDDEN), repr((*FORBIDDEN, "openai")))
    assert report != _REPORT
    assert _run(f"import {module}\n" + report) == []
