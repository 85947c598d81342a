"""SnapStart: what must differ between environments restored from one snapshot.

Lambda snapshots an environment after its init (the imports) and restores every new environment from
that snapshot, so they all start with the same `random` state: the same retry jitter everywhere (two
environments that back off together retry together). `install()` re-seeds it from the OS after each
restore through the runtime's `snapshot_restore_py` hooks; off Lambda, or without SnapStart, there is
no such module and it does nothing. (`secrets`, `uuid.uuid4` and `os.urandom` read the OS each time.)
"""

from __future__ import annotations

import importlib
import random


def reseed() -> None:
    random.seed()


def install() -> bool:
    """Register `reseed` to run after every restore; whether the runtime offers the hook."""
    try:
        hooks = importlib.import_module("snapshot_restore_py")
    except ImportError:
        return False
    hooks.register_after_restore(reseed)
    return True
