"""A month of usage records made on the fly (no storage, nothing held): the source of the streamed
export's memory test (tests/cloud/test_usage_export_stream.py), in its child process too.

    python -m tests.support.usage_month <moto endpoint> <bucket> <day> <records>

runs the real `export_day` and `S3BlobStore` (multipart uploads to the endpoint) for the day: with no
daily file in the bucket yet, every day of the month to it, then the monthly file joined from them; then
runs it again for the same day (now the schedule's case: only the day is read, the month joined again);
prints one JSON line: the daily files, the monthly one, the records read, the RSS after set-up and its
peak during the first export (sampled every 10 ms), both runs' seconds.
"""

from __future__ import annotations

import calendar
from collections.abc import AsyncIterator
from decimal import Decimal

from agentvm.domain.models import Usage
from agentvm.domain.usage import UsageRecord
from agentvm.money import cost_of

TENANTS = ("acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne")
MODELS = ("claude-haiku-4-5", "claude-sonnet-4-5")
NOV_1 = calendar.timegm((2026, 11, 1, 0, 0, 0)) * 1000
DEC_1 = calendar.timegm((2026, 12, 1, 0, 0, 0)) * 1000


def step_ms(count: int) -> int:
    return (DEC_1 - NOV_1) // count


def record(i: int, count: int) -> UsageRecord:
    """The i-th of `count` records of November 2026: ended at NOV_1 + i × step + 1 ms (distinct, in order),
    tokens and costs varying with i, two FOCUS rows each (input and output)."""
    tenant, model = TENANTS[i % len(TENANTS)], MODELS[i % 2]
    usage = Usage(100 + i % 997, 10 + i % 89)
    cost = cost_of(usage, model)
    ended = NOV_1 + i * step_ms(count) + 1
    return UsageRecord(f"turn_{i}#llm#1", tenant, None, f"cont_{i % 13}", "img_1", f"sess_{i % 101}", f"turn_{i}",
                       "llm", "anthropic", model, usage, cost.list, cost.billed, "function", "completed",
                       ended - 700, ended)


def totals(count: int, since_ms: int = NOV_1, until_ms: int = DEC_1) -> tuple[int, Decimal, Decimal]:
    """(records, list cost, billed cost) of the records that ended in [since_ms, until_ms)."""
    n, listed, billed = 0, Decimal(0), Decimal(0)
    for i in range(count):
        r = record(i, count)
        if since_ms <= r.ended_at < until_ms:
            n, listed, billed = n + 1, listed + r.list_cost, billed + r.billed_cost
    return n, listed, billed


class GeneratedLedger:
    """`stream_usage` of the month, made one record at a time (the ledger's other methods are unused);
    `read`: the records it made (a day's run makes only the day's)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.read = 0

    async def stream_usage(self, tenant_id: str | None, *, since_ms: int,
                           until_ms: int) -> AsyncIterator[UsageRecord]:
        step = step_ms(self.count)  # record i ended at NOV_1 + i × step + 1: the indexes of [since, until)
        first = max(0, -(-(since_ms - NOV_1 - 1) // step))
        last = min(self.count, max(0, -(-(until_ms - NOV_1 - 1) // step)))
        for i in range(first, last):
            r = record(i, self.count)
            self.read += 1
            if since_ms <= r.ended_at < until_ms and tenant_id in (None, r.tenant_id):
                yield r


def rss_bytes() -> int:
    """The process's resident set now (Linux: /proc/self/statm)."""
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(argv: list[str]) -> None:
    import asyncio
    import gc
    import json
    import threading
    import time
    from typing import Any, cast

    from agentvm.adapters.aws.s3_blobs import S3BlobStore
    from agentvm.services.focus_export import export_day

    endpoint, bucket, day, count = argv[0], argv[1], argv[2], int(argv[3])
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:  # the RSS every 10 ms while the export runs: its peak over the set-up's
        while not done.wait(0.01):
            samples.append(rss_bytes())

    async def run() -> dict[str, Any]:
        blobs = S3BlobStore(bucket, prefix="exports/focus", endpoint_url=endpoint, region_name="us-east-1")
        await blobs.open()
        await blobs.exists("warm-up")  # the client's first request: loads what every request needs
        gc.collect()
        base = rss_bytes()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.monotonic()
        ledger = GeneratedLedger(count)
        try:
            exported = await export_day(cast(Any, ledger), blobs, day)
        finally:
            seconds = time.monotonic() - t0
            done.set()
            sampler.join()
        # the next day's run as the schedule makes it: every earlier day has its file
        first_read, ledger.read, t1 = ledger.read, 0, time.monotonic()
        again = await export_day(cast(Any, ledger), blobs, day)
        rerun = {"seconds": time.monotonic() - t1, "read": ledger.read, "files": [f.key for f in again.daily],
                 "monthly": again.monthly.bytes}
        await blobs.close()
        m = exported.monthly
        return {"files": {f.key: [f.rows, str(f.billed_cost), f.bytes] for f in exported.daily},
                "monthly": [m.key, m.bytes, len(m.days)], "read": first_read,
                "rerun": rerun, "base": base,
                "peak": max([base, *samples]), "samples": len(samples), "seconds": seconds}

    print(json.dumps(asyncio.run(run())))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
