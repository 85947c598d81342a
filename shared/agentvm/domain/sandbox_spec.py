"""What a `sandbox` resource may say: limits for the tools of the images that pin it. Pure rules,
loaded without the sandbox package (resource writes check it on the Lambda cold path)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A `sandbox` resource's `limits`: wire key → (Limits field, unit in bytes or 1, lowest, highest).
SANDBOX_LIMITS: dict[str, tuple[str, int, int, int]] = {
    "timeoutS": ("timeout_s", 1, 1, 3600),
    "cpuS": ("cpu_s", 1, 1, 3600),
    "memoryMb": ("memory_bytes", 1 << 20, 64, 64 << 10),
    "fileSizeMb": ("file_size_bytes", 1 << 20, 1, 64 << 10),
    "processes": ("processes", 1, 1, 4096),
    "outputBytes": ("output_bytes", 1, 1024, 64 << 20),
}


def check_sandbox_content(content: Mapping[str, Any]) -> None:
    """A `sandbox` resource's content, `{"limits": {...}}`: ValueError naming the problem."""
    for key in content:
        if key in ("packages", "image"):
            raise ValueError(f"{key}: not supported: tools run in the deployment's container image "
                             "(infra/container/Dockerfile); add packages there")
        if key != "limits":
            raise ValueError(f"{key}: unknown key (a sandbox has limits)")
    limits = content.get("limits")
    if not isinstance(limits, dict) or not limits:
        raise ValueError(f"limits: an object with any of {', '.join(SANDBOX_LIMITS)}")
    for key, value in limits.items():
        if key not in SANDBOX_LIMITS:
            raise ValueError(f"limits.{key}: unknown limit (one of {', '.join(SANDBOX_LIMITS)})")
        _field, _unit, low, high = SANDBOX_LIMITS[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"limits.{key}: an integer from {low} to {high}")
