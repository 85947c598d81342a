"""The ConfigStore port: SQLite locally, SSM parameters + a DynamoDB audit trail in the cloud (moto)."""

from __future__ import annotations

import logging
import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import botocore.session
import pytest

from agentvm.adapters.aws.botocore_async import AsyncBotocoreClient
from agentvm.adapters.aws.dynamodb_store import DynamoDBStore
from agentvm.adapters.aws.ssm_config import SsmConfigStore
from agentvm.adapters.local.sqlite_config import SqliteConfigStore
from agentvm.adapters.local.sqlite_schema import MIGRATIONS
from agentvm.adapters.local.sqlite_store import SqliteStore
from agentvm.domain.models import ConfigChange, Container
from agentvm.errors import InvalidRequest
from agentvm.ports import ConfigStore
from tests.aws_fixtures import count_calls


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SqliteBackend:
    """One database file; `new()` closes the previous store and reopens the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._store: SqliteStore | None = None

    async def new(self) -> SqliteConfigStore:
        await self.close()
        self._store = SqliteStore(self.path)
        await self._store.open()
        return SqliteConfigStore(self._store)

    async def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            await store.close()


class SsmBackend:
    """One SSM path and one table on moto; `new()` is a fresh adapter (and table client) over them."""

    def __init__(self, session: botocore.session.Session, endpoint: str, clock: Clock) -> None:
        self.session = session
        self.endpoint = endpoint
        self.clock = clock
        self.stack = uuid.uuid4().hex[:12]
        self.path = f"/agentvm/{self.stack}/"
        self.table = f"agentvm-{uuid.uuid4().hex[:16]}"
        self._open: list[tuple[SsmConfigStore, DynamoDBStore]] = []

    async def create_table(self) -> None:
        store = DynamoDBStore(self.table, session=self.session, endpoint_url=self.endpoint)
        await store.open()
        await store.create_table()
        await store.close()

    async def new(self, *, table: str | None = None) -> SsmConfigStore:
        store = DynamoDBStore(table or self.table, session=self.session, endpoint_url=self.endpoint)
        await store.open()
        config = SsmConfigStore(self.path, store, endpoint_url=self.endpoint, session=self.session,
                                clock=self.clock)
        self._open.append((config, store))
        return config

    async def close(self) -> None:
        for config, store in self._open:
            await config.close()
            await store.close()
        self._open.clear()


Backend = SqliteBackend | SsmBackend


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def ssm_backend(session: botocore.session.Session, moto_endpoint: str, clock: Clock) -> AsyncIterator[
        SsmBackend]:
    backend = SsmBackend(session, moto_endpoint, clock)
    await backend.create_table()
    yield backend
    await backend.close()


@pytest.fixture
async def sqlite_backend(tmp_path: Path) -> AsyncIterator[SqliteBackend]:
    backend = SqliteBackend(tmp_path / "agentvm.db")
    yield backend
    await backend.close()


@pytest.fixture(params=["sqlite", "ssm"])
def backend(request: pytest.FixtureRequest) -> Backend:
    fixture: Backend = request.getfixturevalue(f"{request.param}_backend")
    return fixture


@pytest.fixture
async def config(backend: Backend) -> ConfigStore:
    return await backend.new()


def change(key: str, old: str | None, new: str | None, at: int, actor: str = "key_admin") -> ConfigChange:
    return ConfigChange(key=key, old=old, new=new, actor=actor, at=at)


async def put(config: ConfigStore, key: str, value: str | None, at: int, *, old: str | None = None,
              secret: bool = False) -> ConfigChange:
    shown = None if value is None else ('"***"' if secret else value)
    record = change(key, old, shown, at)
    await config.set_value(key, value, secret=secret, change=record)
    return record


# ---- both adapters -----------------------------------------------------------------------------


async def test_values_are_set_replaced_and_removed(config: ConfigStore) -> None:
    assert await config.runtime_values() == {}
    await put(config, "llm.model", '"claude-a"', 1)
    await put(config, "limits.max_turns", "12", 2)
    assert await config.runtime_values() == {"llm.model": '"claude-a"', "limits.max_turns": "12"}
    await put(config, "llm.model", '"claude-b"', 3, old='"claude-a"')
    await put(config, "limits.max_turns", None, 4, old="12")
    assert await config.runtime_values() == {"llm.model": '"claude-b"'}
    await put(config, "never.set", None, 5)  # removing an unset value is fine
    assert await config.runtime_values() == {"llm.model": '"claude-b"'}


async def test_returned_values_are_a_copy(config: ConfigStore) -> None:
    await put(config, "a", "1", 1)
    (await config.runtime_values())["a"] = "changed"
    assert await config.runtime_values() == {"a": "1"}


async def test_secret_values_read_back_in_clear(config: ConfigStore) -> None:
    await put(config, "llm.api_key", '"sk-123"', 1, secret=True)
    assert await config.runtime_values() == {"llm.api_key": '"sk-123"'}
    assert (await config.changes())[0].new == '"***"'  # the audit holds what the caller masked


async def test_the_audit_trail_is_newest_first_with_exact_records(config: ConfigStore) -> None:
    expected = [
        await put(config, "llm.model", '"a"', 1000),
        await put(config, "llm.api_key", '"sk"', 2000, secret=True),
        await put(config, "llm.model", '"b"', 3000, old='"a"'),
        await put(config, "llm.model", None, 4000, old='"b"'),
    ]
    assert await config.changes() == expected[::-1]
    assert await config.changes(limit=2) == expected[:1:-1]
    assert await config.changes(limit=1) == [change("llm.model", '"b"', None, 4000)]
    assert await config.changes(limit=0) == []


async def test_the_audit_trail_is_limited_across_many_changes(config: ConfigStore) -> None:
    for i in range(1, 26):
        await put(config, "n", str(i), i * 10, old=str(i - 1) if i > 1 else None)
    assert [c.at for c in await config.changes(limit=7)] == [250, 240, 230, 220, 210, 200, 190]
    assert len(await config.changes()) == 25


async def test_values_and_audit_survive_a_new_adapter(backend: Backend) -> None:
    first = await backend.new()
    records = [await put(first, "a", "1", 1), await put(first, "s", '"x"', 2, secret=True)]
    second = await backend.new()
    assert await second.runtime_values() == {"a": "1", "s": '"x"'}
    assert await second.changes() == records[::-1]


# ---- SQLite ------------------------------------------------------------------------------------


async def test_sqlite_records_the_secret_flag_and_time(sqlite_backend: SqliteBackend) -> None:
    config = await sqlite_backend.new()
    await put(config, "plain", "1", 10)
    await put(config, "hidden", '"sk"', 20, secret=True)
    await sqlite_backend.close()
    with sqlite3.connect(sqlite_backend.path) as conn:
        rows = conn.execute("SELECT key, value, secret, updated_at FROM config_values ORDER BY key").fetchall()
    assert rows == [("hidden", '"sk"', 1, 20), ("plain", "1", 0, 10)]


async def test_sqlite_value_and_audit_are_written_together(sqlite_backend: SqliteBackend) -> None:
    config = await sqlite_backend.new()
    await put(config, "a", "1", 1)
    with pytest.raises(sqlite3.IntegrityError):  # the audit row fails (actor NOT NULL): no value either
        await config.set_value("a", "2", secret=False, change=ConfigChange("a", "1", "2", None, 2))  # type: ignore[arg-type]
    assert await config.runtime_values() == {"a": "1"}
    assert [c.at for c in await config.changes()] == [1]


async def test_sqlite_migration_from_version_2_keeps_existing_data(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    with sqlite3.connect(path) as conn:  # a database written by schema version 2
        conn.executescript(MIGRATIONS[0])
        conn.executescript(MIGRATIONS[1])
        conn.execute("INSERT INTO containers VALUES ('t1', 'c1', 1, 1)")
        conn.execute("PRAGMA user_version=2")
    store = SqliteStore(path)
    await store.open()
    try:
        assert await store.get_container("t1", "c1") == Container("t1", "c1", 1, 1)
        config = SqliteConfigStore(store)
        assert await config.runtime_values() == {}
        record = await put(config, "llm.model", '"m"', 5)
        assert await config.changes() == [record]
        assert await store.integrity_check() == "ok"
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == 12


# ---- SSM + DynamoDB ----------------------------------------------------------------------------


async def test_ssm_parameters_are_named_under_the_path_and_typed(ssm_backend: SsmBackend,
                                                                 ssm: AsyncBotocoreClient) -> None:
    config = await ssm_backend.new()
    await put(config, "llm.model", '"m"', 1)
    await put(config, "llm.api_key", '"sk-1"', 2, secret=True)
    res = await ssm.get_parameters_by_path(Path=f"/agentvm/{ssm_backend.stack}", WithDecryption=False)
    types = {p["Name"]: p["Type"] for p in res["Parameters"]}
    assert types == {f"/agentvm/{ssm_backend.stack}/llm.model": "String",
                     f"/agentvm/{ssm_backend.stack}/llm.api_key": "SecureString"}
    secret = await ssm.get_parameter(Name=f"/agentvm/{ssm_backend.stack}/llm.api_key", WithDecryption=False)
    assert secret["Parameter"]["Value"] != '"sk-1"'  # stored encrypted


async def test_ssm_the_secret_flag_switches_the_parameter_type(ssm_backend: SsmBackend,
                                                                ssm: AsyncBotocoreClient) -> None:
    config = await ssm_backend.new()
    name = f"/agentvm/{ssm_backend.stack}/k"
    await put(config, "k", "1", 1)
    await put(config, "k", "2", 2, secret=True)
    assert (await ssm.get_parameter(Name=name))["Parameter"]["Type"] == "SecureString"
    await put(config, "k", "3", 3)
    assert (await ssm.get_parameter(Name=name))["Parameter"]["Type"] == "String"
    assert await config.runtime_values() == {"k": "3"}


async def test_ssm_reads_every_page_and_nested_keys(ssm_backend: SsmBackend, ssm: AsyncBotocoreClient) -> None:
    config = await ssm_backend.new()
    for i in range(23):
        await put(config, f"k{i:02d}", str(i), i + 1)
    await put(config, "llm/deep.model", '"x"', 100)
    await ssm.put_parameter(Name=f"/agentvm/{ssm_backend.stack}-sibling/k00", Value="no", Type="String")
    values = await (await ssm_backend.new()).runtime_values()
    assert values == {**{f"k{i:02d}": str(i) for i in range(23)}, "llm/deep.model": '"x"'}


async def test_ssm_values_are_cached_and_set_value_drops_the_cache(
        ssm_backend: SsmBackend, ssm: AsyncBotocoreClient, session: botocore.session.Session, clock: Clock) -> None:
    calls = count_calls(session, "ssm", "GetParametersByPath")  # before the adapter creates its client
    config = await ssm_backend.new()
    await put(config, "a", "1", 1)
    assert [await config.runtime_values() for _ in range(3)] == [{"a": "1"}] * 3
    assert len(calls) == 1

    # Another process's change is seen once the cache expires.
    await ssm.put_parameter(Name=f"/agentvm/{ssm_backend.stack}/a", Value="2", Type="String", Overwrite=True)
    clock.now += 29.9
    assert await config.runtime_values() == {"a": "1"}
    assert len(calls) == 1
    clock.now += 0.1
    assert await config.runtime_values() == {"a": "2"}
    assert len(calls) == 2

    # This process's own change is read back at once.
    await put(config, "a", "3", 2, old="2")
    assert await config.runtime_values() == {"a": "3"}
    assert len(calls) == 3
    await put(config, "a", None, 3, old="3")
    assert await config.runtime_values() == {}
    assert await config.runtime_values() == {}
    assert len(calls) == 4


async def test_ssm_cache_can_be_disabled(ssm_backend: SsmBackend, session: botocore.session.Session) -> None:
    store = DynamoDBStore(ssm_backend.table, session=session, endpoint_url=ssm_backend.endpoint)
    await store.open()
    config = SsmConfigStore(ssm_backend.path, store, endpoint_url=ssm_backend.endpoint, session=session, cache_s=0)
    calls = count_calls(session, "ssm", "GetParametersByPath")
    try:
        await config.runtime_values()
        await config.runtime_values()
        assert len(calls) == 2
    finally:
        await config.close()
        await store.close()


@pytest.mark.parametrize("key", ["", "/a", "a/", "a//b", "a b", "a:b", "llm.model\n"])
async def test_ssm_refuses_keys_ssm_cannot_name(ssm_backend: SsmBackend, key: str) -> None:
    config = await ssm_backend.new()
    with pytest.raises(InvalidRequest):
        await put(config, key, "1", 1)


async def test_ssm_a_failed_audit_write_is_logged_and_raised_after_the_value_is_set(
        ssm_backend: SsmBackend, caplog: pytest.LogCaptureFixture) -> None:
    broken = await ssm_backend.new(table=f"missing-{uuid.uuid4().hex[:8]}")
    with caplog.at_level(logging.ERROR, logger="agentvm.adapters.aws.ssm_config"), pytest.raises(Exception) as info:
        await put(broken, "llm.model", '"m"', 1)
    assert "ResourceNotFound" in type(info.value).__name__ + str(info.value)
    assert [r.message for r in caplog.records] == ["config value stored but its audit record failed"]
    assert getattr(caplog.records[0], "config_key", None) == "llm.model"
    assert await broken.runtime_values() == {"llm.model": '"m"'}  # the value stayed, the cache was dropped
