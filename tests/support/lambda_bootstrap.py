"""The child side of `tests/support/lambda_process.py`: one Lambda execution environment in its own process.

    python tests/support/lambda_bootstrap.py functions/<name>/handler.py

Standard library only until the handler is imported (Lambda's runtime client is small too). Like
Lambda, the function's folder is first on `sys.path` and `import handler` is the init phase. Then
every line on stdin is one invocation (`{"event": …, "context": {…}}`), answered by one JSON line on
the original stdout; the handler's own stdout (Powertools writes logs there) goes to stderr.
Each answer carries the process's memory and CPU use: `/proc/self/status`'s VmHWM (peak resident
set, KB) and VmRSS, `ru_maxrss` (Linux keeps it across fork + execve: a child of a large process
starts with its parent's peak, so VmHWM is the figure), and the CPU seconds the invocation took
(user + system), sampled every 10 ms during its first
3 s (`cpu_samples`).
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any


def usage() -> dict[str, Any]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    status: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("VmHWM", "VmRSS"):
                    status[name] = int(value.split()[0])
    except OSError:  # not Linux: ru_maxrss only
        pass
    return {"maxrss_kb": ru.ru_maxrss, "vmhwm_kb": status.get("VmHWM"), "vmrss_kb": status.get("VmRSS"),
            "cpu_s": ru.ru_utime + ru.ru_stime}


class Context:
    """Lambda's context object (the attributes handlers and Powertools read)."""

    def __init__(self, function_name: str, timeout_s: float, memory_limit_in_mb: int = 128,
                 aws_request_id: str | None = None, region: str = "us-east-1") -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = memory_limit_in_mb
        self.aws_request_id = aws_request_id or str(uuid.uuid4())
        self.invoked_function_arn = f"arn:aws:lambda:{region}:123456789012:function:{function_name}"
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = f"2026/11/22/[$LATEST]{uuid.uuid4().hex}"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def _sample(samples: list[tuple[float, float]], done: threading.Event, every_s: float = 0.01,
            for_s: float = 3.0) -> None:
    """(time.monotonic(), process CPU seconds) every `every_s` for the first `for_s` of an invocation:
    CLOCK_MONOTONIC is the machine's, so the parent can tell how much CPU the invocation had spent by a
    moment it saw (the LLM request reaching the fake API). Only the start is sampled: a wake-up every
    10 ms for a whole 10 s turn would add ~0.1 s of CPU to what is measured."""
    end = time.monotonic() + for_s
    while time.monotonic() < end:
        samples.append((time.monotonic(), time.process_time()))
        if done.wait(every_s):
            break
    samples.append((time.monotonic(), time.process_time()))


def main() -> int:
    path = Path(sys.argv[1]).resolve()
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # the handler's prints and Powertools' log lines: stderr
    sys.path[0] = str(path.parent)  # LAMBDA_TASK_ROOT first, as the runtime puts it
    before = usage()
    started = time.perf_counter()
    try:
        module = importlib.import_module(path.stem)
    except BaseException:
        out.write(json.dumps({"ok": False, "error": traceback.format_exc(), "usage": usage()}) + "\n")
        return 1
    after = usage()
    out.write(json.dumps({"ok": True, "init_s": time.perf_counter() - started, "usage": after,
                          "cpu_s": after["cpu_s"] - before["cpu_s"], "startup": before}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        context = Context(**request["context"])
        before = usage()
        started = time.perf_counter()
        samples: list[tuple[float, float]] = []
        done = threading.Event()
        sampler = threading.Thread(target=_sample, args=(samples, done), daemon=True)
        sampler.start()
        try:
            answer: dict[str, Any] = {"ok": True, "result": module.handler(request["event"], context)}
        except BaseException:
            answer = {"ok": False, "error": traceback.format_exc()}
        done.set()
        sampler.join()
        after = usage()
        answer.update(usage=after, cpu_s=after["cpu_s"] - before["cpu_s"], wall_s=time.perf_counter() - started,
                      cpu_samples=samples)
        out.write(json.dumps(answer, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
