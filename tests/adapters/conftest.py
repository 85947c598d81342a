"""AWS adapter fixtures: see tests/aws_fixtures.py. S3 tests share a bucket fixture."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import botocore.session
import pytest
from botocore.config import Config

from agentvm.adapters.aws.botocore_async import new_client
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.ports import Store
from tests.aws_fixtures import aws_env, aws_session, moto_endpoint, session, sm, ssm

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

__all__ = ["aws_env", "aws_session", "bucket", "bucket_keys", "moto_endpoint", "s3", "session", "sm", "ssm", "store"]


@pytest.fixture
async def s3(aws_session: botocore.session.Session, moto_endpoint: str) -> AsyncIterator[S3Client]:
    client = new_client("s3", session=aws_session, endpoint_url=moto_endpoint,
                        config=Config(s3={"addressing_style": "path"}))
    yield cast("S3Client", client)
    await client.close()


@pytest.fixture
async def bucket(s3: S3Client) -> str:
    name = f"agentvm-{uuid.uuid4().hex[:16]}"
    await s3.create_bucket(Bucket=name)
    return name


async def bucket_keys(s3: S3Client, bucket: str) -> list[str]:
    """Every object key in the bucket, sorted (what an adapter really wrote)."""
    resp = await s3.list_objects_v2(Bucket=bucket)
    return sorted(o["Key"] for o in resp.get("Contents", []))


# ---- the Store contract: each test on every adapter (modules with a `store` of their own override it)


def _dynamodb(_: Path, request: pytest.FixtureRequest) -> Store:
    """A fresh table per test on the session's moto server (see conftest.py)."""
    request.getfixturevalue("aws_env")
    return DynamoDBStore(f"agentvm-{uuid.uuid4().hex[:16]}", session=request.getfixturevalue("aws_session"),
                         endpoint_url=request.getfixturevalue("moto_endpoint"))


FACTORIES: dict[str, Callable[[Path, pytest.FixtureRequest], Store]] = {
    "sqlite": lambda d, _request: SqliteStore(d / "agentvm.db"),
    "dynamodb": _dynamodb,
}


@pytest.fixture(params=sorted(FACTORIES))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s = FACTORIES[request.param](tmp_path, request)
    await s.open()
    if isinstance(s, DynamoDBStore):
        await s.create_table()
    yield s
    await s.close()
