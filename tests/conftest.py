"""Shared fixtures."""

from __future__ import annotations

import sys
from pathlib import Path

# `tests.*` helpers are importable as a package from the repository root.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
