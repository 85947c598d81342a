"""A function's init phase (its cold start): the garbage collector paused while the handler's
modules are imported and its objects built, and what they built frozen afterwards.

Importing a handler allocates some 100,000 objects (modules, classes, functions, pydantic schemas)
that live as long as the execution environment. The cyclic collector runs every 700 allocations and
scans them again and again, freeing nothing: 120-170 collections, 7-8 % of the import's CPU time
(docs/benchmarks.md, "Handler cold imports"). So a handler pauses it as its first statement
(`gc.disable()`, before its other imports) and calls `done()` as its last: in a Lambda execution
environment `gc.freeze()` first moves everything built so far to the permanent generation, which
no later collection scans (the pattern `gc.freeze`'s documentation gives for a pre-fork server),
then the collector runs again as usual. What init left unreachable stays frozen with the rest:
~800 objects against 90,000-120,000 (`gc.unfreeze(); gc.collect()` after a handler's import), which
a full collection before the freeze would free for ~15 ms of CPU. Outside Lambda (tests, which
import handlers many times over; `avm serve`) nothing is frozen, so that nothing those processes
built stays for good.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager


def in_lambda() -> bool:
    """A Lambda execution environment (not `sam local`): the init phase runs once per environment."""
    return bool(os.environ.get("LAMBDA_TASK_ROOT")) and not os.environ.get("AWS_SAM_LOCAL")


def done() -> None:
    """The end of the init phase: freeze what it built (in Lambda), and collect again."""
    if in_lambda():
        gc.freeze()
    gc.enable()


@contextmanager
def paused() -> Iterator[None]:
    """The init phase as a block (chat_stream's app factory): no collection inside it, then `done()`.
    A collector another caller had already paused stays paused."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        done()
