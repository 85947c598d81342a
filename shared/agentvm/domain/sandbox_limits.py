"""What a tool's process may use, and what came back from running it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentvm.domain.sandbox_spec import SANDBOX_LIMITS


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-call resource limits. Every limit applies to the tool's whole process tree except `cpu_s` and
    `file_size_bytes`, which are rlimits and so hold per process. `memory_bytes` holds for both: all
    the call's processes together (a memory cgroup, else a watchdog) and each one (RLIMIT_AS)."""

    timeout_s: float = 30.0  # wall clock; then the tool's whole process group is killed
    cpu_s: int = 30  # RLIMIT_CPU (per process): SIGXCPU at cpu_s, SIGKILL a second later
    memory_bytes: int = 1 << 30  # the whole call's memory; also RLIMIT_AS (address space) of each process
    file_size_bytes: int = 64 << 20  # RLIMIT_FSIZE: a bigger write fails with EFBIG
    processes: int = 128  # processes/threads the tool may have (fork bombs)
    output_bytes: int = 1 << 20  # stdout+stderr kept per call; the rest is counted and dropped
    # The process is killed (killed="output_limit") once it has written more than this in all;
    # None: 64 × output_bytes, at least 8 MiB.
    output_kill_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        for name in ("cpu_s", "memory_bytes", "file_size_bytes", "processes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.output_bytes < 0:
            raise ValueError("output_bytes must not be negative")

    @property
    def output_kill_at(self) -> int:
        """Total output after which the process is killed."""
        if self.output_kill_bytes is not None:
            return max(self.output_kill_bytes, self.output_bytes)
        return max(64 * self.output_bytes, 8 << 20)


@dataclass(frozen=True, slots=True)
class ProcessResult:
    exit_code: int | None  # None when killed
    stdout: bytes  # at most limits.output_bytes together with stderr
    stderr: bytes
    output_bytes: int  # total bytes the process wrote (kept + dropped)
    truncated: bool
    # "timeout" | "output_limit" | "cpu" | "file_size" | "memory" | "disk_quota" | "disk_reserve" |
    # "signal:N" | None. "cpu" and "file_size": SIGXCPU / SIGXFSZ from the rlimits. "memory": the
    # call's processes together passed `memory_bytes` (one process that passes it alone meets RLIMIT_AS:
    # an allocation fails and the program reports that itself). "disk_quota": the workspace passed its
    # quota; "disk_reserve": the server's free disk space fell under its reserve (sandbox/quota.py).
    killed: str | None
    duration_ms: int
    workspace_bytes: int | None = None  # the workspace's size after the call, when a disk quota applies


def limits_for(ceiling: Limits, sandbox: Mapping[str, Any] | None) -> Limits:
    """The deployment's limits lowered by an image's sandbox (a sandbox never raises them)."""
    wanted = (sandbox or {}).get("limits") or {}
    changes: dict[str, Any] = {}
    for key, value in wanted.items():
        field, unit, _low, _high = SANDBOX_LIMITS[key]
        current = getattr(ceiling, field)
        changes[field] = type(current)(min(current, value * unit))
    return dataclasses.replace(ceiling, **changes) if changes else ceiling
