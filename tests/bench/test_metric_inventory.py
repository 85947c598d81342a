"""The cost model's custom-metric inventory (tests/bench/cost_inputs.py METRICS) is exactly what the code
emits: every `obs.metric(...)` of a handler, the turn metrics of `record_turns` wherever it is called,
and the turn host's heartbeat metric, each with no dimension but the function (read from the source,
so a metric added, renamed or given a dimension anywhere fails here until the inventory says so)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from agentvm.cloud import observability
from tests.bench.cost_inputs import METRICS, TURN_METRICS

ROOT = Path(__file__).parents[2]
SOURCES = [*sorted(ROOT.glob("functions/*/handler.py")), ROOT / "shared/agentvm/turnhost/__main__.py"]
# The WebSocket routes are shared by the ws_* functions and the turn host's front (cloud/ws_routes.py):
# they emit through the `metric` their caller passes, so each route's metrics belong to both callers.
ROUTES = ROOT / "shared/agentvm/cloud/ws_routes.py"
ROUTE_CALLERS = {"connect": ("ws_connect", "turn_host"), "frame": ("ws_default", "turn_host")}


def route_metrics() -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for fn in ast.walk(ast.parse(ROUTES.read_text(encoding="utf-8"))):
        if not isinstance(fn, ast.AsyncFunctionDef | ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "metric":
                first = node.args[0]
                assert isinstance(first, ast.Constant) and isinstance(first.value, str), ast.dump(node)
                assert not node.keywords and len(node.args) == 3, f"{fn.name}: {first.value} has dimensions"
                assert fn.name in ROUTE_CALLERS, f"ws_routes.{fn.name} emits {first.value}: who calls it?"
                out |= {(caller, first.value) for caller in ROUTE_CALLERS[fn.name]}
    return out


def _function(tree: ast.Module, path: Path) -> str:
    """The function name the module's metrics carry: `observe("x")` or `InvocationMetrics("x")`."""
    names = {node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id in {"observe", "InvocationMetrics"}
             and node.args and isinstance(node.args[0], ast.Constant)}
    assert len(names) <= 1, (path, names)
    return str(next(iter(names))) if names else ""


def emitted() -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        function = _function(tree, path)
        module = None
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Name) and node.func.id == "record_turns":
                out |= {(function, name) for name in observability.TURN_METRICS}
            elif isinstance(node.func, ast.Attribute) and node.func.attr in {"metric", "add"} and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str) and node.func.attr == "metric":
                    name = first.value
                elif isinstance(first, ast.Name) and first.id.endswith("_METRIC"):  # a module constant
                    if module is None:
                        rel = path.relative_to(ROOT / "shared").with_suffix("")
                        module = importlib.import_module(".".join(rel.parts))
                    name = getattr(module, first.id)
                else:
                    continue  # a set's or a list's add
                assert [k.arg for k in node.keywords] == [], f"{path}: {name} has dimensions"
                assert function, f"{path}: a metric outside an observed function"
                out.add((function, name))
    return out | route_metrics()


def test_the_inventory_is_what_the_code_emits() -> None:
    assert TURN_METRICS == observability.TURN_METRICS
    inventory = [(fn, name) for fn, name, _kind in METRICS]
    assert len(inventory) == len(set(inventory))
    assert set(inventory) == emitted()


def test_metrics_carry_only_the_function_dimension() -> None:
    assert frozenset({"function"}) == observability.DIMENSIONS


def test_the_scan_finds_the_known_emitters() -> None:
    """The scan itself works: the metrics alarms and the dashboard rely on are found where they are."""
    found = emitted()
    assert {("chat_turn", "TurnsRun"), ("turn_host", "TurnsRun"), ("turn_host", "HostRunningTurns"),
            ("http_api", "ServerErrors"), ("turn_sweep", "SweepDispatched"), ("ws_connect", "ConnectionsAccepted"),
            ("turn_host", "ConnectionsAccepted")} <= found
    for handler, route in (("ws_connect", "connect"), ("ws_default", "frame")):  # the routes' callers pass obs.metric
        assert f"ws_routes.{route}(" in (ROOT / f"functions/{handler}/handler.py").read_text(encoding="utf-8")
