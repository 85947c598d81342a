"""SnapStart: environments restored from one snapshot do not share its `random` state."""

from __future__ import annotations

import random
import sys
import types
from collections.abc import Callable

import pytest

from agentvm.cloud import snapstart


def test_off_lambda_there_is_no_hook_and_nothing_happens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "snapshot_restore_py", raising=False)
    assert snapstart.install() is False


def test_the_runtime_hook_reseeds_random_after_each_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    hooks: list[Callable[[], None]] = []
    fake = types.ModuleType("snapshot_restore_py")
    fake.register_after_restore = hooks.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", fake)
    assert snapstart.install() is True and hooks == [snapstart.reseed]

    random.seed(1234)  # the snapshot's state, the same in every restored environment
    snapshot = random.getstate()
    first = [random.random() for _ in range(3)]
    random.setstate(snapshot)
    hooks[0]()  # Lambda runs it after restoring an environment
    assert [random.random() for _ in range(3)] != first


def test_chat_turn_installs_the_hook_at_init(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.cloud_edge import load_handler

    hooks: list[Callable[[], None]] = []
    fake = types.ModuleType("snapshot_restore_py")
    fake.register_after_restore = hooks.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", fake)
    monkeypatch.setenv("AVM_TABLE_NAME", "t")
    load_handler("chat_turn")
    assert hooks == [snapstart.reseed]
