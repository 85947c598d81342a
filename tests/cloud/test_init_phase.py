"""The init phase of every function (agentvm/cloud/init_phase.py): no garbage collection while a
handler is imported (or chat_stream's app built), then the collector on again, and what init built
frozen in a Lambda execution environment only.

Each import runs in a fresh interpreter set up like Lambda (the bench's environment,
tests/bench/cold_imports.py), since this test process has long imported everything."""

from __future__ import annotations

import ast
import gc
import json
import py_compile
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agentvm.cloud import init_phase
from tests.bench.cold_imports import APPS, EXPECTED, FUNCTIONS, lambda_env

# Imports the handler (or builds chat_stream's app) and reports what the collector did meanwhile.
_CHILD = textwrap.dedent("""
    import gc, importlib, json, sys
    target = sys.argv[1]
    before = [s["collections"] for s in gc.get_stats()]
    if target.startswith("app:"):
        module, _, factory = target[4:].partition(":")
        getattr(importlib.import_module(module), factory)()
    else:
        sys.path.insert(0, target)
        importlib.import_module("handler")
    after = [s["collections"] for s in gc.get_stats()]
    print(json.dumps({"collections": [a - b for a, b in zip(after, before)], "enabled": gc.isenabled(),
                      "frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}))
""")


def _init(name: str, *, in_lambda: bool) -> dict[str, Any]:
    folder = FUNCTIONS / name
    env = lambda_env(name, folder)
    if not in_lambda:
        del env["LAMBDA_TASK_ROOT"]
    target = f"app:{APPS[name]}" if name in APPS else str(folder)
    # the handler's own bytecode first: compiling handler.py runs before its first line turns the
    # collector off (a fresh clone has no __pycache__ yet), and that is not what is measured here
    if name not in APPS:
        py_compile.compile(str(folder / "handler.py"), doraise=True)
    proc = subprocess.run([sys.executable, "-c", _CHILD, target], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(report, dict)
    return report


@pytest.mark.parametrize("name", EXPECTED)
def test_a_cold_start_collects_nothing_and_freezes_what_it_built(name: str) -> None:
    report = _init(name, in_lambda=True)
    # chat_stream's process imports uvicorn and the app's module before its factory pauses the collector
    if name in APPS:
        assert report["collections"][2] == 0, report  # no full collection while the app is built
    else:
        assert report["collections"] == [0, 0, 0], report
    assert report["enabled"] is True
    frozen, tracked = report["frozen"], report["tracked"]
    assert isinstance(frozen, int) and isinstance(tracked, int)
    assert frozen > 50_000, report  # modules, classes, functions: the whole init
    assert tracked < 5_000, report  # what is left for the collector to scan


@pytest.mark.parametrize("name", ["ws_default", "http_api", "chat_stream"])
def test_outside_lambda_nothing_is_frozen(name: str) -> None:
    report = _init(name, in_lambda=False)
    assert report["enabled"] is True and report["frozen"] == 0, report


def test_paused_leaves_a_collector_another_caller_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAMBDA_TASK_ROOT", raising=False)
    assert gc.isenabled()
    try:
        gc.disable()
        with init_phase.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # not ours to turn on
    finally:
        gc.enable()
    with init_phase.paused():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_collector_is_on_again_when_the_block_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAMBDA_TASK_ROOT", raising=False)
    with pytest.raises(RuntimeError, match="boom"), init_phase.paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


@pytest.mark.parametrize(("env", "expected"), [({"LAMBDA_TASK_ROOT": "/var/task"}, True), ({}, False),
                                               ({"LAMBDA_TASK_ROOT": "/var/task", "AWS_SAM_LOCAL": "true"}, False)])
def test_in_lambda(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: bool) -> None:
    for key in ("LAMBDA_TASK_ROOT", "AWS_SAM_LOCAL"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert init_phase.in_lambda() is expected


def test_every_handler_pauses_the_collector_first_and_ends_its_init_last() -> None:
    for path in sorted(Path(FUNCTIONS).glob("*/handler.py")):
        body = ast.parse(path.read_text()).body
        calls = [ast.unparse(s) for s in body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
        others = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
                  and not (isinstance(s, ast.ImportFrom) and s.module == "__future__")
                  and not (isinstance(s, ast.Import) and [a.name for a in s.names] == ["gc"])]
        assert ast.unparse(others[0]) == "gc.disable()", path  # before any other import
        assert ast.unparse(body[-1]) == "init_phase.done()", path  # after everything the module builds
        assert calls.count("gc.disable()") == calls.count("init_phase.done()") == 1, path
