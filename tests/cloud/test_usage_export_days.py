"""The scheduled export at 30 million turns a month (issue 18, finding 6 follow-up): a run reads only
its day from DynamoDB (and the earlier days of the month that have no file), and the monthly file is
the daily files joined, one header, by server-side copies (UploadPartCopy) where a range can be a
part of its own and ranged reads where it cannot (moto).

Days 1, 2 and 4 have daily files made here (generated text: 18 MiB, 3 lines, 12 MiB); the ledger
holds records of days 3, 5 and 6.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import boto3
import pytest

from agentvm.adapters.aws import s3_upload
from agentvm.adapters.aws.botocore_async import default_session
from agentvm.cloud import runtime as cloud_runtime
from agentvm.domain.models import Usage
from agentvm.services.usage_export import FocusCsvWriter, focus_csv
from tests.cloud.conftest import cloud_runtime_on
from tests.cloud.test_usage_export import record

MIB = 2**20
PREFIX = "exports/focus"
HEADER = FocusCsvWriter(billing_period="2026-11").header().encode()


@dataclass
class Seen:
    """DynamoDB Query pages and items, and S3 UploadPartCopy calls, of the clients made after `install`."""
    on: bool = False
    pages: int = 0
    items: int = 0
    copies: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def query(self, parsed: dict[str, Any], **_: Any) -> None:
        if self.on:
            with self.lock:
                self.pages += 1
                self.items += len(parsed.get("Items", []))

    def copy(self, params: dict[str, Any], **_: Any) -> None:
        if self.on:
            with self.lock:
                source = params["CopySource"]  # botocore may have made it "bucket/key" already
                key = source["Key"] if isinstance(source, dict) else str(source).split("/", 1)[1]
                self.copies.append((key, params["CopySourceRange"]))

    def reset(self) -> None:
        self.pages, self.items, self.copies = 0, 0, []


@pytest.fixture
def seen() -> Iterator[Seen]:
    s = Seen()
    session = default_session()  # before the runtime's clients are made: they copy the session's hooks
    session.register("after-call.dynamodb.Query", s.query, unique_id="test-export-days-query")
    session.register("before-parameter-build.s3.UploadPartCopy", s.copy, unique_id="test-export-days-copy")
    try:
        yield s
    finally:
        session.unregister("after-call.dynamodb.Query", unique_id="test-export-days-query")
        session.unregister("before-parameter-build.s3.UploadPartCopy", unique_id="test-export-days-copy")


@pytest.fixture
def cloud(seen: Seen, aws_env: None, moto_endpoint: str,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[cloud_runtime.CloudRuntime]:
    bucket = f"agentvm-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    with cloud_runtime_on(monkeypatch, moto_endpoint, AVM_BUCKET=bucket) as rt:
        yield rt


def generated(day: int, size: int) -> bytes:
    """A daily file's body of exactly `size` bytes (lines naming the day; not FOCUS rows: only bytes count)."""
    line = f"generated,2026-11-{day:02d},{'x' * 80}\n".encode()
    return (line * (size // len(line) + 1))[:size - 1] + b"\n"


class Remaining:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def get_remaining_time_in_millis(self) -> int:
        return self.ms


def test_a_run_reads_its_day_catches_up_missed_days_and_joins_the_month(
        cloud: cloud_runtime.CloudRuntime, seen: Seen, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.cloud_edge import load_handler

    monkeypatch.setattr(s3_upload, "COPY_PART", 6 * MIB)  # several copy parts without gigabytes
    records = {3: [record("acme", 1, 3, Usage(100, 10)), record("globex", 1, 3, Usage(150, 15, 40))],
               5: [record("acme", 2, 5, Usage(200, 20, 50)), record("globex", 2, 5, Usage(300, 30))],
               6: [record("acme", 3, 6, Usage(400, 40))]}
    for day_records in records.values():
        for r in day_records:
            assert cloud_runtime.run(cloud.meter.ledger.settle(r, reserved=Decimal(0), reserved_period="2026-11",
                                                               key_held=False))
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    bucket = cloud.settings.bucket
    bodies = {1: generated(1, 18 * MIB), 2: generated(2, 300), 4: generated(4, 12 * MIB)}
    for day, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=f"{PREFIX}/daily/2026-11-{day:02d}.csv", Body=HEADER + body)

    def daily(day: int) -> bytes:
        return bytes(s3.get_object(Bucket=bucket, Key=f"{PREFIX}/daily/2026-11-{day:02d}.csv")["Body"].read())

    def monthly() -> bytes:
        return bytes(s3.get_object(Bucket=bucket, Key=f"{PREFIX}/monthly/2026-11.csv")["Body"].read())

    handler = load_handler("usage_export")
    seen.on = True
    # 1. no time for the missed day 3: the day alone; the month stops at the gap (days 1-2)
    out = handler.handler({"day": "2026-11-05"}, Remaining(60_000))
    assert out == {"day": "2026-11-05", "files": {f"{PREFIX}/daily/2026-11-05.csv": 5},
                   "monthly": {"key": f"{PREFIX}/monthly/2026-11.csv", "days": 2, "through": "2026-11-02",
                               "bytes": len(HEADER) + 18 * MIB + 300},
                   "missing": ["2026-11-03"]}
    assert (seen.pages, seen.items) == (8, 2)  # one page of each of the 8 shards: day 5's 2 records
    assert monthly() == HEADER + bodies[1] + bodies[2]
    day5 = focus_csv(records[5][:1], billing_period="2026-11") + focus_csv(
        records[5][1:], billing_period="2026-11").split("\n", 1)[1]
    assert daily(5).decode() == day5

    # 2. the next run (no time budget: the schedule's full run) writes day 3 too and joins days 1-5
    seen.reset()
    out = handler.handler({"day": "2026-11-05"}, None)
    assert out["files"] == {f"{PREFIX}/daily/2026-11-05.csv": 5, f"{PREFIX}/daily/2026-11-03.csv": 5}
    assert (out["monthly"]["days"], out["monthly"]["through"], out["missing"]) == (5, "2026-11-05", [])
    assert (seen.pages, seen.items) == (16, 4)  # days 5 and 3 only
    files = {d: daily(d) for d in (1, 2, 3, 4, 5)}
    assert all(f.startswith(HEADER) for f in files.values())
    month = monthly()
    assert month == HEADER + b"".join(files[d][len(HEADER):] for d in (1, 2, 3, 4, 5))
    assert out["monthly"]["bytes"] == len(month)
    # server-side copies: day 1 after the first part (header + its first bytes read), in 6 MiB parts
    # and no short part; day 4 after the bytes that fill the part the small days 2 and 3 started
    small = len(files[2]) + len(files[3]) - 2 * len(HEADER)
    size1, size4 = len(files[1]), len(files[4])
    assert sorted(seen.copies) == sorted([
        (f"{PREFIX}/daily/2026-11-01.csv", f"bytes={5 * MIB}-{11 * MIB - 1}"),
        (f"{PREFIX}/daily/2026-11-01.csv", f"bytes={11 * MIB}-{size1 - 1}"),
        (f"{PREFIX}/daily/2026-11-04.csv", f"bytes={len(HEADER) + 5 * MIB - small}-{size4 - 1}")])
    head = s3.head_object(Bucket=bucket, Key=f"{PREFIX}/monthly/2026-11.csv")
    assert head["ContentType"] == "text/csv" and head["ETag"].strip('"').endswith("-6")  # 2 written + 3 copied + last

    # 3. the day after: only day 6's records are read; the month grows by day 6
    seen.reset()
    out = handler.handler({"day": "2026-11-06"}, None)
    assert (out["files"], out["missing"]) == ({f"{PREFIX}/daily/2026-11-06.csv": 2}, [])
    assert (seen.pages, seen.items) == (8, 1)
    assert monthly() == month + daily(6)[len(HEADER):]
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_a_small_month_is_one_put_and_a_daily_file_shorter_than_the_header_fails_closed(
        cloud: cloud_runtime.CloudRuntime, seen: Seen, moto_endpoint: str) -> None:
    from tests.support.cloud_edge import load_handler

    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    bucket = cloud.settings.bucket
    handler = load_handler("usage_export")
    seen.on = True
    out = handler.handler({"day": "2026-11-02"}, None)  # no records: header-only days 2 and 1
    assert out["files"] == {f"{PREFIX}/daily/2026-11-02.csv": 0, f"{PREFIX}/daily/2026-11-01.csv": 0}
    assert s3.get_object(Bucket=bucket, Key=f"{PREFIX}/monthly/2026-11.csv")["Body"].read() == HEADER
    assert seen.copies == []
    s3.put_object(Bucket=bucket, Key=f"{PREFIX}/daily/2026-11-01.csv", Body=b"BillingAccountId\n")
    with pytest.raises(RuntimeError, match=r"daily/2026-11-01\.csv: 17 bytes, shorter than the FOCUS header line"):
        handler.handler({"day": "2026-11-02"}, None)
    assert s3.get_object(Bucket=bucket, Key=f"{PREFIX}/monthly/2026-11.csv")["Body"].read() == HEADER  # kept
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_a_failed_server_side_copy_fails_the_upload_and_leaves_nothing(aws_env: None, moto_endpoint: str) -> None:
    from botocore.exceptions import ClientError

    from agentvm.adapters.aws.s3_blobs import S3BlobStore
    from agentvm.errors import InvalidRequest

    bucket = f"agentvm-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="exports/a.csv", Body=b"x" * (6 * MIB))
    blobs = S3BlobStore(bucket, prefix="exports", endpoint_url=moto_endpoint, region_name="us-east-1")

    async def scenario() -> None:
        assert await blobs.sizes("") == {"a.csv": 6 * MIB}
        upload = blobs.upload("joined.csv", "text/csv")
        with pytest.raises(InvalidRequest, match=r"copy of a\.csv: bad byte range 5-4"):
            await upload.copy("a.csv", 5, 4)
        await upload.copy("a.csv", 0, 6 * MIB)  # one server-side part
        await upload.copy("gone.csv", 0, 6 * MIB)  # a source that is not there: its copy part fails
        with pytest.raises(ClientError, match=r"\(404\) when calling the UploadPartCopy operation"):
            await upload.finish()

    try:
        cloud_runtime.run(scenario())
    finally:
        cloud_runtime.run(blobs.close())
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="exports/joined")
