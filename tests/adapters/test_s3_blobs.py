"""S3BlobStore against the session's moto server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import botocore.session
import httpx
import pytest

from agentvm.adapters.aws.s3_blobs import S3BlobStore
from agentvm.errors import InvalidRequest
from agentvm.ports import BlobStore
from tests.adapters.conftest import bucket_keys

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

pytestmark = pytest.mark.usefixtures("aws_env")


@pytest.fixture
async def blobs(bucket: str, aws_session: botocore.session.Session, moto_endpoint: str) -> AsyncIterator[S3BlobStore]:
    store = S3BlobStore(bucket, prefix="/tenants/t1/", session=aws_session, endpoint_url=moto_endpoint)
    await store.open()
    yield store
    await store.close()


async def test_put_get_exists_delete_round_trip_under_the_prefix(blobs: S3BlobStore, s3: S3Client,
                                                                 bucket: str) -> None:
    port: BlobStore = blobs
    data = bytes(range(256)) * 10
    assert await port.put("exports/a.bin", data) == "exports/a.bin"
    assert await port.put("notes/b.txt", b"hello", "text/plain") == "notes/b.txt"
    assert await bucket_keys(s3, bucket) == ["tenants/t1/exports/a.bin", "tenants/t1/notes/b.txt"]
    assert await port.get("exports/a.bin") == data
    assert await port.exists("notes/b.txt") is True
    assert await port.exists("notes/missing.txt") is False
    assert await port.get("notes/missing.txt") is None
    await port.put("notes/b.txt", b"replaced", "text/plain")
    assert await port.get("notes/b.txt") == b"replaced"
    assert await port.delete("notes/b.txt") is True
    assert await port.delete("notes/b.txt") is False
    assert await port.get("notes/b.txt") is None
    assert await bucket_keys(s3, bucket) == ["tenants/t1/exports/a.bin"]


async def test_content_type_is_stored(blobs: S3BlobStore, s3: S3Client, bucket: str) -> None:
    await blobs.put("x.json", b"{}", "application/json")
    await blobs.put("y.bin", b"\x00")
    assert (await s3.head_object(Bucket=bucket, Key="tenants/t1/x.json"))["ContentType"] == "application/json"
    assert (await s3.head_object(Bucket=bucket, Key="tenants/t1/y.bin"))["ContentType"] == "application/octet-stream"


async def test_presigned_url_reads_the_blob_without_credentials(blobs: S3BlobStore) -> None:
    await blobs.put("shared/report.csv", b"a,b\n1,2\n", "text/csv")
    url = await blobs.url("shared/report.csv", expires_s=60)
    assert "X-Amz-Expires=60" in url and "tenants/t1/shared/report.csv" in url
    async with httpx.AsyncClient() as http:
        resp = await http.get(url)
    assert resp.status_code == 200 and resp.content == b"a,b\n1,2\n"
    with pytest.raises(InvalidRequest):
        await blobs.url("shared/report.csv", expires_s=0)


@pytest.mark.parametrize("key", ["", "/etc/passwd", "../t2/secret", "a/../../t2/x", "a/./b", "a//b", "a/",
                                 "..", "a\\..\\b", "nul\x00byte"])
async def test_keys_cannot_leave_the_prefix(blobs: S3BlobStore, key: str) -> None:
    for call in (blobs.put(key, b"x"), blobs.get(key), blobs.exists(key), blobs.delete(key), blobs.url(key)):
        with pytest.raises(InvalidRequest):
            await call


async def test_without_a_prefix_keys_are_used_as_given_and_the_client_opens_lazily(
        s3: S3Client, bucket: str, aws_session: botocore.session.Session, moto_endpoint: str) -> None:
    store = S3BlobStore(bucket, session=aws_session, endpoint_url=moto_endpoint)
    try:
        assert await store.put("top.txt", b"1") == "top.txt"
        assert await bucket_keys(s3, bucket) == ["top.txt"]
    finally:
        await store.close()
    await store.close()  # idempotent


def test_an_invalid_prefix_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        S3BlobStore("b", prefix="a/../b")
