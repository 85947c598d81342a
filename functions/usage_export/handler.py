"""usage_export (EventBridge schedule, daily after midnight UTC): the usage ledger of every tenant as
FOCUS 1.0 CSV in the bucket, for finance tools:

    exports/focus/daily/2026-11-21.csv     the day before the run (final)
    exports/focus/monthly/2026-11.csv      that day's month to date (final after its last day)

An event may name the day (`{"day": "2026-11-05"}`) to write (or rewrite) another one. Writing is
idempotent: the same ledger gives the same files. Only the day is read from the ledger (a stream,
written as an S3 multipart upload); earlier days of the month without a daily file are written too,
and the monthly file is rebuilt from the daily files by server-side copies
(agentvm/services/focus_export.py): neither memory nor the run's time grows with the month."""

from __future__ import annotations

import gc

gc.disable()  # the init phase: no collection until init_phase.done(), the last line

import time
from typing import Any

from agentvm.cloud import init_phase
from agentvm.cloud.observability import Count, observe
from agentvm.cloud.runtime import run, runtime
from agentvm.errors import InvalidRequest

obs = observe("usage_export")
PREFIX = "exports/focus"


def _yesterday() -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() - 86_400))


async def _export(day: str, context: Any) -> dict[str, Any]:
    from agentvm.adapters.aws.s3_blobs import S3BlobStore
    from agentvm.services.focus_export import export_day

    rt = await runtime().ready()
    s = rt.settings
    if not s.bucket:
        raise InvalidRequest("AVM_BUCKET is not set: usage exports go to the deployment's bucket", field="bucket")
    blobs = S3BlobStore(s.bucket, prefix=PREFIX, endpoint_url=s.aws_endpoint_url, region_name=s.aws_region)
    await blobs.open()
    try:
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        done = await export_day(rt.billing.ledger, blobs, day,
                                time_left=(lambda: remaining() / 1000) if callable(remaining) else None)
    finally:
        await blobs.close()
    obs.metric("UsageExportRows", Count, sum(f.rows for f in done.daily))
    m = done.monthly
    return {"day": day.strip(), "files": {f"{PREFIX}/{f.key}": f.rows for f in done.daily},
            "monthly": {"key": f"{PREFIX}/{m.key}", "days": len(m.days), "through": m.days[-1] if m.days else None,
                        "bytes": m.bytes},
            "missing": done.missing}


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    day = event.get("day") if isinstance(event, dict) else None
    return run(_export(day if isinstance(day, str) else _yesterday(), context))


init_phase.done()  # the collector back on, what init built frozen (agentvm/cloud/init_phase.py)
