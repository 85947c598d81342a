"""The AWS calls each handler makes, recorded client side (issue 18, finding 2).

A botocore event hook on the execution environment's session (`botocore_async.default_session`, the
one every adapter's client comes from when no session is passed) records each API call (service,
operation, parameters) with the function that made it. Which function that is comes from a context
variable: `invoking(label)` sets it around a handler invocation (`cloud_edge` wraps every handler
module it loads, the in-process turn host sets it on its thread), and the adapters' calls run in
the caller's context on the AWS thread pool (botocore_async). Calls made outside an invocation (the
tests' own set-up and reads) are not recorded, nor anything outside `recording()` (other tests run
the same handlers and keep nothing).

`tests/support/role_policies.py` checks the recorded calls against each function's role.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

#: The function (label: `ws_default`, `chat_turn`, `turn_host`, ...) whose invocation is running.
CURRENT: ContextVar[str | None] = ContextVar("avm_lambda_function", default=None)
#: Request bodies: large, and no part of an authorization.
_BODIES = frozenset({"Body", "Data", "Payload", "MessageBody"})


@dataclass(frozen=True)
class Call:
    function: str
    service: str  # botocore's service name: dynamodb, s3, sqs, lambda, apigatewaymanagementapi, ...
    operation: str  # the API operation: PutItem, PostToConnection, ...
    params: Mapping[str, Any]


class Recorder:
    """Every call made inside an invocation, in order (thread-safe: calls run on the AWS pool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self.active = False  # recording at all: only while a test that checks the calls runs

    def on_params(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        function = CURRENT.get()
        if function is None or not self.active:
            return
        call = Call(function, model.service_model.service_name, model.name,
                    {k: v for k, v in params.items() if k not in _BODIES})
        with self._lock:
            self._calls.append(call)

    def calls(self, function: str | None = None) -> list[Call]:
        with self._lock:
            return [c for c in self._calls if function is None or c.function == function]

    def clear(self) -> None:
        with self._lock:
            self._calls.clear()


RECORDER = Recorder()
_installed: list[Any] = []
_install_lock = threading.Lock()


@contextlib.contextmanager
def recording() -> Iterator[Recorder]:
    """Record (from empty) while the block runs; the hook is installed first."""
    recorder = install()
    recorder.clear()
    recorder.active = True
    try:
        yield recorder
    finally:
        recorder.active = False
        recorder.clear()


def install() -> Recorder:
    """Register the hook on the default session (once per process). A client copies the session's
    hooks when it is created: install before the runtime under test creates its clients."""
    from agentvm.adapters.aws.botocore_async import default_session

    session = default_session()
    with _install_lock:
        if session not in _installed:
            session.register("before-parameter-build", RECORDER.on_params, unique_id="avm-test-aws-calls")
            _installed.append(session)
    return RECORDER


@contextlib.contextmanager
def invoking(function: str) -> Iterator[None]:
    """Attribute the AWS calls made inside the block (and the tasks it starts) to `function`."""
    install()
    token = CURRENT.set(function)
    try:
        yield
    finally:
        CURRENT.reset(token)
