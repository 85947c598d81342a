"""Force what the tool sandbox's host probe reports, so that the sandbox modes this machine does not
have (no bubblewrap; no bubblewrap and not root) are tested here too.

The seam is the probe's cache (`local_process._host`): `avm serve` and every `LocalProcessRunner`
read the host from it. A forced "not root" host on a machine that is root makes tools run as root
when the unsafe opt-in lets them run: what a non-root server's tools would do as its own user.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from agentvm.adapters.local import local_process
from agentvm.adapters.local.local_process import probe_host
from agentvm.adapters.local.tool_sandbox import Host

ForcedHost = Literal["no-bwrap", "no-bwrap-not-root", "root-without-netns"]
NO_BWRAP = "bwrap is not installed"


def forced(kind: ForcedHost) -> Host:
    real = probe_host()
    if kind == "no-bwrap":  # root as it is here, bubblewrap gone: the uid drop and a network namespace
        return dataclasses.replace(real, bwrap=None, bwrap_problem=NO_BWRAP)
    if kind == "no-bwrap-not-root":
        return dataclasses.replace(real, bwrap=None, bwrap_problem=NO_BWRAP, privileged=False, unshare=None,
                                   unshare_problem="not root")
    # root, but a platform that grants no namespaces (an unprivileged container, Fargate)
    return dataclasses.replace(real, bwrap=None, bwrap_problem=NO_BWRAP, unshare=None,
                               unshare_problem="unshare --net does not work here: unshare failed: Operation not "
                                               "permitted")


def force_host(monkeypatch: pytest.MonkeyPatch, kind: ForcedHost) -> Host:
    """Make the probe report `kind` for the rest of the test (restored after it)."""
    host = forced(kind)
    monkeypatch.setattr(local_process, "_host", host)
    monkeypatch.setattr(local_process, "_warned", False)
    return host
