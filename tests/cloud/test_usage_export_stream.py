"""The scheduled export at scale (issue 18, finding 6): a month of 200,000 usage records exported by
the real `export_day` and `S3BlobStore` (multipart uploads to the moto server) in a child process
whose peak memory is measured, and the files read back and checked. The run is for the month's last
day with no daily file yet: it writes the 30 daily files (each record read once) and joins them into
the monthly file (server-side copies of the daily files, ~10 MB each).

The records come from `tests/support/usage_month.py`, made one at a time, not from DynamoDB on moto:
moto answers every Query page by walking and sorting the whole table (200 pages × 200,000 items ran
past botocore's read timeout), and loading 200,000 items with BatchWriteItem took 573 s on this
2-core machine under load. The DynamoDB side of the stream is checked by the ledger contract test
(`stream_usage`: several pages of every shard, tests/adapters/test_usage_ledger.py) and holds at most
16 pages (8 shards × the page being merged and the one prefetched) by construction.

The bound: the child's RSS growth over the export (its resident set sampled every 10 ms during the
export, over the one after set-up) stays under EXPORT_RSS_BOUND = 64 MiB. The export holds one part being filled per
file (8 MiB) and its copy while it is sent (8 MiB), the text gathered before a write (256 KB per
file) and one record's rows: ~35 MB at worst, whatever the month's size. Held whole, as before this
change, the month is 200,000 records (~300 MB as UsageRecord objects) and ~200 MB of CSV text per
file. With DynamoDB, add the 16 pages of 1,000 items (~4 KB each parsed: up to ~64 MB).
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path

import boto3
import botocore.session
import pytest

from agentvm.adapters.aws.s3_blobs import S3BlobStore
from agentvm.cloud import runtime as cloud_runtime
from agentvm.services.usage_export import FOCUS_COLUMNS, focus_csv
from tests.support import usage_month

REPO = Path(__file__).resolve().parents[2]
RECORDS = 200_000
DAY = "2026-11-30"
DAY_START = usage_month.NOV_1 + 29 * 86_400_000
DAY_RECORDS = 6_666
EXPORT_RSS_BOUND = 64 * 1024 * 1024
PART = 8 * 1024 * 1024


@pytest.mark.exclusive  # 40 s of CPU, 1-3 minutes (tests/support/exclusive.py); runs once in make test
def test_a_month_of_200k_records_is_exported_in_bounded_memory(aws_env: None, moto_endpoint: str) -> None:
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    bucket = f"agentvm-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_") or k in ("PATH", "HOME")}
    env["PYTHONPATH"] = os.pathsep.join(str(REPO / p) for p in (".", "shared", "local", "client"))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tests.support.usage_month", moto_endpoint, bucket, DAY,
                           str(RECORDS)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    growth = got["peak"] - got["base"]
    print(f"\nexported {RECORDS:,} records in {got['seconds']:.1f} s ({time.monotonic() - t0:.1f} s with the "
          f"child's start); RSS {got['base'] / 2**20:.0f} MiB after set-up, peak {got['peak'] / 2**20:.0f} MiB "
          f"(+{growth / 2**20:.1f} MiB); {len(got['files'])} daily files, monthly {got['monthly']}; the next run "
          f"{got['rerun']}")

    day_n, day_list, day_billed = usage_month.totals(RECORDS, DAY_START, DAY_START + 86_400_000)
    _n, month_list, month_billed = usage_month.totals(RECORDS)
    assert day_n == DAY_RECORDS
    daily, monthly = f"daily/{DAY}.csv", "monthly/2026-11.csv"
    assert got["read"] == RECORDS  # each record read once: by its day's export, never again for the month
    assert len(got["files"]) == 30 and got["files"][daily][:2] == [2 * day_n, str(day_billed)]
    assert sum(f[0] for f in got["files"].values()) == 2 * RECORDS
    assert got["monthly"][0] == monthly and got["monthly"][2] == 30
    header_bytes = len(",".join(FOCUS_COLUMNS)) + 1  # the header line and its newline
    assert got["monthly"][1] == sum(f[2] for f in got["files"].values()) - 29 * header_bytes
    got["files"][monthly] = [2 * RECORDS, str(month_billed), got["monthly"][1]]
    # the schedule's run once every earlier day has its file: the day's records only, the month joined again
    assert got["rerun"]["read"] == DAY_RECORDS and got["rerun"]["files"] == [daily]
    assert got["rerun"]["monthly"] == got["monthly"][1]
    assert got["samples"] > 100  # the sampler ran through the export
    assert growth < EXPORT_RSS_BOUND, f"the export grew the process by {growth / 2**20:.1f} MiB"

    records = [usage_month.record(i, RECORDS) for i in range(RECORDS)]
    day_records = [r for r in records if DAY_START <= r.ended_at < DAY_START + 86_400_000]
    for key, expected, total_list, total_billed in ((daily, day_records, day_list, day_billed),
                                                     (monthly, records, month_list, month_billed)):
        head = s3.head_object(Bucket=bucket, Key=f"exports/focus/{key}")
        assert head["ContentType"] == "text/csv" and head["ContentLength"] == got["files"][key][2]
        if key == daily:
            parts = -(-head["ContentLength"] // PART)
            assert head["ETag"].strip('"').endswith(f"-{parts}") if parts > 1 else "-" not in head["ETag"]
        body = s3.get_object(Bucket=bucket, Key=f"exports/focus/{key}")["Body"]
        reader = csv.reader(io.TextIOWrapper(body, encoding="utf-8", newline=""))
        header = next(reader)
        assert header == list(FOCUS_COLUMNS)
        billed_at, list_at, n = header.index("BilledCost"), header.index("ListCost"), 0
        billed, listed = Decimal(0), Decimal(0)
        first: list[list[str]] = []
        last: list[list[str]] = []
        for row in reader:
            n += 1
            billed += Decimal(row[billed_at])
            listed += Decimal(row[list_at])
            if n <= 4:
                first.append(row)
            last = [*last[-3:], row]
        assert n == 2 * len(expected)
        assert (listed, billed) == (total_list, total_billed)
        # exact rows: charge-time order, each written as the small export writes it
        assert first == list(csv.reader(io.StringIO(focus_csv(expected[:2], billing_period="2026-11"))))[1:]
        assert last == list(csv.reader(io.StringIO(focus_csv(expected[-2:], billing_period="2026-11"))))[1:]


def test_an_upload_past_one_part_is_sent_in_parts_of_the_part_size(aws_env: None, moto_endpoint: str) -> None:
    session = botocore.session.get_session()
    sizes: list[int] = []
    session.register("before-parameter-build.s3.UploadPart", lambda params, **_: sizes.append(len(params["Body"])))
    bucket = f"agentvm-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    blobs = S3BlobStore(bucket, prefix="exports", session=session, endpoint_url=moto_endpoint, region_name="us-east-1")
    blobs.part_size = 5 * 2**20
    chunk = bytes(range(256)) * 4096  # 1 MiB

    async def write(key: str, mib: int) -> int:
        upload = blobs.upload(key, "text/csv")
        for _ in range(mib):
            await upload.write(chunk)
        return await upload.finish()

    assert cloud_runtime.run(write("big.csv", 12)) == 12 * 2**20
    assert sizes == [5 * 2**20, 5 * 2**20, 2 * 2**20]  # >= 5 MiB but the last
    assert cloud_runtime.run(blobs.get("big.csv")) == chunk * 12
    sizes.clear()
    assert cloud_runtime.run(write("small.csv", 1)) == 2**20
    assert sizes == []  # below one part: one PutObject
    assert cloud_runtime.run(blobs.get("small.csv")) == chunk

    async def fail() -> None:
        upload = blobs.upload("broken.csv")
        await upload.write(chunk * 6)  # one part sent
        await upload.abort()
        with pytest.raises(RuntimeError, match=r"upload of exports/broken\.csv is finished or aborted"):
            await upload.finish()
    cloud_runtime.run(fail())
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert cloud_runtime.run(blobs.exists("broken.csv")) is False
    cloud_runtime.run(blobs.close())
