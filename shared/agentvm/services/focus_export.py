"""The scheduled usage export (functions/usage_export): every tenant's records of a day, and of its
month, as FOCUS 1.0 CSV files.

    <prefix>/daily/2026-11-21.csv     the day
    <prefix>/monthly/2026-11.csv      the month's daily files joined (to date while the month runs)

A run reads only its day from the ledger (`stream_usage`, page by page, in charge-time order) and
writes the day's file in parts (`BlobUploads`; S3 multipart), so memory holds a few ledger pages and
one part, and the run's time grows with the day, not with the month. Rows are in charge-time order
(ended_at, then tenant and record id as the ledger keeps them), not grouped by tenant as in the small
`focus_csv` exports. A failure aborts the upload: a file is replaced only by a complete one.

Missed days: the run for day D lists the month's daily files and, after D, writes every earlier day
of D's month that has none (oldest first; with a time budget, it starts another day only while twice
the longest day so far plus `ASSEMBLY_MARGIN_S` is left; the next run goes on).

The monthly file is rebuilt by every run from the daily files, never from the ledger: one header,
then each daily file without its header line, for the days from the 1st without a gap (S3: a
multipart upload whose parts are server-side copies of the daily files, `BlobUpload.copy`). So it is
always complete up to the last day it holds; days after a gap wait until the gap is exported.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Final

from agentvm.ports import BlobUpload, BlobUploads, UsageLedger
from agentvm.services.billing import Window, day_of, window
from agentvm.services.usage_export import FocusCsvWriter

#: Text gathered before it is handed to an upload (fewer awaits per record; far below one part).
_FLUSH_CHARS: Final = 256 * 1024
#: Seconds kept for the monthly file after the catch-up of missed days (server-side copies).
ASSEMBLY_MARGIN_S: Final = 120.0
_DAY_MS: Final = 86_400_000


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


@dataclass(frozen=True)
class MonthlyFile:
    key: str
    bytes: int
    days: list[str]  # the days it holds: from the 1st, without a gap


@dataclass(frozen=True)
class DayExport:
    daily: list[ExportedFile]  # written by this run: the day first, then missed days oldest first
    monthly: MonthlyFile
    missing: list[str]  # days of the month before the day still without a daily file


async def export_day(ledger: UsageLedger, uploads: BlobUploads, day: str, *, prefix: str = "",
                     time_left: Callable[[], float] | None = None) -> DayExport:
    """Write the day's FOCUS file, the missed earlier days of its month, and the month's file from
    the daily files, under `prefix` (keys relative to the uploads' store). `day` is `2026-11-21` (an
    `InvalidRequest` naming the field `day` otherwise); `time_left()`: seconds left to the run."""
    w = window(day, field="day")
    month = window(w.month)
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""

    def daily_key(label: str) -> str:
        return f"{base}daily/{label}.csv"

    writer = FocusCsvWriter(billing_period=w.month)
    present = await uploads.sizes(f"{base}daily/{w.month}-")
    days = [day_of(ms) for ms in range(month.since_ms, month.until_ms, _DAY_MS)]
    missed = [d for d in days if d < w.label and daily_key(d) not in present]
    written: list[ExportedFile] = []
    longest = 0.0
    for label in [w.label, *missed]:
        if label != w.label and time_left is not None and time_left() < 2 * longest + ASSEMBLY_MARGIN_S:
            break
        started = time.monotonic()
        f = await _export_window(ledger, uploads, writer, window(label), daily_key(label))
        longest = max(longest, time.monotonic() - started)
        present[f.key] = f.bytes
        written.append(f)
    held: list[str] = []
    for label in days:
        if daily_key(label) not in present:
            break
        held.append(label)
    monthly_key = f"{base}monthly/{w.month}.csv"
    size = await _join(uploads, monthly_key, writer.header().encode(),
                       [(daily_key(d), present[daily_key(d)]) for d in held])
    return DayExport(written, MonthlyFile(monthly_key, size, held),
                     [d for d in missed if daily_key(d) not in present])


async def _export_window(ledger: UsageLedger, uploads: BlobUploads, writer: FocusCsvWriter, w: Window,
                         key: str) -> ExportedFile:
    """Every tenant's records that ended in `w`, read once as a stream, written as one file."""
    f = _File(key, uploads.upload(key, "text/csv"))
    try:
        await f.add(writer.header())
        async for record in ledger.stream_usage(None, since_ms=w.since_ms, until_ms=w.until_ms):
            text, rows = writer.rows(record)
            f.rows += len(rows)
            f.billed += record.billed_cost
            await f.add(text)
        await f.flush()
        size = await f.upload.finish()
    except BaseException:
        with contextlib.suppress(Exception):  # the export's own error is the one to report
            await f.upload.abort()
        raise
    return ExportedFile(key, f.rows, f.billed, size)


async def _join(uploads: BlobUploads, key: str, header: bytes, files: list[tuple[str, int]]) -> int:
    """`header`, then each of `files` (key, size) without its first len(header) bytes (its header)."""
    upload = uploads.upload(key, "text/csv")
    try:
        await upload.write(header)
        for source, size in files:
            if size < len(header):
                raise RuntimeError(f"{source}: {size} bytes, shorter than the FOCUS header line")
            await upload.copy(source, len(header), size)
        return await upload.finish()
    except BaseException:
        with contextlib.suppress(Exception):
            await upload.abort()
        raise
