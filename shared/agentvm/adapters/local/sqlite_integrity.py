"""Is the SQLite database sound? The check `avm serve` runs before it listens, and which SQLite
errors mean that the storage itself failed (rather than a statement).

The start-up check is `PRAGMA quick_check(1)`: every page of every b-tree is read once and its
structure verified (not whether each index entry matches its row, which `integrity_check` adds by
looking every entry up). It stops at the first problem: start-up only needs to know whether there is
one. It reads the file once (measured: 140 MB in 0.23 s from the page cache on a loaded 2-core
machine, so a few seconds per GB even from disk), so the whole file is checked, not a sample. Its
time is still bounded by `budget_s` (`AVM_DB_CHECK_S`, 30 s) through SQLite's progress handler: a
database too large to check in that time starts with a warning that says how to check it offline.
Damage found later, at run time, is answered 503 (`storage_unavailable`) and reported by `/health`
(`StorageHealth`).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

from agentvm.errors import StorageUnavailable

log = logging.getLogger(__name__)

# the primary result codes of a failed storage, not of a failed statement
DAMAGED = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
UNAVAILABLE = DAMAGED | {sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN,
                         sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_BUSY,
                         sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_PROTOCOL}
_PROGRESS_STEPS = 10_000  # SQLite VM instructions between two looks at the clock


def primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def is_storage_failure(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.Error) and primary_code(exc) in UNAVAILABLE


def is_damage(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.Error) and primary_code(exc) in DAMAGED


def advice(path: Path | str) -> str:
    return (f"stop AgentVM, move {path} aside together with its -wal and -shm files, and restore it from a "
            f"backup (or start with an empty data directory; `sqlite3 {path} .recover` may save what is "
            "still readable)")


def damaged(path: Path | str, detail: str) -> StorageUnavailable:
    """The one-line error of a damaged database file: which file, what is wrong, what to do."""
    detail = " ".join(detail.replace("*** in database main ***", "").split())[:200]
    return StorageUnavailable(f"the database {path} is damaged ({detail}): {advice(path)}")


def check_database(path: Path, *, budget_s: float) -> bool:
    """Raise `StorageUnavailable` when the database file at `path` is not a database or a page of it
    is damaged. True when the whole file was checked, False when `budget_s` ran out first (logged);
    a missing file (a new data directory) is fine. `budget_s` 0 skips the check."""
    if budget_s <= 0 or not path.exists():
        return True
    deadline = time.monotonic() + budget_s
    try:
        # read-write, so that a WAL left by a crash is recovered as the store will; never created here
        conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise StorageUnavailable(f"the database {path} cannot be opened ({exc})") from None
    try:
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_STEPS)
        try:
            rows = conn.execute("PRAGMA quick_check(1)").fetchall()
        except sqlite3.OperationalError as exc:
            if primary_code(exc) != sqlite3.SQLITE_INTERRUPT:
                raise
            log.warning(f"the integrity check of {path} did not finish in {budget_s:g} s (AVM_DB_CHECK_S): "
                        f"started without it; check offline with `sqlite3 {path} 'PRAGMA quick_check'`",
                        extra={"event": "db_check_unfinished", "budget_s": budget_s})
            return False
    except sqlite3.Error as exc:
        if is_damage(exc):
            raise damaged(path, str(exc)) from None
        raise StorageUnavailable(f"the database {path} cannot be read ({exc})") from None
    finally:
        conn.close()
    result = "; ".join(str(r[0]) for r in rows)
    if result != "ok":
        raise damaged(path, result)
    return True


class StorageHealth:
    """The storage failures a store has seen, for /health: damage until a restart (it does not heal;
    start-up checks the file again), any other failure (an I/O error, a full disk) until a later
    statement succeeds or for `transient_s` at most."""

    def __init__(self, path: Path | str, *, transient_s: float = 300.0) -> None:
        self.path = path
        self.transient_s = transient_s
        self._failure: tuple[str, float, bool] | None = None  # what SQLite said, when (monotonic), damage?

    def failed(self, exc: sqlite3.Error) -> StorageUnavailable:
        """Record a storage failure; the error to answer with (no path: tenants see it)."""
        damage = is_damage(exc) or (self._failure is not None and self._failure[2])
        if self._failure is None or self._failure[0] != str(exc):
            log.error("storage failure", extra={"event": "storage_failure", "error": str(exc), "damaged": damage,
                                                "database": str(self.path)})
        self._failure = (str(exc), time.monotonic(), damage)
        return StorageUnavailable(f"The database cannot be read or written ({exc}); the operator has to "
                                  "repair or restore it (see /health).")

    def succeeded(self) -> None:
        if self._failure is not None and not self._failure[2]:
            self._failure = None  # it works again (space was freed, the lock went away)

    def problems(self) -> list[str]:
        failure = self._failure
        if failure is None:
            return []
        what, at, damage = failure
        ago = int(time.monotonic() - at)
        if damage:
            # (no path: /health answers anyone; the error log line names the file)
            return [f"storage: the database is damaged ({what}, last seen {ago} s ago): stop AgentVM and restore "
                    "the database file from a backup (docs/reliability.md)"]
        if ago > self.transient_s:
            return []
        return [f"storage: the database failed {ago} s ago ({what})"]
