"""One lock (uv.lock) for .venv, the Lambda layer and chat_stream's package.

`make serve` / `make test` install uv.lock (`uv sync --locked`); `make lock` re-resolves it and exports
shared/requirements.txt (the layer) and functions/chat_stream/requirements.txt from it. These tests fail
when pyproject.toml changed without `make lock`, when an exported file was edited by hand or is stale,
and when the venv running the tests has other versions than the layer ships.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "uv.lock"
EXPORTS = {
    "layer": ROOT / "shared" / "requirements.txt",
    "chat-stream": ROOT / "functions" / "chat_stream" / "requirements.txt",
}
# in the layer, so not repeated in chat_stream's package (Makefile: lock, --no-emit-package)
NOT_EMITTED = {"chat-stream": {"h11"}}
# the worker image's constraints: the runtime dependencies and the aws extra (Makefile: lock)
CONTAINER = ROOT / "infra" / "container" / "constraints.txt"
UV_EXPORT = ["export", "--frozen", "--no-hashes", "--no-header", "--no-annotate", "--no-emit-project"]
RELOCK = "pyproject.toml and uv.lock disagree: run `make lock` and commit uv.lock and the exported requirements"

# (name, extras, specifier, extra or group it belongs to)
Entry = tuple[str, tuple[str, ...], str, str]


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _lock() -> dict[str, Any]:
    return tomllib.loads(LOCK.read_text(encoding="utf-8"))


def _project_entry(lock: dict[str, Any]) -> dict[str, Any]:
    projects: list[dict[str, Any]] = [p for p in lock["package"] if p.get("source") == {"editable": "."}]
    (project,) = projects
    return project


def _versions(lock: dict[str, Any]) -> dict[str, str]:
    versions: dict[str, str] = {}
    for package in lock["package"]:
        if "version" in package:
            name = canonicalize_name(package["name"])
            assert name not in versions, f"uv.lock holds two versions of {name}: the exports would be ambiguous"
            versions[name] = package["version"]
    return versions


def _entry(requirement: Requirement, scope: str) -> Entry:
    return (
        canonicalize_name(requirement.name),
        tuple(sorted(requirement.extras)),
        str(SpecifierSet(str(requirement.specifier))),
        scope,
    )


def _declared() -> set[Entry]:
    pyproject = _pyproject()
    declared = {_entry(Requirement(line), "") for line in pyproject["project"]["dependencies"]}
    for extra, lines in pyproject["project"].get("optional-dependencies", {}).items():
        declared |= {_entry(Requirement(line), f"extra:{extra}") for line in lines}
    for group, lines in pyproject.get("dependency-groups", {}).items():
        declared |= {_entry(Requirement(line), f"group:{group}") for line in lines}
    return declared


def _locked_manifest(project: dict[str, Any]) -> set[Entry]:
    def entry(item: dict[str, Any], scope: str) -> Entry:
        return (
            canonicalize_name(item["name"]),
            tuple(sorted(item.get("extras", []))),
            str(SpecifierSet(item.get("specifier", ""))),
            scope,
        )

    manifest: set[Entry] = set()
    for item in project["metadata"].get("requires-dist", []):
        extra = re.search(r"extra == '([^']+)'", item.get("marker", ""))
        manifest.add(entry(item, f"extra:{extra.group(1)}" if extra else ""))
    for group, items in project["metadata"].get("requires-dev", {}).items():
        manifest |= {entry(item, f"group:{group}") for item in items}
    return manifest


def _pins(path: Path) -> dict[str, str]:
    return _parse_pins(path.read_text(encoding="utf-8"), path.name)


def _parse_pins(text: str, source: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", f"{source}: {line} is not an exact pin"
            pins[canonicalize_name(requirement.name)] = specifier.version
    return pins


def _uv_export(*args: str) -> str:
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        pytest.skip(f"uv is not installed in {uv.parent} (make serve / make test install it)")
    return subprocess.run([str(uv), *UV_EXPORT, *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def _closure(lock: dict[str, Any], roots: list[str]) -> set[str]:
    """Every package the roots can pull in, on any platform (markers not evaluated: a superset)."""
    packages = {canonicalize_name(p["name"]): p for p in lock["package"]}
    seen: set[str] = set()
    todo = [canonicalize_name(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        package = packages[name]
        deps = list(package.get("dependencies", []))
        for items in package.get("optional-dependencies", {}).values():
            deps += items
        todo += [canonicalize_name(d["name"]) for d in deps]
    return seen


def test_lock_was_resolved_from_this_pyproject() -> None:
    project = _project_entry(_lock())
    declared, locked = _declared(), _locked_manifest(project)
    assert not declared - locked, f"{RELOCK}; not in uv.lock: {sorted(declared - locked)}"
    assert not locked - declared, f"{RELOCK}; no longer in pyproject.toml: {sorted(locked - declared)}"
    extras = sorted(_pyproject()["project"].get("optional-dependencies", {}))
    assert sorted(project["metadata"].get("provides-extras", [])) == extras, RELOCK


def test_lock_uses_only_the_public_index() -> None:
    # a lock resolved against a local mirror or find-links folder would not install on another machine
    for package in _lock()["package"]:
        source = package["source"]
        assert source in ({"editable": "."}, {"registry": "https://pypi.org/simple"}), f"{package['name']}: {source}"


@pytest.mark.parametrize("group", sorted(EXPORTS))
def test_lambda_pins_are_the_locked_versions(group: str) -> None:
    lock = _lock()
    versions = _versions(lock)
    pins = _pins(EXPORTS[group])
    members = {canonicalize_name(Requirement(line).name) for line in _pyproject()["dependency-groups"][group]}
    for name, version in pins.items():
        locked = versions.get(name)
        assert locked == version, f"{EXPORTS[group].name} pins {name}=={version}, uv.lock has {locked}"
    assert members <= set(pins), f"{group}: {sorted(members - set(pins))} missing: run `make lock`"
    extra = set(pins) - _closure(lock, sorted(members))
    assert not extra, f"{EXPORTS[group].name} pins {sorted(extra)}, which the group does not need: run `make lock`"


@pytest.mark.parametrize("group", sorted(EXPORTS))
def test_lambda_pins_are_exactly_the_uv_export(group: str) -> None:
    skipped = [f"--no-emit-package={name}" for name in sorted(NOT_EMITTED.get(group, ()))]
    exported = _uv_export("--only-group", group, *skipped)
    expected = {}
    for line in exported.splitlines():
        requirement = Requirement(line)
        assert requirement.marker is None, f"{line}: a platform-dependent pin; the layer is built for one platform"
        (specifier,) = requirement.specifier
        expected[canonicalize_name(requirement.name)] = specifier.version
    assert _pins(EXPORTS[group]) == expected, f"{EXPORTS[group].name} is stale: run `make lock`"


def test_the_venv_runs_the_layer_versions() -> None:
    """pydantic was 2.14.4 in .venv and 2.14.3 in the layer: the tests must run what Lambda runs."""
    versions = _versions(_lock())
    for group, path in EXPORTS.items():
        for name, pinned in _pins(path).items():
            try:
                installed = metadata.version(name)
            except metadata.PackageNotFoundError:
                pytest.fail(f"{name} ({group}) is not installed in {sys.prefix}: run `make test`")
            assert installed == pinned, f"{group} pins {name}=={pinned}, {sys.prefix} has {installed}: run `make test`"
            assert versions[name] == pinned


def test_the_venv_runs_the_locked_versions() -> None:
    versions = _versions(_lock())
    stale = {}
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name in versions and dist.version != versions[name] and name != "agentvm":
            stale[name] = f"{dist.version} installed, {versions[name]} locked"
    assert not stale, f"{sys.prefix} is not synced to uv.lock ({stale}): run `make test`"


def test_worker_image_constraints_are_the_lock() -> None:
    versions = _versions(_lock())
    pins = _pins(CONTAINER)
    for name in ("pydantic", "boto3", "anthropic", "mcp", "uvicorn"):
        assert name in pins, f"{CONTAINER.name} misses {name}: run `make lock`"
    assert {name: versions.get(name) for name in pins} == pins, f"{CONTAINER.name} is stale: run `make lock`"
    assert _pins(EXPORTS["layer"]).items() <= pins.items()


def test_worker_image_constraints_are_exactly_the_uv_export() -> None:
    exported = _uv_export("--no-default-groups", "--extra", "aws", "--extra", "otel")
    assert _pins(CONTAINER) == _parse_pins(exported, "uv export"), f"{CONTAINER.name} is stale: run `make lock`"
