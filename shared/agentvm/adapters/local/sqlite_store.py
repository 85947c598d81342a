"""The Store port on SQLite: one file, WAL, versioned migrations, every query scoped by tenant.

All statements run on one worker thread that owns the connection. Jobs queued while a transaction
runs are committed together (group commit); each job runs in its own savepoint so one failure does
not undo the others, and no caller is answered before its job is durable in the WAL.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
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
from agentvm.adapters.sqlite_fts import SNIPPET_ARGS, snippet_sql
from agentvm.domain.cursors import next_turn_cursor, turn_cursor
from agentvm.domain.message_text import (
    cursor_int,
    match_expression,
    render_snippet,
    search_cursor,
    search_cursor_state,
    searchable_text,
)
from agentvm.domain.models import (
    Agent,
    Checkpoint,
    Container,
    Image,
    LoggedEvent,
    ResourceVersion,
    SearchHit,
    Session,
    StoredMessage,
    Turn,
    TurnStatus,
    Usage,
)
from agentvm.errors import Conflict, InvalidRequest, NotFound, StorageUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
Job = Callable[[sqlite3.Connection], Any]
_STOP = object()
_BATCH_MAX = 512


class SqliteStore:
    def __init__(self, path: Path | str) -> None:
        self._path = str(path)
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.health = StorageHealth(self._path)  # storage failures seen, for /health

    # ---- lifecycle ---------------------------------------------------------------------------

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
            log.info("database migrated", extra={"schema_version": version + 1})

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

    async def probe(self) -> None:
        """A cheap read for health checks; `StorageUnavailable` while a storage failure stands."""
        await self.last_seq("health", "health")
        if problems := self.health.problems():
            raise StorageUnavailable(problems[0])

    async def problems(self) -> list[str]:
        """What /health says about the storage: a probe read, then the failures seen (`StorageHealth`)."""
        try:
            await asyncio.wait_for(self.last_seq("health", "health"), 5)
        except StorageUnavailable:
            pass  # recorded in self.health
        except TimeoutError:
            return ["storage: a read took more than 5 s", *self.health.problems()]
        return self.health.problems()

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(connection)` on the store's thread, like the store's own methods: in a savepoint
        of its own (atomic), answered once durable. For adapters that share this database file."""
        return await self._run(fn)

    # ---- containers --------------------------------------------------------------------------

    async def create_container(self, container: Container) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            cur = c.execute(
                "INSERT OR IGNORE INTO containers (tenant_id, container_id, created_at, updated_at) "
                "VALUES (?, ?, ?, ?)",
                (container.tenant_id, container.container_id, container.created_at, container.updated_at))
            return cur.rowcount == 1
        return await self._run(job)

    async def get_container(self, tenant_id: str, container_id: str) -> Container | None:
        def job(c: sqlite3.Connection) -> Container | None:
            row = c.execute("SELECT tenant_id, container_id, created_at, updated_at FROM containers "
                            "WHERE tenant_id=? AND container_id=?", (tenant_id, container_id)).fetchone()
            return Container(*row) if row else None
        return await self._run(job)

    async def list_containers(self, tenant_id: str) -> list[Container]:
        def job(c: sqlite3.Connection) -> list[Container]:
            rows = c.execute("SELECT tenant_id, container_id, created_at, updated_at FROM containers "
                             "WHERE tenant_id=? ORDER BY created_at, container_id", (tenant_id,)).fetchall()
            return [Container(*r) for r in rows]
        return await self._run(job)

    # ---- images and sessions -----------------------------------------------------------------

    async def create_image(self, image: Image, session: Session) -> None:
        def job(c: sqlite3.Connection) -> None:
            c.execute(
                "INSERT INTO images (tenant_id, image_id, container_id, session_id, name, description, "
                "system_prompt, config, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (image.tenant_id, image.image_id, image.container_id, image.session_id, image.name,
                 image.description, image.system_prompt, orjson.dumps(image.config).decode(),
                 image.created_at, image.updated_at))
            _insert_session(c, session)
        await self._run(job)

    async def get_image(self, tenant_id: str, image_id: str) -> Image | None:
        def job(c: sqlite3.Connection) -> Image | None:
            row = c.execute(f"SELECT {_IMAGE_COLS} FROM images WHERE tenant_id=? AND image_id=?",
                            (tenant_id, image_id)).fetchone()
            return _image(row) if row else None
        return await self._run(job)

    async def list_images(self, tenant_id: str, container_id: str | None = None) -> list[Image]:
        def job(c: sqlite3.Connection) -> list[Image]:
            if container_id is None:
                rows = c.execute(f"SELECT {_IMAGE_COLS} FROM images WHERE tenant_id=? "
                                 "ORDER BY created_at DESC, image_id DESC", (tenant_id,)).fetchall()
            else:
                rows = c.execute(f"SELECT {_IMAGE_COLS} FROM images WHERE tenant_id=? AND container_id=? "
                                 "ORDER BY created_at DESC, image_id DESC", (tenant_id, container_id)).fetchall()
            return [_image(r) for r in rows]
        return await self._run(job)

    async def update_image(self, tenant_id: str, image_id: str, *, name: str | None,
                           description: str | None, updated_at: int) -> Image | None:
        def job(c: sqlite3.Connection) -> Image | None:
            c.execute("UPDATE images SET name=COALESCE(?, name), description=COALESCE(?, description), "
                      "updated_at=? WHERE tenant_id=? AND image_id=?",
                      (name, description, updated_at, tenant_id, image_id))
            row = c.execute(f"SELECT {_IMAGE_COLS} FROM images WHERE tenant_id=? AND image_id=?",
                            (tenant_id, image_id)).fetchone()
            return _image(row) if row else None
        return await self._run(job)

    async def delete_image(self, tenant_id: str, image_id: str) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            row = c.execute("SELECT session_id FROM images WHERE tenant_id=? AND image_id=?",
                            (tenant_id, image_id)).fetchone()
            if row is None:
                return False
            sids = {row[0]} | {r[0] for r in c.execute(
                "SELECT session_id FROM sessions WHERE tenant_id=? AND image_id=?", (tenant_id, image_id))}
            for sid in sids:
                _delete_session_rows(c, tenant_id, sid)
            c.execute("DELETE FROM agents WHERE tenant_id=? AND image_id=?", (tenant_id, image_id))
            c.execute("DELETE FROM images WHERE tenant_id=? AND image_id=?", (tenant_id, image_id))
            return True
        return await self._run(job)

    async def get_session(self, tenant_id: str, session_id: str) -> Session | None:
        def job(c: sqlite3.Connection) -> Session | None:
            row = c.execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE tenant_id=? AND session_id=?",
                            (tenant_id, session_id)).fetchone()
            return Session(*row) if row else None
        return await self._run(job)

    async def create_session(self, session: Session) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            if c.execute("SELECT 1 FROM images WHERE tenant_id=? AND image_id=? AND container_id=?",
                         (session.tenant_id, session.image_id, session.container_id)).fetchone() is None:
                return False
            try:
                _insert_session(c, session)
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"Session already exists: {session.session_id}") from exc
            return True
        return await self._run(job)

    async def list_sessions(self, tenant_id: str, image_id: str) -> list[Session]:
        def job(c: sqlite3.Connection) -> list[Session]:
            rows = c.execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE tenant_id=? AND image_id=? "
                             "ORDER BY created_at, session_id", (tenant_id, image_id)).fetchall()
            return [Session(*r) for r in rows]
        return await self._run(job)

    async def delete_session(self, tenant_id: str, session_id: str) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            found = c.execute("SELECT 1 FROM sessions WHERE tenant_id=? AND session_id=?",
                              (tenant_id, session_id)).fetchone() is not None
            _delete_session_rows(c, tenant_id, session_id)
            return found
        return await self._run(job)

    # ---- agents ------------------------------------------------------------------------------

    async def put_agent(self, agent: Agent) -> Agent:
        def job(c: sqlite3.Connection) -> Agent:
            c.execute("INSERT OR IGNORE INTO agents (tenant_id, agent_id, image_id, container_id, name, "
                      "created_at) VALUES (?,?,?,?,?,?)",
                      (agent.tenant_id, agent.agent_id, agent.image_id, agent.container_id, agent.name,
                       agent.created_at))
            row = c.execute(f"SELECT {_AGENT_COLS} FROM agents WHERE tenant_id=? AND image_id=?",
                            (agent.tenant_id, agent.image_id)).fetchone()
            return Agent(*row)
        return await self._run(job)

    async def get_agent(self, tenant_id: str, agent_id: str) -> Agent | None:
        def job(c: sqlite3.Connection) -> Agent | None:
            row = c.execute(f"SELECT {_AGENT_COLS} FROM agents WHERE tenant_id=? AND agent_id=?",
                            (tenant_id, agent_id)).fetchone()
            return Agent(*row) if row else None
        return await self._run(job)

    async def get_agent_for_image(self, tenant_id: str, image_id: str) -> Agent | None:
        def job(c: sqlite3.Connection) -> Agent | None:
            row = c.execute(f"SELECT {_AGENT_COLS} FROM agents WHERE tenant_id=? AND image_id=?",
                            (tenant_id, image_id)).fetchone()
            return Agent(*row) if row else None
        return await self._run(job)

    async def list_agents(self, tenant_id: str, container_id: str | None = None) -> list[Agent]:
        def job(c: sqlite3.Connection) -> list[Agent]:
            if container_id is None:
                rows = c.execute(f"SELECT {_AGENT_COLS} FROM agents WHERE tenant_id=? "
                                 "ORDER BY created_at, agent_id", (tenant_id,)).fetchall()
            else:
                rows = c.execute(f"SELECT {_AGENT_COLS} FROM agents WHERE tenant_id=? AND container_id=? "
                                 "ORDER BY created_at, agent_id", (tenant_id, container_id)).fetchall()
            return [Agent(*r) for r in rows]
        return await self._run(job)

    async def delete_agent(self, tenant_id: str, agent_id: str) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            return c.execute("DELETE FROM agents WHERE tenant_id=? AND agent_id=?",
                             (tenant_id, agent_id)).rowcount == 1
        return await self._run(job)

    # ---- history, turns, event log -----------------------------------------------------------

    async def commit(self, checkpoint: Checkpoint) -> None:
        tenant, sid = checkpoint.tenant_id, checkpoint.session_id
        texts = [searchable_text(m.body) for m in checkpoint.messages]

        def job(c: sqlite3.Connection) -> None:
            for m, text in zip(checkpoint.messages, texts, strict=True):
                cur = c.execute(
                    "INSERT OR IGNORE INTO messages (tenant_id, session_id, message_id, turn_id, body, "
                    "created_at) VALUES (?,?,?,?,?,?)",
                    (tenant, sid, m.message_id, m.turn_id, orjson.dumps(m.body).decode(),
                     int(m.body.get("timestamp", 0))))
                if text and cur.rowcount == 1:  # indexed once, when inserted (a replay is ignored)
                    c.execute("INSERT INTO message_search (rowid, text, tenant_id) VALUES (?,?,?)",
                              (cur.lastrowid, text, tenant))
            if checkpoint.events:
                c.executemany(
                    "INSERT OR IGNORE INTO events (tenant_id, session_id, seq, type, payload, created_at) "
                    "VALUES (?,?,?,?,?,?)",
                    [(tenant, sid, e.seq, e.type, e.payload, e.created_at) for e in checkpoint.events])
            for t in checkpoint.turns:
                c.execute(
                    "INSERT OR REPLACE INTO turns (tenant_id, turn_id, session_id, image_id, container_id, "
                    "user_message_id, status, tier, model, input_tokens, output_tokens, cache_read_tokens, "
                    "cache_write_tokens, list_cost, billed_cost, error_code, error_message, created_at, "
                    "started_at, ended_at, agent, task, options, key_id, first_token_ms) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (t.tenant_id, t.turn_id, t.session_id, t.image_id, t.container_id, t.user_message_id,
                     str(t.status), t.tier, t.model, t.usage.input_tokens, t.usage.output_tokens,
                     t.usage.cache_read_tokens, t.usage.cache_write_tokens, t.list_cost, t.billed_cost,
                     t.error_code, t.error_message, t.created_at, t.started_at, t.ended_at, t.agent, t.task,
                     orjson.dumps(t.options).decode() if t.options else None, t.key_id, t.first_token_ms))
            if checkpoint.messages:
                latest = max(int(m.body.get("timestamp", 0)) for m in checkpoint.messages)
                c.execute("UPDATE sessions SET updated_at=MAX(updated_at, ?) WHERE tenant_id=? AND session_id=?",
                          (latest, tenant, sid))
        await self._run(job)

    async def list_messages(self, tenant_id: str, session_id: str) -> list[StoredMessage]:
        def job(c: sqlite3.Connection) -> list[StoredMessage]:
            rows = c.execute("SELECT message_id, turn_id, body FROM messages WHERE tenant_id=? AND "
                             "session_id=? ORDER BY pos", (tenant_id, session_id)).fetchall()
            return [StoredMessage(session_id, r[0], orjson.loads(r[2]), r[1]) for r in rows]
        return await self._run(job)

    async def search_messages(self, tenant_id: str, query: str, *, limit: int = 20,
                              cursor: str | None = None) -> tuple[list[SearchHit], str | None]:
        """FTS5 over every message of the tenant, BM25 order (newest first among equals); the cursor
        is the offset of the next page. The page's rows are ranked first and only they get a snippet."""
        state = search_cursor_state(cursor, query)
        offset = cursor_int(state, "o") if state is not None else 0
        match = match_expression(query)
        limit = max(limit, 1)
        if match is None:
            return [], None

        def job(c: sqlite3.Connection) -> tuple[list[SearchHit], bool]:
            # the join to sessions: a message committed after its session was deleted never shows
            ranked = c.execute(
                "SELECT message_search.rowid, bm25(message_search) FROM message_search "
                "JOIN messages m ON m.pos=message_search.rowid "
                "JOIN sessions s ON s.tenant_id=m.tenant_id AND s.session_id=m.session_id "
                "WHERE message_search MATCH ? AND message_search.tenant_id=? "
                "ORDER BY bm25(message_search), message_search.rowid DESC LIMIT ? OFFSET ?",
                (match, tenant_id, limit + 1, offset)).fetchall()
            if not ranked:
                return [], False
            page = {int(r[0]): -float(r[1]) for r in ranked[:limit]}
            marks = ",".join("?" * len(page))
            rows = c.execute(
                f"SELECT message_search.rowid, {snippet_sql('message_search')}, m.session_id, m.message_id, "
                "m.created_at, json_extract(m.body, '$.role'), json_extract(m.body, '$.subtype'), s.image_id "
                "FROM message_search JOIN messages m ON m.pos=message_search.rowid "
                "JOIN sessions s ON s.tenant_id=m.tenant_id AND s.session_id=m.session_id "
                f"WHERE message_search MATCH ? AND message_search.rowid IN ({marks})",
                (*SNIPPET_ARGS, match, *page)).fetchall()
            by_pos = {int(r[0]): SearchHit(r[2], r[3], str(r[5] or ""), str(r[6] or ""), int(r[4]),
                                           render_snippet(str(r[1])), page[int(r[0])], r[7]) for r in rows}
            return [by_pos[pos] for pos in page if pos in by_pos], len(ranked) > limit
        hits, more = await self._run(job)
        return hits, search_cursor({"o": offset + limit}, query) if more else None

    async def get_turn(self, tenant_id: str, turn_id: str) -> Turn | None:
        def job(c: sqlite3.Connection) -> Turn | None:
            row = c.execute(f"SELECT {_TURN_COLS} FROM turns WHERE tenant_id=? AND turn_id=?",
                            (tenant_id, turn_id)).fetchone()
            return _turn(row) if row else None
        return await self._run(job)

    async def list_turns(self, tenant_id: str, session_id: str) -> list[Turn]:
        def job(c: sqlite3.Connection) -> list[Turn]:
            rows = c.execute(f"SELECT {_TURN_COLS} FROM turns WHERE tenant_id=? AND session_id=? "
                             "ORDER BY created_at, turn_id", (tenant_id, session_id)).fetchall()
            return [_turn(r) for r in rows]
        return await self._run(job)

    async def list_tenant_turns(self, tenant_id: str, *, since_ms: int | None = None, until_ms: int | None = None,
                                limit: int = 50, cursor: str | None = None) -> tuple[list[Turn], str | None]:
        before = turn_cursor(cursor)

        def job(c: sqlite3.Connection) -> list[Turn]:
            sql = (f"SELECT {_TURN_COLS} FROM turns WHERE tenant_id=? AND status NOT IN ('queued', 'running') "
                   "AND created_at>=? AND created_at<?")
            args: list[Any] = [tenant_id, since_ms or 0, until_ms if until_ms is not None else 1 << 62]
            if before is not None:
                sql += " AND (created_at<? OR (created_at=? AND turn_id<?))"
                args += [before[0], before[0], before[1]]
            sql += " ORDER BY created_at DESC, turn_id DESC LIMIT ?"
            return [_turn(r) for r in c.execute(sql, [*args, limit + 1]).fetchall()]
        turns = await self._run(job)
        return turns[:limit], (next_turn_cursor(turns[limit - 1]) if len(turns) > limit else None)

    async def read_events(self, tenant_id: str, session_id: str, after_seq: int,
                          limit: int = 10_000) -> list[LoggedEvent]:
        def job(c: sqlite3.Connection) -> list[LoggedEvent]:
            rows = c.execute("SELECT seq, type, payload, created_at FROM events WHERE tenant_id=? AND "
                             "session_id=? AND seq>? ORDER BY seq LIMIT ?",
                             (tenant_id, session_id, after_seq, limit)).fetchall()
            return [LoggedEvent(*r) for r in rows]
        return await self._run(job)

    async def last_seq(self, tenant_id: str, session_id: str) -> int:
        def job(c: sqlite3.Connection) -> int:
            row = c.execute("SELECT MAX(seq) FROM events WHERE tenant_id=? AND session_id=?",
                            (tenant_id, session_id)).fetchone()
            return int(row[0] or 0)
        return await self._run(job)

    async def reserve_seqs(self, tenant_id: str, session_id: str, block: int) -> tuple[int, int]:
        def job(c: sqlite3.Connection) -> tuple[int, int]:
            row = c.execute("SELECT seq_reserved FROM sessions WHERE tenant_id=? AND session_id=?",
                            (tenant_id, session_id)).fetchone()
            logged = c.execute("SELECT MAX(seq) FROM events WHERE tenant_id=? AND session_id=?",
                               (tenant_id, session_id)).fetchone()[0] or 0
            ceiling = max(int(row[0]) if row else 0, int(logged))
            c.execute("UPDATE sessions SET seq_reserved=? WHERE tenant_id=? AND session_id=?",
                      (ceiling + block, tenant_id, session_id))
            return ceiling + 1, ceiling + block
        return await self._run(job)

    async def prune_events(self, older_than_ms: int) -> int:
        def job(c: sqlite3.Connection) -> int:
            # The newest event of each session is kept so that seq never restarts below it.
            return c.execute(
                "DELETE FROM events WHERE created_at < ? AND seq < (SELECT MAX(e2.seq) FROM events e2 "
                "WHERE e2.tenant_id=events.tenant_id AND e2.session_id=events.session_id)",
                (older_than_ms,)).rowcount
        return await self._run(job)

    async def list_unfinished_turns(self) -> list[Turn]:
        def job(c: sqlite3.Connection) -> list[Turn]:
            rows = c.execute(f"SELECT {_TURN_COLS} FROM turns WHERE status IN ('queued', 'running') "
                             "ORDER BY created_at").fetchall()
            return [_turn(r) for r in rows]
        return await self._run(job)

    # ---- resources ---------------------------------------------------------------------------

    async def create_resource(self, first: ResourceVersion) -> None:
        t, rid, kind, name = first.tenant_id, first.resource_id, first.kind, first.name

        def job(c: sqlite3.Connection) -> None:
            if c.execute("SELECT 1 FROM resources WHERE tenant_id=? AND (resource_id=? OR (kind=? AND name=?))",
                         (t, rid, kind, name)).fetchone():
                raise Conflict(f"Resource already exists: {kind}/{name}")
            if first.published:
                _check_publishable(c, t, kind, name)
            c.execute("INSERT INTO resources (tenant_id, resource_id, kind, name, published) VALUES (?,?,?,?,?)",
                      (t, rid, kind, name, first.published))
            _insert_version(c, first)
        await self._run(job)

    async def add_resource_version(self, version: ResourceVersion) -> None:
        t, rid = version.tenant_id, version.resource_id

        def job(c: sqlite3.Connection) -> None:
            row = c.execute("SELECT kind, name FROM resources WHERE tenant_id=? AND resource_id=?",
                            (t, rid)).fetchone()
            if row is None:
                raise NotFound(f"Resource not found: {version.kind}/{version.name}")
            kind, name = row
            if c.execute("SELECT 1 FROM resource_versions WHERE tenant_id=? AND resource_id=? AND version=?",
                         (t, rid, version.version)).fetchone():
                raise Conflict(f"Version {version.version} of {kind}/{name} already exists")
            if version.published:
                _check_publishable(c, t, kind, name)
            c.execute("UPDATE resources SET published=? WHERE tenant_id=? AND resource_id=?",
                      (version.published, t, rid))
            _insert_version(c, version)
        await self._run(job)

    async def resource_versions(self, tenant_id: str, resource_id: str) -> list[ResourceVersion]:
        def job(c: sqlite3.Connection) -> list[ResourceVersion]:
            # own first; a published one of another tenant otherwise
            row = c.execute("SELECT tenant_id FROM resources WHERE resource_id=? AND (tenant_id=? OR published=1) "
                            "ORDER BY tenant_id<>?, tenant_id LIMIT 1", (resource_id, tenant_id, tenant_id)).fetchone()
            return _versions_of(c, row[0], resource_id) if row else []
        return await self._run(job)

    async def find_resource(self, tenant_id: str, kind: str, name: str) -> list[ResourceVersion]:
        def job(c: sqlite3.Connection) -> list[ResourceVersion]:
            row = c.execute("SELECT tenant_id, resource_id FROM resources WHERE kind=? AND name=? AND "
                            "(tenant_id=? OR published=1) ORDER BY tenant_id<>? LIMIT 1",
                            (kind, name, tenant_id, tenant_id)).fetchone()
            return _versions_of(c, row[0], row[1]) if row else []
        return await self._run(job)

    async def list_resources(self, tenant_id: str, *, kind: str | None = None, name: str | None = None,
                             tag: str | None = None, query: str | None = None, limit: int = 50,
                             cursor: str | None = None) -> tuple[list[ResourceVersion], str | None]:
        after = _decode_cursor(cursor)
        limit = max(limit, 1)
        where: list[str] = ["(r.tenant_id=? OR r.published=1)"]
        args: list[str | int] = [tenant_id]
        if kind is not None:
            where.append("r.kind=?")
            args.append(kind)
        if name:
            where.append("substr(r.name, 1, ?)=?")  # an exact prefix (LIKE folds case and has wildcards)
            args += [len(name), name]
        if after is not None:
            where.append("(r.kind, r.name, r.tenant_id) > (?, ?, ?)")
            args += after
        sql = f"{_LATEST_VERSIONS} WHERE {' AND '.join(where)} ORDER BY r.kind, r.name, r.tenant_id"

        def job(c: sqlite3.Connection) -> list[ResourceVersion]:
            found: list[ResourceVersion] = []
            for row in c.execute(sql, args):  # rows are read lazily: stop one past the page
                v = _resource_version(row)
                if _matches(v, tag, query):
                    found.append(v)
                    if len(found) > limit:
                        break
            return found
        found = await self._run(job)
        page = found[:limit]
        return page, _encode_cursor(page[-1]) if len(found) > limit else None

    async def delete_resource(self, tenant_id: str, resource_id: str) -> bool:
        def job(c: sqlite3.Connection) -> bool:
            c.execute("DELETE FROM resource_versions WHERE tenant_id=? AND resource_id=?", (tenant_id, resource_id))
            return c.execute("DELETE FROM resources WHERE tenant_id=? AND resource_id=?",
                             (tenant_id, resource_id)).rowcount == 1
        return await self._run(job)

    async def integrity_check(self) -> str:
        def job(c: sqlite3.Connection) -> str:
            return str(c.execute("PRAGMA integrity_check").fetchone()[0])
        return await self._run(job)


_IMAGE_COLS = ("tenant_id, image_id, container_id, session_id, name, created_at, updated_at, description, "
               "system_prompt, config")
_AGENT_COLS = "tenant_id, agent_id, image_id, container_id, name, created_at"
_TURN_COLS = ("tenant_id, turn_id, session_id, image_id, container_id, user_message_id, status, created_at, "
              "tier, model, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, list_cost, "
              "billed_cost, error_code, error_message, started_at, ended_at, agent, task, options, key_id, "
              "first_token_ms")

_RESOURCE_COLS = ("r.tenant_id, r.resource_id, r.kind, r.name, v.version, v.version_key, v.content, v.content_hash, "
                  "v.dependencies, v.description, v.tags, r.published, v.created_at")
_RESOURCE_JOIN = ("FROM resources r JOIN resource_versions v ON v.tenant_id=r.tenant_id AND "
                  "v.resource_id=r.resource_id")
_LATEST_VERSIONS = (
    f"SELECT {_RESOURCE_COLS} {_RESOURCE_JOIN} AND v.version=(SELECT l.version FROM resource_versions l "
    "WHERE l.tenant_id=r.tenant_id AND l.resource_id=r.resource_id ORDER BY l.version_key DESC, l.version DESC "
    "LIMIT 1)")


def _image(row: tuple[Any, ...]) -> Image:
    return Image(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], orjson.loads(row[9]))


def _turn(r: tuple[Any, ...]) -> Turn:
    return Turn(
        tenant_id=r[0], turn_id=r[1], session_id=r[2], image_id=r[3], container_id=r[4],
        user_message_id=r[5], status=TurnStatus(r[6]), created_at=r[7], tier=r[8], model=r[9],
        usage=Usage(r[10], r[11], r[12], r[13]), list_cost=r[14], billed_cost=r[15], error_code=r[16],
        error_message=r[17], started_at=r[18], ended_at=r[19], agent=r[20], task=r[21],
        options=orjson.loads(r[22]) if r[22] else {}, key_id=r[23], first_token_ms=r[24])


def _insert_version(c: sqlite3.Connection, v: ResourceVersion) -> None:
    c.execute("INSERT INTO resource_versions (tenant_id, resource_id, version, version_key, content, content_hash, "
              "dependencies, description, tags, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
              (v.tenant_id, v.resource_id, v.version, v.version_key, orjson.dumps(v.content).decode(),
               v.content_hash, orjson.dumps(v.dependencies).decode(), v.description, orjson.dumps(v.tags).decode(),
               v.created_at))


def _check_publishable(c: sqlite3.Connection, tenant_id: str, kind: str, name: str) -> None:
    if c.execute("SELECT 1 FROM resources WHERE kind=? AND name=? AND published=1 AND tenant_id<>?",
                 (kind, name, tenant_id)).fetchone():
        raise Conflict(f"Another tenant already published {kind}/{name}")


def _versions_of(c: sqlite3.Connection, owner: str, resource_id: str) -> list[ResourceVersion]:
    rows = c.execute(f"SELECT {_RESOURCE_COLS} {_RESOURCE_JOIN} WHERE r.tenant_id=? AND r.resource_id=? "
                     "ORDER BY v.version_key DESC, v.version DESC", (owner, resource_id)).fetchall()
    return [_resource_version(r) for r in rows]


def _resource_version(r: tuple[Any, ...]) -> ResourceVersion:
    return ResourceVersion(
        tenant_id=r[0], resource_id=r[1], kind=r[2], name=r[3], version=r[4], version_key=r[5],
        content=orjson.loads(r[6]), content_hash=r[7], dependencies=tuple(orjson.loads(r[8])), description=r[9],
        tags=tuple(orjson.loads(r[10])), published=bool(r[11]), created_at=r[12])


def _matches(v: ResourceVersion, tag: str | None, query: str | None) -> bool:
    if tag is not None and tag not in v.tags:
        return False
    if not query:
        return True
    q = query.casefold()
    return any(q in text.casefold() for text in (v.name, v.description, *v.tags))


def _encode_cursor(last: ResourceVersion) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([last.kind, last.name, last.tenant_id])).decode()


def _decode_cursor(cursor: str | None) -> list[str] | None:
    if cursor is None:
        return None
    try:
        key = orjson.loads(base64.b64decode(cursor, altchars=b"-_", validate=True))
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest("Invalid cursor", field="cursor") from exc
    if not (isinstance(key, list) and len(key) == 3 and all(isinstance(k, str) for k in key)):
        raise InvalidRequest("Invalid cursor", field="cursor")
    return key


def _resolve_all(items: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for fut, ok, value in items:
        if fut.done():
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


_SESSION_COLS = "tenant_id, session_id, image_id, container_id, created_at, updated_at, title"


def _insert_session(c: sqlite3.Connection, session: Session) -> None:
    c.execute("INSERT INTO sessions (tenant_id, session_id, image_id, container_id, created_at, updated_at, "
              "title) VALUES (?,?,?,?,?,?,?)",
              (session.tenant_id, session.session_id, session.image_id, session.container_id,
               session.created_at, session.updated_at, session.title))


def _delete_session_rows(c: sqlite3.Connection, tenant_id: str, session_id: str) -> None:
    c.execute("DELETE FROM message_search WHERE rowid IN (SELECT pos FROM messages WHERE tenant_id=? AND "
              "session_id=?)", (tenant_id, session_id))
    for table in ("messages", "events", "turns", "sessions"):
        c.execute(f"DELETE FROM {table} WHERE tenant_id=? AND session_id=?", (tenant_id, session_id))


def _searchable_text_sql(body: str) -> str:
    """`avm_searchable_text(body)` in SQL: the searchable text of a stored message body."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    return searchable_text(parsed) if isinstance(parsed, dict) else ""


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
