"""The SQLite database of the Store: one file, WAL, versioned migrations, one worker thread.

All statements run on one worker thread that owns the connection. Jobs queued while a transaction
runs are committed together (group commit); each job runs in its own savepoint so one failure does
not undo the others, and no caller is answered before its job is durable in the WAL. Every
repository (`sqlite_images`, `sqlite_session_log`, …) is a `SqliteDatabase` and runs its
statements through `_run`: one connection, one thread, one group commit for all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import orjson

from agentvm.adapters.local.sqlite_integrity import StorageHealth, damaged, is_damage, is_storage_failure
from agentvm.adapters.local.sqlite_schema import MIGRATIONS
from agentvm.domain.message_text import searchable_text
from agentvm.errors import StorageUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
Job = Callable[[sqlite3.Connection], Any]
_STOP = object()
_BATCH_MAX = 512


class SqliteDatabase:
    """The connection's worker thread and its group commit: the base of every repository on the
    database, which the `SqliteStore` façade combines."""

    def __init__(self, path: Path | str) -> None:
        self._path = str(path)
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.health = StorageHealth(self._path)  # storage failures seen, for /health

    async def open(self) -> None:
        if self._thread is not None:
            return
        if self._path != ":memory:":
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        ready: Future[None] = Future()
        self._thread = threading.Thread(target=self._worker, args=(ready,), name="sqlite-store", daemon=True)
        self._thread.start()
        try:
            await asyncio.wrap_future(ready)
        except sqlite3.Error as exc:
            self._thread = None
            if is_damage(exc):
                raise damaged(self._path, str(exc)) from None
            if is_storage_failure(exc):
                raise StorageUnavailable(f"the database {self._path} cannot be opened ({exc})") from None
            raise

    async def close(self) -> None:
        if self._thread is None:
            return
        self._jobs.put(_STOP)
        await asyncio.to_thread(self._thread.join, 10)
        self._thread = None

    def _connect(self) -> sqlite3.Connection:
        if self._path != ":memory:":
            # Owner only: tools run as other uids and must not read anyone's conversations. SQLite
            # gives the -wal and -shm files the database file's mode.
            os.close(os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600))
            os.chmod(self._path, 0o600)
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a process crash (kill -9); only power loss may drop the
        # last commits.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute("PRAGMA cache_size=-8000")
        # the searchable text of a stored body, for migration 6 (which indexes existing messages)
        conn.create_function("avm_searchable_text", 1, _searchable_text_sql, deterministic=True)
        self._migrate(conn)
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        if current > len(MIGRATIONS):
            raise RuntimeError(
                f"database schema version {current} is newer than this AgentVM supports "
                f"({len(MIGRATIONS)}); upgrade AgentVM")
        for version in range(current, len(MIGRATIONS)):
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _split_sql(MIGRATIONS[version]):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={version + 1}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            log.debug("database migration applied", extra={"schema_version": version + 1})
        if current < len(MIGRATIONS):
            log.info("database migrated", extra={"from_schema": current, "schema_version": len(MIGRATIONS)})

    def _worker(self, ready: Future[None]) -> None:
        try:
            conn = self._connect()
        except BaseException as exc:  # report start-up failures to open()
            ready.set_exception(exc)
            return
        ready.set_result(None)
        try:
            while True:
                first = self._jobs.get()
                if first is _STOP:
                    break
                batch = [first]
                stop = False
                while len(batch) < _BATCH_MAX:
                    try:
                        nxt = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is _STOP:
                        stop = True
                        break
                    batch.append(nxt)
                self._run_batch(conn, batch)
                if stop:
                    break
        finally:
            conn.close()

    @staticmethod
    def _run_batch(conn: sqlite3.Connection, batch: list[tuple[Job, asyncio.AbstractEventLoop,
                                                               asyncio.Future[Any]]]) -> None:
        results: list[tuple[asyncio.Future[Any], bool, Any]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for fn, _loop, fut in batch:
                conn.execute("SAVEPOINT job")
                try:
                    value = fn(conn)
                    conn.execute("RELEASE job")
                    results.append((fut, True, value))
                except Exception as exc:
                    conn.execute("ROLLBACK TO job")
                    conn.execute("RELEASE job")
                    results.append((fut, False, exc))
            conn.execute("COMMIT")
        except Exception as exc:
            log.exception("sqlite transaction failed")
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            results = [(fut, False, exc) for _fn, _loop, fut in batch]
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
        for (_fn, loop, _fut), res in zip(batch, results, strict=True):
            by_loop.setdefault(loop, []).append(res)
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed; nobody is waiting any more
                loop.call_soon_threadsafe(_resolve_all, items)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._thread is None:
            raise RuntimeError("store is not open")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, loop, fut))
        try:
            value = await fut
        except sqlite3.Error as exc:
            if not is_storage_failure(exc):
                raise
            raise self.health.failed(exc) from exc
        self.health.succeeded()
        return value

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(connection)` on the store's thread, like the store's own methods: in a savepoint
        of its own (atomic), answered once durable. For adapters that share this database file."""
        return await self._run(fn)

    async def integrity_check(self) -> str:
        def job(c: sqlite3.Connection) -> str:
            return str(c.execute("PRAGMA integrity_check").fetchone()[0])
        return await self._run(job)


def _resolve_all(items: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for fut, ok, value in items:
        if fut.done():
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def _searchable_text_sql(body: str) -> str:
    """`avm_searchable_text(body)` in SQL: the searchable text of a stored message body."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    return searchable_text(parsed) if isinstance(parsed, dict) else ""


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
