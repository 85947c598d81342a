"""Sandbox fixtures: workspaces under a directory every uid may traverse, one tool uid per test."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import cast

import pytest

from agentvm.adapters.local.local_process import Isolation, probe_host
from agentvm.adapters.local.tool_sandbox import Host

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs a server running as root (tools then drop to another uid)")
# Not root and no bubblewrap: tools run only with the explicit unsafe opt-in. The tests of what the other
# layers (limits, env, path confinement) still do there opt in; tests/sandbox/test_tool_sandbox.py shows
# the refusal without it. As root the opt-in changes nothing (the uid drop isolates).
UNSAFE_IF_NOT_ROOT = not ROOT

# Tool uids for tests: unused numbers, one per test so process counts and file modes are exact.
_uids = itertools.count(61000 + (os.getpid() % 500) * 20)


@pytest.fixture(scope="session")
def host() -> Host:
    return probe_host()


@pytest.fixture
def base(traversable_dir: Path) -> Path:
    return traversable_dir


@pytest.fixture
def tool_uid() -> int:
    return next(_uids)


@pytest.fixture(params=["none", "bwrap"])
def isolation(request: pytest.FixtureRequest, host: Host) -> Isolation:
    if request.param == "bwrap" and host.bwrap is None:
        pytest.skip(f"bubblewrap not usable here: {host.bwrap_problem}")
    return cast(Isolation, request.param)


def user_tasks(uid: int) -> int:
    """Live processes of `uid` on this host now (zombies waiting for init to reap them not counted)."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                with open(f"/proc/{name}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            count += state != b"Z"
    return count
