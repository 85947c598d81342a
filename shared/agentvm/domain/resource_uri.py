"""Resource URIs: `resource://<kind>s/<name>[@<version spec>]`. Pure: standard library only, no I/O.

    resource://prompts/sales-assistant@^1.2     a prompt, the highest 1.x.y >= 1.2.0
    resource://tools/web-search                 a tool, its latest release
    resource://agents/sales@1.0.0               an agent, exactly 1.0.0
    resource://knowledge/pricing@~2.1           knowledge is uncountable: no "s"

The first path segment is the kind's plural (`KIND_SEGMENTS`), the second the name (`NAME_PATTERN`),
and what follows `@` a `VersionSpec` (absent = latest).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from agentvm.domain.models import RESOURCE_KINDS, ResourceVersion
from agentvm.domain.semver import Version, VersionSpec, best_match

SCHEME: Final = "resource://"

# Lowercase only, so that a URI names one resource whatever the case it was typed in never matters:
# 1 to 100 characters of a-z, 0-9, '.', '_', '-', starting with a letter or a digit. Test a whole
# string with `is_valid_name` (or `fullmatch`): `$` also matches before a trailing newline.
NAME_PATTERN: Final = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
NAME_RULE: Final = ("1 to 100 characters of lowercase letters, digits, '.', '_' and '-', "
                    "starting with a letter or a digit")


def _segment(kind: str) -> str:
    if kind == "knowledge":
        return kind
    return kind + "es" if kind.endswith(("s", "x")) else kind + "s"


KIND_SEGMENTS: Final = MappingProxyType({kind: _segment(kind) for kind in RESOURCE_KINDS})
"""Kind → its URI path segment: prompt → prompts, sandbox → sandboxes, knowledge → knowledge."""
_KINDS_BY_SEGMENT: Final = MappingProxyType({segment: kind for kind, segment in KIND_SEGMENTS.items()})


def is_valid_name(name: object) -> bool:
    return isinstance(name, str) and NAME_PATTERN.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class ResourceRef:
    """A parsed reference: `kind` (one of RESOURCE_KINDS), `name`, and the versions it accepts."""

    kind: str
    name: str
    spec: VersionSpec

    def __post_init__(self) -> None:
        if self.kind not in KIND_SEGMENTS:
            raise ValueError(f"resource kind {self.kind!r}: expected one of {', '.join(RESOURCE_KINDS)}")
        if not is_valid_name(self.name):
            raise ValueError(f"resource name {self.name!r}: expected {NAME_RULE}")

    @property
    def unversioned(self) -> str:
        """`resource://<kind>s/<name>`: the resource, whatever the version."""
        return resource_uri(self.kind, self.name)

    def pinned(self, version: Version | str) -> str:
        """`resource://<kind>s/<name>@<version>`: this resource at exactly `version` (ValueError if bad)."""
        v = Version.parse(version) if isinstance(version, str) else version
        return f"{self.unversioned}@{v}"

    def __str__(self) -> str:
        return self.unversioned if self.spec.is_latest else f"{self.unversioned}@{self.spec}"


def resource_uri(kind: str, name: str, version: str | None = None) -> str:
    """`resource://<kind>s/<name>`, with `@<version>` when given (names and versions as stored)."""
    base = f"{SCHEME}{KIND_SEGMENTS[kind]}/{name}"
    return base if version is None else f"{base}@{version}"


def parse_resource_uri(uri: str) -> ResourceRef:
    """`resource://<kind>s/<name>[@<version spec>]` → ResourceRef; ValueError naming the URI and what is
    wrong (scheme, kind, name, version spec, extra path segments, empty)."""
    if not isinstance(uri, str):
        raise TypeError(f"resource URI must be a str, not {type(uri).__name__}")
    shown = repr(uri) if len(uri) <= 200 else repr(uri[:180]) + "…"

    def fail(problem: str) -> ValueError:
        return ValueError(f"resource URI {shown}: {problem}")

    if not uri.strip():
        raise fail("empty")
    if uri != uri.strip():
        raise fail("leading or trailing whitespace")
    if not uri.startswith(SCHEME):
        raise fail(f"must start with {SCHEME!r}: {SCHEME}<kind>/<name>[@<version spec>], "
                   f"e.g. {SCHEME}prompts/sales@^1.2")
    path, at, spec_text = uri[len(SCHEME):].partition("@")
    segment, _, rest = path.partition("/")
    if not segment:
        raise fail(f"missing the kind: expected {SCHEME}<kind>/<name>")
    if segment not in _KINDS_BY_SEGMENT:
        valid = ", ".join(KIND_SEGMENTS.values())
        hint = ""
        if segment in KIND_SEGMENTS and KIND_SEGMENTS[segment] != segment:
            hint = f" (did you mean {KIND_SEGMENTS[segment]!r}?)"
        elif segment == "knowledges":
            hint = " (did you mean 'knowledge'?)"
        raise fail(f"unknown kind {segment!r}{hint}: expected one of {valid}")
    name, slash, extra = rest.partition("/")
    if not name:
        raise fail(f"missing the name: expected {SCHEME}{segment}/<name>")
    if slash:
        raise fail(f"unexpected path after the name: {'/' + extra!r} ({SCHEME}<kind>/<name> has two segments)")
    if not is_valid_name(name):
        raise fail(f"bad name {name!r}: expected {NAME_RULE}")
    if at and not spec_text.strip():
        raise fail("empty version spec after '@' (omit the '@' for the latest version)")
    try:
        spec = VersionSpec.parse(spec_text if at else None)
    except ValueError as exc:
        raise fail(str(exc)) from None
    return ResourceRef(_KINDS_BY_SEGMENT[segment], name, spec)


def is_resource_uri(value: object) -> bool:
    """A str starting with `resource://` (not necessarily a valid one: see parse_resource_uri)."""
    return isinstance(value, str) and value.startswith(SCHEME)


def find_references(value: object) -> list[str]:
    """Every string inside a JSON-like value (dicts' values, lists, tuples, a string itself) that is
    a `resource://` URI, in document order, each once. Strings are taken whole (not searched inside
    prose) and as they are (not validated: parse them with parse_resource_uri)."""
    found: dict[str, None] = {}
    stack: list[object] = [value]  # explicit: a deeply nested document cannot exhaust the recursion limit
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if is_resource_uri(item):
                found.setdefault(item, None)
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list | tuple):
            stack.extend(reversed(item))
    return list(found)


def choose_version(versions: list[ResourceVersion], spec: VersionSpec) -> ResourceVersion | None:
    """The highest of `versions` (one resource's) that `spec` allows, or None."""
    best = best_match(spec, [v.version for v in versions])
    return None if best is None else next(v for v in versions if v.version == str(best))
