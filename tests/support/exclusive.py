"""Tests that must not run side by side, across the pytest workers of one run.

The subprocess benchmarks (each a server, moto and many clients: several cores' worth of CPU) and the
tests that bound a latency while they load the machine on purpose (hostile tools) take this lock,
so that the one does not push the other's latency over its bound on a 2-core CI machine.
`@pytest.mark.exclusive` takes it for a test (tests/conftest.py); a module-scoped fixture that runs a
benchmark takes it with `exclusive()`.
"""

from __future__ import annotations

import fcntl
import hashlib
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
#: one lock per checkout, shared by every worker of a run
LOCK = Path(tempfile.gettempdir()) / f"agentvm-exclusive-{hashlib.sha1(str(_ROOT).encode()).hexdigest()[:12]}.lock"


@contextmanager
def exclusive() -> Iterator[None]:
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
