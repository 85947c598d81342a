"""Cold-import time of every Lambda handler, against a bare `import boto3` measured in the same run.

    .venv/bin/python -m tests.bench.cold_imports [--quick] [--json FILE]

Each import runs in a fresh interpreter set up like a Lambda execution environment: the function's
folder first on `sys.path` (`/var/task`), `shared/` on `PYTHONPATH` (the layer's `/opt/python`), the
environment variables of template.yaml set to dummy values, and `importlib.import_module("handler")`
timed with `time.perf_counter` inside the child, as the Lambda bootstrap imports it. `sam build`
ships compiled bytecode, so one untimed warm-up import per handler first fills the `.pyc` caches.
Handler and baseline children alternate, so that a slow moment of the machine hurts both alike; each
row's ratio is the handler's median over the median of the boto3 imports taken between its runs, in
wall time and in CPU time (`time.process_time`); the limit is judged on CPU time, which a shared
machine's load barely moves (wall-time ratios swung from 1.9 to 3.2 for one handler at a load average
of 5-7 on 2 cores).

The child imports only what the function's deployment holds (`not_deployed`: this venv's other
packages raise ModuleNotFoundError, so optional imports fall back as in Lambda). For the two web apps
the run also reports, not judged, init plus the routes a first request builds (FIRST_REQUESTS).
The run also lists which heavy top-level packages each handler left in `sys.modules`. Exit status:
1 if a handler loads `anthropic` or fails to import, and in full mode also if a ratio exceeds
LIMIT_RATIO. Expected handlers that do not exist yet get a "missing" row and do not fail the run.
See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import importlib.metadata
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FUNCTIONS = REPO / "functions"
SHARED = REPO / "shared"

# Every function of template.yaml (tests/bench/test_bench_smoke.py checks the template against this list).
EXPECTED = ("ws_connect", "ws_disconnect", "ws_default", "http_api", "chat_stream", "chat_turn", "turn_sweep",
            "usage_export", "history_archive", "turn_failed")
# Functions started by a script instead of a handler module: what their process loads and runs before it
# serves (chat_stream: `python -m uvicorn --factory agentvm.cloud.stream_app:create_stream_app`, run.sh).
APPS = {"chat_stream": "agentvm.cloud.stream_app:create_stream_app"}
HEAVY = ("anthropic", "fastapi", "pydantic", "httpx", "aioboto3", "aiobotocore", "aiohttp", "uvicorn")
FORBIDDEN = "anthropic"
LIMIT_RATIO = 2.5
FULL_RUNS, QUICK_RUNS = 7, 3
CHILD_TIMEOUT_S = 60.0
BASELINE = "boto3"

# Runs in the child: times the import, then reports it with the heavy packages left in sys.modules.
# Nothing but what the interpreter already loaded at start-up is imported before the timer starts.
_CHILD = f"""
import importlib, sys, time
target = sys.argv[1]
_hidden = frozenset(sys.argv[2].split(","))
class _NotDeployed:  # this venv's packages that the function's deployment does not hold
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in _hidden:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not deployed with this function)", name=name)
        return None
sys.meta_path.insert(0, _NotDeployed)
app = target.startswith("app:")
if app:
    module, _, factory = target[4:].partition(":")
elif target != {BASELINE!r}:
    sys.path.insert(0, target)
    target = "handler"
t0, c0 = time.perf_counter(), time.process_time()
if app:  # what `python -m uvicorn --factory module:factory` imports and runs before it listens
    importlib.import_module("uvicorn.main")
    made = getattr(importlib.import_module(module), factory)()
else:
    handler = importlib.import_module(target)
elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
first_cpu = 0.0
if len(sys.argv) > 3:  # then build the routes a first request of this path builds (api/route_groups.py)
    found = made if app else next(v.app for v in vars(handler).values()
                                  if hasattr(getattr(v, "app", None), "user_middleware"))
    groups = next(m.kwargs["groups"] for m in found.user_middleware if m.cls.__name__ == "BuildRoutes")
    f0 = time.process_time()
    groups.need(sys.argv[3])
    first_cpu = time.process_time() - f0
import json
tops = {{name.partition(".")[0] for name in sys.modules}}
print(json.dumps({{"ms": elapsed * 1000, "cpu_ms": cpu * 1000, "modules": len(sys.modules),
                  "heavy": sorted(tops & set({HEAVY!r})), "first_cpu_ms": first_cpu * 1000}}))
"""
# The web apps build each router on the first request of its paths: init plus such a request's routes,
# for a few first requests (reported, not judged: the limit is on the import).
FIRST_REQUESTS = {"http_api": ("/v1/resources", "/v1/usage"),
                  "chat_stream": ("/api/v1/chat/completions", "/v1/chat/completions")}


def lambda_env(name: str, function_dir: Path) -> dict[str, str]:
    """The environment Lambda and template.yaml give a function, with dummy values."""
    memory = "512" if name in ("chat_turn", "chat_stream", "usage_export") else "256"
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "en_US.UTF-8",
        "TZ": ":UTC",
        "PYTHONPATH": str(SHARED),  # the layer's /opt/python
        "LAMBDA_TASK_ROOT": str(function_dir),
        "_HANDLER": "handler.handler",
        "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
        "AWS_LAMBDA_FUNCTION_NAME": f"agentvm-{name}",
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": memory,
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/agentvm-{name}",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "AKIDBENCH",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_SESSION_TOKEN": "bench",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AVM_TABLE_NAME": "agentvm-bench",
        "AVM_BUCKET": "agentvm-bench",
        "AVM_WS_ENDPOINT": "https://abc123.execute-api.us-east-1.amazonaws.com/prod",
        "AVM_LLM_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:agentvm/llm-api-key-AbCdEf",
        "AVM_CONFIG_PATH": "/agentvm/bench/",
        "AVM_CHAT_TURN_FUNCTION": "arn:aws:lambda:us-east-1:123456789012:function:agentvm-chat-turn:live",
        "AVM_STREAM_FLUSH_MS": "250",
        "AVM_STREAM_MAX_FLUSH_MS": "2000",
        "AVM_RELIABLE_WRAPPER": "false",
        "AVM_LOG_LEVEL": "INFO",
        "POWERTOOLS_SERVICE_NAME": "agentvm",
        "POWERTOOLS_METRICS_NAMESPACE": "AgentVM",
        "PYDANTIC_DISABLE_PLUGINS": "__all__",
    }


@dataclass(frozen=True)
class Sample:
    ms: float
    cpu_ms: float
    modules: int
    heavy: tuple[str, ...]
    first_cpu_ms: float = 0.0


class ImportFailed(RuntimeError):
    pass


def _requirements(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines() if path.is_file() else ():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            names.add(_dist_key(re.split(r"[\[=<>~!; ]", line, maxsplit=1)[0]))
    return names


def _dist_key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def not_deployed(folder: Path) -> str:
    """The top-level packages of this venv that the function's deployment lacks (the AgentVM layer's
    shared/requirements.txt and the function's own requirements.txt), comma-separated: the child cannot
    import them, so optional imports (uvicorn's watchfiles, FastAPI's email-validator …) fall back as in
    Lambda."""
    deployed = _requirements(SHARED / "requirements.txt") | _requirements(folder / "requirements.txt")
    hidden = {top for top, dists in importlib.metadata.packages_distributions().items()
              if top.isidentifier() and not any(_dist_key(d) in deployed for d in dists)}
    return ",".join(sorted(hidden - {"agentvm"}))  # agentvm: the layer itself (shared/ on PYTHONPATH)


def import_once(target: str, folder: Path, env: Mapping[str, str], first_path: str | None = None) -> Sample:
    """One import in a fresh interpreter started in the function's folder (Lambda's /var/task).
    `target` is that folder (import its handler) or BASELINE; `first_path`: then build the routes the
    first request of that path builds."""
    extra = [] if first_path is None else [first_path]
    proc = subprocess.run([sys.executable, "-c", _CHILD, target, not_deployed(folder), *extra], cwd=folder,
                          env=dict(env), capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise ImportFailed(lines[-1] if lines else f"exit status {proc.returncode}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return Sample(float(out["ms"]), float(out["cpu_ms"]), int(out["modules"]), tuple(out["heavy"]),
                  float(out["first_cpu_ms"]))


def measure_first_requests(runs: int) -> list[dict[str, object]]:
    """CPU ms of init plus the routes of a first request, for each of FIRST_REQUESTS, alternating with
    boto3's import; median of `runs`."""
    rows: list[dict[str, object]] = []
    for name, paths in FIRST_REQUESTS.items():
        folder = FUNCTIONS / name
        env = lambda_env(name, folder)
        for path in paths:
            init, first, base = [], [], []
            for _ in range(runs):
                base.append(import_once(BASELINE, folder, env).cpu_ms)
                sample = import_once(target_of(name, folder), folder, env, path)
                init.append(sample.cpu_ms)
                first.append(sample.first_cpu_ms)
            total = statistics.median(i + f for i, f in zip(init, first, strict=True))
            rows.append({"function": name, "path": path, "init_cpu_ms": statistics.median(init),
                         "first_request_cpu_ms": statistics.median(first), "total_cpu_ms": total,
                         "boto3_cpu_ms": statistics.median(base), "ratio": total / statistics.median(base)})
    return rows


def first_table(rows: list[dict[str, object]]) -> str:
    lines = ["init + the routes of a first request (CPU ms; reported, not judged):"]
    lines += [f"  {r['function']:<12} {r['path']:<26} {r['init_cpu_ms']:>6.0f} + {r['first_request_cpu_ms']:>4.0f} = "
              f"{r['total_cpu_ms']:>6.0f}  boto3 {r['boto3_cpu_ms']:>5.0f}  {r['ratio']:.2f} ×" for r in rows]
    return "\n".join(lines)


@dataclass
class Row:
    name: str
    expected: bool
    status: str  # "ok", "missing" or "error"
    samples_ms: list[float] = field(default_factory=list)
    boto3_samples_ms: list[float] = field(default_factory=list)
    cpu_samples_ms: list[float] = field(default_factory=list)
    boto3_cpu_samples_ms: list[float] = field(default_factory=list)
    modules: int = 0
    heavy: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def median_ms(self) -> float | None:
        return float(statistics.median(self.samples_ms)) if self.samples_ms else None

    @property
    def boto3_median_ms(self) -> float | None:
        return float(statistics.median(self.boto3_samples_ms)) if self.boto3_samples_ms else None

    @property
    def ratio(self) -> float | None:
        m, b = self.median_ms, self.boto3_median_ms
        return None if m is None or not b else m / b

    @property
    def cpu_ratio(self) -> float | None:
        """The judged ratio: CPU time. An import is one thread's work; on a shared machine its wall time
        also counts the waits for a core (±50 % at a load average of 5 on 2 cores), its CPU time ~7 %."""
        if not self.cpu_samples_ms or not self.boto3_cpu_samples_ms:
            return None
        b = statistics.median(self.boto3_cpu_samples_ms)
        return float(statistics.median(self.cpu_samples_ms) / b) if b else None

    @property
    def within_limit(self) -> bool | None:
        return None if self.cpu_ratio is None else self.cpu_ratio <= LIMIT_RATIO

    @property
    def loads_forbidden(self) -> bool:
        return FORBIDDEN in self.heavy

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "median_ms": self.median_ms, "boto3_median_ms": self.boto3_median_ms,
                "ratio": self.ratio, "cpu_ratio": self.cpu_ratio, "within_limit": self.within_limit,
                "loads_anthropic": self.loads_forbidden}


def discover() -> dict[str, Path]:
    """Every functions/<name>/ that holds a handler.py (or is one of APPS), by name."""
    found = {p.parent.name: p.parent for p in sorted(FUNCTIONS.glob("*/handler.py"))}
    found.update({name: FUNCTIONS / name for name in APPS if (FUNCTIONS / name).is_dir()})
    return dict(sorted(found.items()))


def target_of(name: str, folder: Path) -> str:
    """The child's argument: the function's folder (import its handler) or `app:module:factory`."""
    return f"app:{APPS[name]}" if name in APPS else str(folder)


def log(msg: str) -> None:
    print(f"[cold-imports {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def measure(runs: int, functions: Mapping[str, Path] | None = None) -> list[Row]:
    """Rows for the expected handlers (missing ones included) and any other handler found."""
    found = dict(discover() if functions is None else functions)
    rows = {name: Row(name, True, "missing") for name in EXPECTED if name not in found}
    live: dict[str, tuple[Path, dict[str, str]]] = {}
    for name, folder in found.items():
        env = lambda_env(name, folder)
        try:  # warm-up: compiles and caches the .pyc files, as `sam build` ships them
            first = import_once(target_of(name, folder), folder, env)
            import_once(BASELINE, folder, env)
        except (ImportFailed, subprocess.TimeoutExpired) as e:
            rows[name] = Row(name, name in EXPECTED, "error", error=str(e))
            continue
        rows[name] = Row(name, name in EXPECTED, "ok", modules=first.modules, heavy=list(first.heavy))
        live[name] = (folder, env)
    log(f"{len(live)} handlers × {runs} runs, each alternating with `import {BASELINE}`")
    for _ in range(runs):
        for name, (folder, env) in live.items():
            row = rows[name]
            if row.status != "ok":
                continue
            try:
                base = import_once(BASELINE, folder, env)
                sample = import_once(target_of(name, folder), folder, env)
                row.boto3_samples_ms.append(base.ms)
                row.boto3_cpu_samples_ms.append(base.cpu_ms)
                row.cpu_samples_ms.append(sample.cpu_ms)
            except (ImportFailed, subprocess.TimeoutExpired) as e:
                row.status, row.error = "error", str(e)
                continue
            row.samples_ms.append(sample.ms)
            row.heavy = sorted(set(row.heavy) | set(sample.heavy))
    order = {n: i for i, n in enumerate(EXPECTED)}
    return sorted(rows.values(), key=lambda r: (order.get(r.name, len(order)), r.name))


def failures(rows: list[Row], quick: bool) -> list[str]:
    out = []
    for r in rows:
        if r.status == "error":
            out.append(f"{r.name}: import failed: {r.error}")
        if r.loads_forbidden:
            out.append(f"{r.name}: loads the {FORBIDDEN} SDK")
        if not quick and r.within_limit is False:
            out.append(f"{r.name}: {r.cpu_ratio:.2f} × {BASELINE} (CPU time) > {LIMIT_RATIO}")
    return out


def table(rows: list[Row]) -> str:
    def ms(v: float | None) -> str:
        return "—" if v is None else f"{v:,.0f}"

    lines = [("handler", "import ms", f"{BASELINE} ms", "ratio", "CPU ratio", "target", "status",
              "heavy packages loaded")]
    for r in rows:
        if r.status == "ok":
            status = "met" if r.within_limit else "MISSED"
            if r.loads_forbidden:
                status = f"MISSED ({FORBIDDEN})"
        else:
            status = r.status if r.error is None else f"error: {r.error}"
        lines.append((r.name, ms(r.median_ms), ms(r.boto3_median_ms), "—" if r.ratio is None else f"{r.ratio:.2f}",
                      "—" if r.cpu_ratio is None else f"{r.cpu_ratio:.2f}", f"<= {LIMIT_RATIO}", status,
                      ", ".join(r.heavy) if r.status == "ok" else "—"))
    widths = [max(len(x[i]) for x in lines) for i in range(len(lines[0]))]
    text = ["  ".join(c.ljust(w) if i in (0, 6, 7) else c.rjust(w)
                      for i, (c, w) in enumerate(zip(x, widths, strict=True))).rstrip() for x in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def report(quick: bool) -> tuple[dict[str, object], str, list[str]]:
    """Measure; returns the JSON-able result, the printable table and the failures."""
    runs = QUICK_RUNS if quick else FULL_RUNS
    started, load_before = time.monotonic(), os.getloadavg()[0]
    rows = measure(runs)
    first = measure_first_requests(runs)
    failed = failures(rows, quick)
    result: dict[str, object] = {
        "mode": "quick" if quick else "full", "runs": runs, "limit_ratio": LIMIT_RATIO,
        "baseline": f"import {BASELINE}",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "python": platform.python_version(),
        "duration_s": round(time.monotonic() - started, 1), "heavy_packages": list(HEAVY),
        # A busy machine slows both sides alike (they alternate), but read the ratios with care.
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)], "cores": os.cpu_count(),
        "handlers": [r.as_dict() for r in rows], "first_requests": first,
        "missing": [r.name for r in rows if r.status == "missing"],
        "failures": failed, "passed": not failed}
    head = (f"Handler cold imports ({result['mode']}, median of {runs}, fresh interpreter, warm .pyc; judged on "
            f"the CPU ratio) — "
            f"Python {result['python']} — {result['duration_s']} s — load average {load_before:.2f} → "
            f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    text = "\n".join([head, table(rows), first_table(first)])
    if result["missing"]:
        text += f"\nmissing (not written yet): {', '.join(r.name for r in rows if r.status == 'missing')}"
    return result, text, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.cold_imports", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_RUNS} runs instead of {FULL_RUNS}; fails only on a handler loading {FORBIDDEN}")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    result, text, failed = report(args.quick)
    print(text)
    for f in failed:
        print(f"FAILED: {f}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
