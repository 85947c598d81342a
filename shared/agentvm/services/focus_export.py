"""The scheduled usage export (functions/usage_export): every tenant's records of a day and of its month
as FOCUS 1.0 CSV files, streamed.

    <prefix>/daily/2026-11-21.csv     the day
    <prefix>/monthly/2026-11.csv      the day's month (to date while the month runs)

One pass over the month: the ledger's `stream_usage` yields the records page by page, in charge-time
order; each record's rows (`FocusCsvWriter`, the same columns and text as `focus_csv`) go to the
monthly upload, and to the daily one too when the record ended on that day. The uploads are written in
parts (`BlobUploads`; S3 multipart), so memory holds a few ledger pages and one part per file, never
the month. Rows are in charge-time order (ended_at, then tenant and record id as the ledger keeps
them), not grouped by tenant as in the small `focus_csv` exports. A failure aborts both uploads: a
file is replaced only by a complete one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Final

from agentvm.ports import BlobUpload, BlobUploads, UsageLedger
from agentvm.services.billing import window
from agentvm.services.usage_export import FocusCsvWriter

#: Text gathered before it is handed to an upload (fewer awaits per record; far below one part).
_FLUSH_CHARS: Final = 256 * 1024


@dataclass
class _File:
    key: str
    upload: BlobUpload
    rows: int = 0
    billed: Decimal = field(default_factory=lambda: Decimal(0))
    pending: list[str] = field(default_factory=list)
    pending_chars: int = 0

    async def add(self, text: str) -> None:
        self.pending.append(text)
        self.pending_chars += len(text)
        if self.pending_chars >= _FLUSH_CHARS:
            await self.flush()

    async def flush(self) -> None:
        if self.pending:
            data, self.pending, self.pending_chars = "".join(self.pending).encode(), [], 0
            await self.upload.write(data)


@dataclass(frozen=True)
class ExportedFile:
    key: str
    rows: int
    billed_cost: Decimal
    bytes: int


async def export_day(ledger: UsageLedger, uploads: BlobUploads, day: str, *, prefix: str = "") -> list[ExportedFile]:
    """Write the day's and its month's FOCUS files under `prefix` (keys relative to the uploads' store);
    `day` is `2026-11-21` (an `InvalidRequest` naming the field `day` otherwise)."""
    w = window(day, field="day")
    month = window(w.month)
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    daily_key, monthly_key = f"{base}daily/{w.label}.csv", f"{base}monthly/{w.month}.csv"
    files = [_File(daily_key, uploads.upload(daily_key, "text/csv")),
             _File(monthly_key, uploads.upload(monthly_key, "text/csv"))]
    daily, monthly = files
    writer = FocusCsvWriter(billing_period=w.month)
    try:
        header = writer.header()
        for f in files:
            await f.add(header)
        async for record in ledger.stream_usage(None, since_ms=month.since_ms, until_ms=month.until_ms):
            text, rows = writer.rows(record)
            targets = (daily, monthly) if w.since_ms <= record.ended_at < w.until_ms else (monthly,)
            for f in targets:
                f.rows += len(rows)
                f.billed += record.billed_cost
                await f.add(text)
        sizes = []
        for f in files:
            await f.flush()
            sizes.append(await f.upload.finish())
    except BaseException:
        for f in files:
            with contextlib.suppress(Exception):  # the export's own error is the one to report
                await f.upload.abort()
        raise
    return [ExportedFile(f.key, f.rows, f.billed, size) for f, size in zip(files, sizes, strict=True)]
