"""Secrets Manager and SSM values with their per-environment cache (moto server)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import botocore.session
import pytest

from agentvm.adapters.aws.aws_env import ParameterValues, SecretValues
from agentvm.adapters.aws.botocore_async import AsyncBotocoreClient
from agentvm.errors import UpstreamError
from tests.aws_fixtures import count_calls


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def secrets(session: botocore.session.Session, moto_endpoint: str, clock: Clock) -> AsyncIterator[
        SecretValues]:
    values = SecretValues(session=session, endpoint_url=moto_endpoint, ttl_s=300.0, clock=clock)
    yield values
    await values.close()


@pytest.fixture
async def params(session: botocore.session.Session, moto_endpoint: str, clock: Clock) -> AsyncIterator[
        ParameterValues]:
    values = ParameterValues(session=session, endpoint_url=moto_endpoint, ttl_s=300.0, clock=clock)
    yield values
    await values.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# ---- Secrets Manager -------------------------------------------------------------------------


async def test_secret_is_read_once_per_ttl(secrets: SecretValues, sm: AsyncBotocoreClient,
                                           session: botocore.session.Session, clock: Clock) -> None:
    name = unique("llm-key")
    await sm.create_secret(Name=name, SecretString="sk-first")
    calls = count_calls(session, "secrets-manager", "GetSecretValue")

    assert [await secrets.get(name) for _ in range(5)] == ["sk-first"] * 5
    assert len(calls) == 1

    await sm.put_secret_value(SecretId=name, SecretString="sk-rotated")
    clock.now += 299.0
    assert await secrets.get(name) == "sk-first"  # still within the TTL
    assert len(calls) == 1
    clock.now += 1.0
    assert await secrets.get(name) == "sk-rotated"
    assert await secrets.get(name) == "sk-rotated"
    assert len(calls) == 2


async def test_concurrent_callers_share_one_fetch(secrets: SecretValues, sm: AsyncBotocoreClient,
                                                  session: botocore.session.Session) -> None:
    a, b = unique("a"), unique("b")
    await sm.create_secret(Name=a, SecretString="value-a")
    await sm.create_secret(Name=b, SecretString="value-b")
    calls = count_calls(session, "secrets-manager", "GetSecretValue")
    results = await asyncio.gather(*(secrets.get(n) for n in [a, b] * 10))
    assert results == ["value-a", "value-b"] * 10
    assert len(calls) == 2  # one per secret


async def test_a_cancelled_caller_does_not_cancel_the_shared_fetch(secrets: SecretValues, sm: AsyncBotocoreClient,
                                                                   session: botocore.session.Session) -> None:
    name = unique("k")
    await sm.create_secret(Name=name, SecretString="v")
    calls = count_calls(session, "secrets-manager", "GetSecretValue")
    first = asyncio.ensure_future(secrets.get(name))
    second = asyncio.ensure_future(secrets.get(name))
    await asyncio.sleep(0)
    first.cancel()
    assert await second == "v"
    assert first.cancelled()
    assert len(calls) == 1


@pytest.mark.parametrize(("stored", "expected"), [
    ('{"apiKey": "sk-1"}', "sk-1"),
    ('{"api_key": "sk-2"}', "sk-2"),
    (' {"LLM_API_KEY": "sk-3"}', "sk-3"),
    ('{"ANTHROPIC_API_KEY": "sk-4"}', "sk-4"),
    ('{"apiKey": "sk-5", "other": "x"}', '{"apiKey": "sk-5", "other": "x"}'),  # more than one key
    ('{"password": "hunter2"}', '{"password": "hunter2"}'),  # not an accepted key
    ('{"apiKey": 42}', '{"apiKey": 42}'),  # not a string
    ('{"apiKey": ', '{"apiKey": '),  # not JSON
    ('["sk-6"]', '["sk-6"]'),
    ("sk-plain", "sk-plain"),
])
async def test_json_secrets_are_unwrapped(secrets: SecretValues, sm: AsyncBotocoreClient, stored: str,
                                          expected: str) -> None:
    name = unique("json")
    await sm.create_secret(Name=name, SecretString=stored)
    assert await secrets.get(name) == expected


async def test_missing_secret_names_the_id_and_is_not_cached(secrets: SecretValues, sm: AsyncBotocoreClient,
                                                             session: botocore.session.Session) -> None:
    name = unique("missing")
    calls = count_calls(session, "secrets-manager", "GetSecretValue")
    with pytest.raises(UpstreamError) as info:
        await secrets.get(name)
    assert info.value.message == f"Secrets Manager secret {name!r} not found"
    assert info.value.code == "upstream_error"
    assert not info.value.retryable
    await sm.create_secret(Name=name, SecretString="created-later")
    assert await secrets.get(name) == "created-later"
    assert len(calls) == 2


async def test_binary_secret_is_refused_without_its_value(secrets: SecretValues, sm: AsyncBotocoreClient) -> None:
    name = unique("binary")
    await sm.create_secret(Name=name, SecretBinary=b"top-secret-bytes")
    with pytest.raises(UpstreamError) as info:
        await secrets.get(name)
    assert name in info.value.message
    assert "top-secret" not in info.value.message


@pytest.mark.parametrize("make", [
    lambda: SecretValues(endpoint_url="http://127.0.0.1:9", region_name="us-east-1"),
    lambda: ParameterValues(endpoint_url="http://127.0.0.1:9", region_name="us-east-1"),
])
async def test_unreachable_service_is_a_retryable_upstream_error(aws_env: None,
                                                                 make: Callable[[], Any]) -> None:
    values = make()
    try:
        with pytest.raises(UpstreamError) as info:
            if isinstance(values, SecretValues):
                await values.get("prod/llm")
            else:
                await values.get_path("/prod/app")
        assert info.value.retryable
        assert ("'prod/llm'" if isinstance(values, SecretValues) else "'/prod/app'") in info.value.message
        assert "EndpointConnectionError" in info.value.message
    finally:
        await values.close()


# ---- SSM parameters --------------------------------------------------------------------------


async def test_parameters_by_path_paginate_and_are_relative(params: ParameterValues, ssm: AsyncBotocoreClient,
                                                            session: botocore.session.Session) -> None:
    root = "/" + unique("agentvm")
    expected: dict[str, str] = {}
    for i in range(23):
        await ssm.put_parameter(Name=f"{root}/flat/p{i:02d}", Value=f"v{i}", Type="String")
        expected[f"flat/p{i:02d}"] = f"v{i}"
    await ssm.put_parameter(Name=f"{root}/llm/deep/model", Value="claude", Type="String")
    await ssm.put_parameter(Name=f"{root}/llm/key", Value="sk-secure", Type="SecureString")
    await ssm.put_parameter(Name=f"{root}/tiers", Value="a,b,c", Type="StringList")
    await ssm.put_parameter(Name=f"{root}-sibling/x", Value="not mine", Type="String")
    expected |= {"llm/deep/model": "claude", "llm/key": "sk-secure", "tiers": "a,b,c"}
    calls = count_calls(session, "ssm", "GetParametersByPath")

    assert await params.get_path(root) == expected  # SecureString decrypted, sibling path left out
    assert len(calls) >= 3  # 26 parameters, at most 10 per page
    pages = len(calls)
    assert await params.get_path(root + "/") == expected  # same path, normalised: from the cache
    assert await params.get_path(root.lstrip("/")) == expected
    assert len(calls) == pages


async def test_parameters_are_refreshed_after_the_ttl(params: ParameterValues, ssm: AsyncBotocoreClient,
                                                      session: botocore.session.Session, clock: Clock) -> None:
    root = "/" + unique("cfg")
    await ssm.put_parameter(Name=f"{root}/model", Value="one", Type="String")
    calls = count_calls(session, "ssm", "GetParametersByPath")
    first = await params.get_path(root)
    first["model"] = "mutated by a caller"
    assert await params.get_path(root) == {"model": "one"}  # callers get copies

    await ssm.put_parameter(Name=f"{root}/model", Value="two", Type="String", Overwrite=True)
    clock.now += 299.9
    assert await params.get_path(root) == {"model": "one"}
    assert len(calls) == 1
    clock.now += 0.1
    assert await params.get_path(root) == {"model": "two"}
    assert len(calls) == 2


async def test_empty_path_reads_as_empty(params: ParameterValues) -> None:
    assert await params.get_path("/" + unique("nothing-here")) == {}
