"""history_archive (the table's DynamoDB Stream, REMOVE records made by TTL): the messages and turns
TTL removed from the table, one gzip JSON Lines object per session per batch under `archive/` in
the bucket (agentvm.adapters.aws.history_stream; layout in agentvm.adapters.aws.s3_history_archive).
A failure raises: the event source mapping retries the batch, bisecting it, and a retried batch
writes the same keys."""

from __future__ import annotations

import gc

gc.disable()  # the init phase: no collection until init_phase.done(), the last line

from typing import Any

from agentvm.cloud import init_phase
from agentvm.cloud.observability import Count, observe
from agentvm.cloud.runtime import run, runtime
from agentvm.errors import InvalidRequest

obs = observe("history_archive")


async def _archive(records: list[dict[str, Any]]) -> dict[str, Any]:
    from agentvm.adapters.aws.history_stream import archive_records

    rt = await runtime().ready()
    if rt.history_archive is None:
        raise InvalidRequest("AVM_BUCKET is not set: the history archive goes to the deployment's bucket",
                             field="bucket")
    out = await archive_records(records, rt.store, rt.history_archive)
    obs.metric("HistoryArchivedItems", Count, out["items"])
    return out


@obs.handler
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    records = event.get("Records") if isinstance(event, dict) else None
    return run(_archive(records if isinstance(records, list) else []))


init_phase.done()  # the collector back on, what init built frozen (agentvm/cloud/init_phase.py)
