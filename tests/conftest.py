"""Shared fixtures."""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# `tests.*` helpers are importable as a package from the repository root.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True)
def _wire_matches_the_protocol_models() -> Iterator[None]:
    """Fail a test that received a frame the protocol models do not describe (tests/support/wire.py)."""
    from tests.support import wire

    wire.DRIFT.clear()
    yield
    drift, wire.DRIFT[:] = list(wire.DRIFT), []
    assert not drift, "frames that drift from agentvm/protocol (events.py, commands.py):\n" + "\n".join(
        sorted(set(drift))[:20])


@pytest.fixture
def traversable_dir() -> Iterator[Path]:
    """A fresh directory under /tmp that every uid may traverse (0o711). Tools and MCP servers run as
    other uids when the tests run as root; pytest's tmp_path lies under a 0o700 directory they could
    not pass (absolute paths into a workspace, $HOME and $TMPDIR would fail without bubblewrap)."""
    path = Path(tempfile.mkdtemp(prefix="avm-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def root_logging() -> Iterator[None]:
    """The root logger's handlers and level as they were before the test (which sets up logging)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)



@pytest.fixture(autouse=True)
def _exclusive(request: pytest.FixtureRequest) -> Iterator[None]:
    """`@pytest.mark.exclusive`: the test never runs beside another exclusive one (tests/support/exclusive.py)."""
    if request.node.get_closest_marker("exclusive") is None:
        yield
        return
    from tests.support.exclusive import exclusive

    with exclusive():
        yield
