"""The Resource-layer ports `Env`, `LLMProvider` and `Disk`: the local adapters, and the AWS ones
against the session's moto server (SSM, Secrets Manager, S3)."""

from __future__ import annotations

import asyncio
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import botocore.session
import pytest

from agentvm.adapters.aws.aws_env import AwsEnv, ParameterValues, SecretLLMProvider, SecretValues
from agentvm.adapters.aws.botocore_async import AsyncBotocoreClient
from agentvm.adapters.aws.s3_disk import S3Disk
from agentvm.adapters.aws.s3_workspace import workspace_prefix
from agentvm.adapters.local.local_disk import LocalDisk
from agentvm.adapters.local.local_env import LLM_KEY_NAMES, EnvLLMProvider, ProcessEnv
from agentvm.domain.models import DEFAULT_TENANT
from agentvm.errors import InvalidRequest, UpstreamError
from tests.adapters.conftest import bucket_keys
from tests.aws_fixtures import count_calls

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# ---- ProcessEnv and EnvLLMProvider -----------------------------------------------------------


async def test_process_env_get_and_get_all_with_prefix() -> None:
    env = ProcessEnv({"AVM_PORT": "8080", "AVM_HOST": "127.0.0.1", "HOME": "/root", "EMPTY": ""})
    assert await env.get("AVM_PORT") == "8080"
    assert await env.get("EMPTY") == ""
    assert await env.get("MISSING") is None
    assert await env.get_all("AVM_") == {"AVM_PORT": "8080", "AVM_HOST": "127.0.0.1"}
    assert await env.get_all() == {"AVM_PORT": "8080", "AVM_HOST": "127.0.0.1", "HOME": "/root", "EMPTY": ""}
    assert await env.get_all("NOPE_") == {}
    everything = await env.get_all()
    everything["AVM_PORT"] = "changed by a caller"
    assert await env.get("AVM_PORT") == "8080"  # callers get copies


async def test_process_env_is_a_snapshot_of_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AVM_TEST_SNAPSHOT", "before")
    env = ProcessEnv()
    monkeypatch.setenv("AVM_TEST_SNAPSHOT", "after")
    monkeypatch.setenv("AVM_TEST_SNAPSHOT_NEW", "x")
    assert await env.get("AVM_TEST_SNAPSHOT") == "before"
    assert await env.get("AVM_TEST_SNAPSHOT_NEW") is None
    assert await env.get_all("AVM_TEST_SNAPSHOT") == {"AVM_TEST_SNAPSHOT": "before"}


@pytest.mark.parametrize(("explicit", "environ", "expected"), [
    ("sk-explicit", {"LLM_API_KEY": "sk-env"}, "sk-explicit"),
    (None, {"LLM_API_KEY": "sk-1", "AVM_LLM_API_KEY": "sk-2", "ANTHROPIC_API_KEY": "sk-3"}, "sk-1"),
    (None, {"AVM_LLM_API_KEY": "sk-2", "ANTHROPIC_API_KEY": "sk-3"}, "sk-2"),
    (None, {"ANTHROPIC_API_KEY": "sk-3"}, "sk-3"),
    ("", {"LLM_API_KEY": "", "AVM_LLM_API_KEY": "", "ANTHROPIC_API_KEY": "sk-3"}, "sk-3"),  # empty: skipped
    (None, {"LLM_API_KEY": "", "OTHER_KEY": "sk-other"}, None),
    (None, {}, None),
])
async def test_env_llm_provider_order(explicit: str | None, environ: dict[str, str], expected: str | None) -> None:
    provider = EnvLLMProvider(ProcessEnv(environ), explicit=explicit)
    assert await provider.api_key() == expected
    assert provider.api_key_now() == expected
    assert provider.names == LLM_KEY_NAMES


async def test_env_llm_provider_custom_names() -> None:
    provider = EnvLLMProvider(ProcessEnv({"B": "sk-b", "A": "sk-a"}), names=("MISSING", "B", "A"))
    assert await provider.api_key() == "sk-b"


class _WaitingEnv:
    """An Env whose reads really wait (as a remote one does)."""

    async def get(self, name: str) -> str | None:
        await asyncio.sleep(0)
        return "sk-late"

    async def get_all(self, prefix: str = "") -> dict[str, str]:
        return {}


async def test_api_key_now_refuses_an_env_that_would_wait() -> None:
    provider = EnvLLMProvider(_WaitingEnv())
    assert await provider.api_key() == "sk-late"
    with pytest.raises(RuntimeError, match="synchronously"):
        provider.api_key_now()
    assert EnvLLMProvider(_WaitingEnv(), explicit="sk-now").api_key_now() == "sk-now"


# ---- AwsEnv and SecretLLMProvider (moto) -------------------------------------------------------


@pytest.fixture
async def secrets(session: botocore.session.Session, moto_endpoint: str) -> AsyncIterator[SecretValues]:
    values = SecretValues(session=session, endpoint_url=moto_endpoint)
    yield values
    await values.close()


@pytest.fixture
async def params(session: botocore.session.Session, moto_endpoint: str) -> AsyncIterator[ParameterValues]:
    values = ParameterValues(session=session, endpoint_url=moto_endpoint)
    yield values
    await values.close()


async def test_aws_env_reads_the_path_and_resolves_secrets_once(
        params: ParameterValues, secrets: SecretValues, ssm: AsyncBotocoreClient, sm: AsyncBotocoreClient,
        session: botocore.session.Session) -> None:
    root = "/" + unique("agentvm")
    llm_secret = unique("llm-key")
    arn = (await sm.create_secret(Name=llm_secret, SecretString='{"apiKey": "sk-from-secret"}'))["ARN"]
    other_secret = unique("db")
    await sm.create_secret(Name=other_secret, SecretString="db-password")
    await ssm.put_parameter(Name=f"{root}/llm/model", Value="claude", Type="String")
    await ssm.put_parameter(Name=f"{root}/llm/key", Value=f"secret:{arn}", Type="String")
    await ssm.put_parameter(Name=f"{root}/db/password", Value=f"secret:{other_secret}", Type="SecureString")
    await ssm.put_parameter(Name=f"{root}/tiers", Value="a,b", Type="StringList")
    await ssm.put_parameter(Name=f"{root}-sibling/x", Value="not mine", Type="String")
    ssm_calls = count_calls(session, "ssm", "GetParametersByPath")
    sm_calls = count_calls(session, "secrets-manager", "GetSecretValue")
    env = AwsEnv(params, root, secrets)

    assert await env.get("llm/model") == "claude"
    assert await env.get("llm/key") == "sk-from-secret"  # by ARN, JSON form unwrapped
    assert await env.get("db/password") == "db-password"  # by name
    assert await env.get("missing") is None
    assert await env.get_all("llm/") == {"llm/model": "claude", "llm/key": "sk-from-secret"}
    everything = await env.get_all()
    assert everything == {"llm/model": "claude", "llm/key": "sk-from-secret", "db/password": "db-password",
                          "tiers": "a,b"}
    everything["tiers"] = "changed by a caller"
    assert await env.get("tiers") == "a,b"
    for _ in range(3):
        assert await env.get("llm/key") == "sk-from-secret"
    assert len(ssm_calls) == 1  # the path: read once (4 parameters, one page)
    assert len(sm_calls) == 2  # each secret: read once


async def test_aws_env_without_a_secrets_reader_refuses_secret_values(params: ParameterValues,
                                                                      ssm: AsyncBotocoreClient) -> None:
    root = "/" + unique("cfg")
    await ssm.put_parameter(Name=f"{root}/plain", Value="v", Type="String")
    await ssm.put_parameter(Name=f"{root}/key", Value="secret:prod/llm", Type="String")
    env = AwsEnv(params, root)
    assert await env.get("plain") == "v"
    with pytest.raises(UpstreamError) as info:
        await env.get("key")
    assert "'key'" in info.value.message
    with pytest.raises(UpstreamError):
        await env.get_all()
    assert await env.get_all("plain") == {"plain": "v"}


async def test_aws_env_missing_secret_names_it_but_never_a_value(params: ParameterValues, secrets: SecretValues,
                                                                 ssm: AsyncBotocoreClient) -> None:
    root = "/" + unique("cfg")
    missing = unique("gone")
    await ssm.put_parameter(Name=f"{root}/key", Value=f"secret:{missing}", Type="String")
    with pytest.raises(UpstreamError) as info:
        await AwsEnv(params, root, secrets).get("key")
    assert info.value.message == f"Secrets Manager secret {missing!r} not found"


async def test_secret_llm_provider(secrets: SecretValues, sm: AsyncBotocoreClient,
                                   session: botocore.session.Session) -> None:
    name = unique("llm")
    await sm.create_secret(Name=name, SecretString="sk-secret")
    empty = unique("empty")
    await sm.create_secret(Name=empty, SecretString='{"apiKey": ""}')
    calls = count_calls(session, "secrets-manager", "GetSecretValue")

    assert await SecretLLMProvider(secrets, name, explicit="sk-explicit").api_key() == "sk-explicit"
    assert calls == []  # an explicit key: the secret is not read
    provider = SecretLLMProvider(secrets, name, explicit="")
    assert [await provider.api_key() for _ in range(3)] == ["sk-secret"] * 3
    assert len(calls) == 1  # cached by SecretValues
    assert await SecretLLMProvider(secrets, None).api_key() is None
    assert await SecretLLMProvider(secrets, "").api_key() is None
    assert await SecretLLMProvider(secrets, empty).api_key() is None  # an empty key is no key
    with pytest.raises(UpstreamError) as info:
        await SecretLLMProvider(secrets, unique("missing")).api_key()
    assert "not found" in info.value.message


# ---- LocalDisk -------------------------------------------------------------------------------


async def test_local_disk_mounts_the_workspace_dir(tmp_path: Path) -> None:
    disk = LocalDisk(tmp_path)
    path = await disk.mount(DEFAULT_TENANT, "c1")
    assert path == tmp_path / "containers" / "c1" / "workspace"
    assert path.is_dir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o700

    other = await disk.mount("acme/eu", "c1")  # another tenant: its own tree, the id quoted
    assert other == tmp_path / "tenants" / "acme%2Feu" / "containers" / "c1" / "workspace"
    assert other.is_dir() and other != path


async def test_local_disk_mount_is_idempotent_and_sync_keeps_files(tmp_path: Path) -> None:
    disk = LocalDisk(tmp_path)
    path = await disk.mount("t1", "c1")
    (path / "notes.txt").write_text("kept")
    path.chmod(0o750)
    assert await disk.mount("t1", "c1") == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o750  # an existing directory is left as it is
    await disk.sync("t1", "c1")
    await disk.unmount("t1", "c1")
    await disk.unmount("t1", "c1")
    await disk.sync("t2", "never-mounted")
    assert (path / "notes.txt").read_text() == "kept"
    assert await LocalDisk(tmp_path).mount("t1", "c1") == path


# ---- S3Disk (moto) ---------------------------------------------------------------------------


def count_s3_calls(client: S3Client, operation: str) -> list[str]:
    """Calls of one operation on this client (the fixture's client is the test's own)."""
    calls: list[str] = []

    def handler(**_: Any) -> None:
        calls.append(operation)

    client.meta.events.register(f"before-call.s3.{operation}", handler)
    return calls


async def test_s3_disk_round_trip(tmp_path: Path, bucket: str, s3: S3Client) -> None:
    sources: list[str] = []

    async def client() -> S3Client:
        sources.append("asked")
        return s3

    puts = count_s3_calls(s3, "PutObject")
    lists = count_s3_calls(s3, "ListObjectsV2")
    prefix = workspace_prefix("t1", "c1")
    first = S3Disk(bucket, tmp_path / "a", client)

    path = await first.mount("t1", "c1")
    assert path == tmp_path / "a" / "tenants" / "t1" / "containers" / "c1" / "workspace"
    assert path.is_dir() and list(path.iterdir()) == []
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert await first.mount("t1", "c1") == path  # mounted already: no second pull
    assert len(lists) == 1

    (path / "projects").mkdir()
    (path / "projects" / "a.txt").write_bytes(b"alpha")
    (path / "old.txt").write_bytes(b"old")
    await first.sync("t1", "c1")
    assert await bucket_keys(s3, bucket) == [prefix + "old.txt", prefix + "projects/a.txt"]
    assert len(puts) == 2
    await first.sync("t1", "c1")
    assert len(puts) == 2  # nothing changed: incremental

    second = S3Disk(bucket, tmp_path / "b", client)
    other = await second.mount("t1", "c1")
    assert other == tmp_path / "b" / "tenants" / "t1" / "containers" / "c1" / "workspace"
    assert (other / "projects" / "a.txt").read_bytes() == b"alpha"
    assert (other / "old.txt").read_bytes() == b"old"

    (other / "projects" / "a.txt").write_bytes(b"alpha 2")
    (other / "old.txt").unlink()
    (other / "b.txt").write_bytes(b"beta")
    await second.unmount("t1", "c1")  # pushes, deletes what it knows is gone, then forgets
    assert await bucket_keys(s3, bucket) == [prefix + "b.txt", prefix + "projects/a.txt"]
    pushed = len(puts)
    (other / "late.txt").write_bytes(b"after unmount")
    await second.sync("t1", "c1")  # not mounted: nothing to do
    await second.unmount("t1", "c1")
    assert len(puts) == pushed

    third = S3Disk(bucket, tmp_path / "c", client)
    again = await third.mount("t1", "c1")
    assert sorted(p.relative_to(again).as_posix() for p in again.rglob("*") if p.is_file()) == [
        "b.txt", "projects/a.txt"]
    assert (again / "projects" / "a.txt").read_bytes() == b"alpha 2"
    assert len(sources) == 3  # one client asked for per mount


async def test_s3_disk_keeps_containers_and_tenants_apart(tmp_path: Path, bucket: str, s3: S3Client) -> None:
    async def client() -> S3Client:
        return s3

    disk = S3Disk(bucket, tmp_path, client)
    mine = await disk.mount(DEFAULT_TENANT, "c1")
    theirs = await disk.mount("t2", "c1")
    assert mine == tmp_path / "containers" / "c1" / "workspace"
    assert theirs == tmp_path / "tenants" / "t2" / "containers" / "c1" / "workspace"
    (mine / "f").write_bytes(b"mine")
    (theirs / "f").write_bytes(b"theirs")
    await disk.sync(DEFAULT_TENANT, "c1")
    await disk.unmount("t2", "c1")
    assert await bucket_keys(s3, bucket) == [workspace_prefix(DEFAULT_TENANT, "c1") + "f",
                                             workspace_prefix("t2", "c1") + "f"]
    with pytest.raises(InvalidRequest):
        await disk.mount("t1", "..")
    assert not (tmp_path / "tenants" / "t1").exists()
