"""Lambda execution environments as child processes, for the edge's functions that must run as Lambda runs
them (their memory measured: `tests/bench/chat_turn_rss.py`).

A `ProcessEnvironments` has the interface of `cloud_edge.Environments` (submit, shutdown, started): each
environment is a child Python (`lambda_bootstrap.py`) started with the environment variables given,
which imports the handler module once (the init phase) and then runs invocations one at a time; a new
one starts only when every existing one is busy. Every answer's memory and CPU figures are kept in
`init` (one entry per environment started) and `invocations`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

BOOTSTRAP: Final = Path(__file__).with_name("lambda_bootstrap.py")


class ProcessHandlerError(Exception):
    """The handler raised in the child (the message is its traceback), or the child died."""


@dataclass
class Measured:
    """What a child reported: after its init phase (`init`), after each invocation (`invocations`)."""

    init: list[dict[str, Any]] = field(default_factory=list)
    invocations: list[dict[str, Any]] = field(default_factory=list)


class _Child:
    def __init__(self, path: Path, env: Mapping[str, str], measured: Measured, python_args: Sequence[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, *python_args, str(BOOTSTRAP), str(path)], cwd=path.parent,
                                     env=dict(env),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8")
        self.measured = measured
        answer = self._read()
        if not answer.get("ok"):
            self.close()
            raise ProcessHandlerError(f"init of {path} failed:\n{answer.get('error')}")
        measured.init.append(answer)

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise ProcessHandlerError(f"the environment process exited with {self.proc.wait()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def invoke(self, event: Any, context: Any) -> Any:
        assert self.proc.stdin is not None
        ctx = {"function_name": context.function_name, "timeout_s": context.get_remaining_time_in_millis() / 1000,
               "memory_limit_in_mb": context.memory_limit_in_mb, "aws_request_id": context.aws_request_id}
        self.proc.stdin.write(json.dumps({"event": event, "context": ctx}) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        self.measured.invocations.append({k: v for k, v in answer.items() if k != "result"})
        if not answer["ok"]:
            raise ProcessHandlerError(answer["error"])
        return answer["result"]

    def close(self, timeout: float = 10.0) -> bool:
        """Lambda's shutdown: stdin closed, the process exits (or is killed). False if it had to be killed."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return False
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()


class ProcessEnvironments:
    """Warm environments of one function, each a child process (see the module docstring)."""

    def __init__(self, env: Mapping[str, str], limit: int = 8, python_args: Sequence[str] = ()) -> None:
        """`python_args`: the child interpreter's options (`-S`: no site-packages, only PYTHONPATH)."""
        self.env = dict(env)
        self.python_args = tuple(python_args)
        self.limit = limit
        self.measured = Measured()
        self.started = 0
        self._lock = threading.Lock()
        self._idle: list[_Child] = []
        self._running: set[_Child] = set()
        self._children: list[_Child] = []
        self._busy = 0
        self._closed = False

    def submit(self, path: Path, event: Any, context: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("these environments were shut down")
        threading.Thread(target=self._run, args=(fut, path, event, context), daemon=True,
                         name="lambda-process-invoke").start()
        return fut

    def _run(self, fut: Future[Any], path: Path, event: Any, context: Any) -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            child = self._take(path)
        except BaseException as exc:
            fut.set_exception(exc)
            return
        with self._lock:
            self._running.add(child)
        try:
            result = child.invoke(event, context)
        except BaseException as exc:
            self._give_back(child)
            fut.set_exception(exc)
        else:
            self._give_back(child)
            fut.set_result(result)

    def _take(self, path: Path) -> _Child:
        with self._lock:
            if self._idle:
                self._busy += 1
                return self._idle.pop()
            if self.started >= self.limit:
                raise RuntimeError(f"more than {self.limit} concurrent invocations (raise the limit)")
            self.started += 1
            self._busy += 1
        try:
            child = _Child(path, self.env, self.measured, self.python_args)
        except BaseException:
            with self._lock:
                self._busy -= 1
            raise
        with self._lock:
            self._children.append(child)
        return child

    def kill_running(self) -> int:
        """SIGKILL every environment in the middle of an invocation (a crash, the OOM killer): the
        invocation fails as Lambda's does when its runtime exits. Returns how many were killed."""
        with self._lock:
            running = list(self._running)
        for child in running:
            child.proc.kill()
        return len(running)

    def _give_back(self, child: _Child) -> None:
        with self._lock:
            self._running.discard(child)
            self._busy -= 1
            if child.proc.poll() is None:
                self._idle.append(child)

    def shutdown(self, timeout: float = 30.0) -> list[str]:
        """Close every environment (running invocations must have finished: the edge drains first);
        returns the names of those that had to be killed."""
        with self._lock:
            self._closed = True
            children = list(self._children)
        return [f"lambda-process-{c.proc.pid}" for c in children if not c.close(timeout)]
