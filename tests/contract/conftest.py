from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.scripts import RecordingDriver, reference_driver
from tests.support.servers import InProcess, in_process
from tests.support.stock_client import StockClient


@pytest.fixture
def driver() -> RecordingDriver:
    return RecordingDriver(reference_driver())


@pytest.fixture
async def server(tmp_path: Path, driver: RecordingDriver) -> AsyncIterator[InProcess]:
    async with in_process(tmp_path / "data", driver=driver) as srv:
        yield srv


@pytest.fixture
async def client(server: InProcess) -> AsyncIterator[StockClient]:
    async with StockClient(server.url) as c:
        yield c
