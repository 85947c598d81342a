"""The turn host's own CPU use: process CPU time over the last seconds against the wall time and
the vCPUs it has (the cgroup's quota on Fargate)."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

WINDOW_S = 5.0


class CpuMeter:
    def __init__(self, vcpus: float, *, window_s: float = WINDOW_S, cpu: Callable[[], float] = time.process_time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if vcpus <= 0:
            raise ValueError("vcpus must be positive")
        self.vcpus = vcpus
        self.window_s = window_s
        self._cpu = cpu
        self._clock = clock
        self._samples: deque[tuple[float, float]] = deque()
        self.sample()

    def sample(self) -> None:
        now = self._clock()
        self._samples.append((now, self._cpu()))
        # keep one sample at or beyond the window's start, so the window is always covered
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def fraction(self) -> float:
        """CPU used over the window as a fraction of the vCPUs (0 before two samples)."""
        if len(self._samples) < 2:
            return 0.0
        (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        return 0.0 if t1 <= t0 else (c1 - c0) / (t1 - t0) / self.vcpus


def available_vcpus(cgroup: Path = Path("/sys/fs/cgroup")) -> float:
    """The cgroup v2 CPU quota (`cpu.max`: "quota period"), or v1's cfs quota, else the CPUs this
    process may run on."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
        if quota_us > 0 and period_us > 0:
            return quota_us / period_us
    except (OSError, ValueError):
        pass
    return float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
