"""agentvm.domain.semver's spec semantics against a maintained implementation of npm's: node-semver
(the Python port of npm's `semver`, a test dependency only). The domain keeps its own parser for its
error messages and its refusals (hyphen ranges, a leading `v`, `1.x.3`, empty `||` alternatives, which
node-semver accepts); on every spec it accepts, which versions match must be what npm says."""

from __future__ import annotations

import nodesemver
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentvm.domain.semver import Version, VersionSpec

_small = st.integers(0, 3)
_pre = st.lists(st.one_of(st.integers(0, 2), st.sampled_from(["alpha", "beta", "rc"])), min_size=1, max_size=2)
versions = st.builds(Version, _small, _small, _small, st.one_of(st.just(()), _pre.map(tuple)))


@st.composite
def comparators(draw: st.DrawFn) -> str:
    op = draw(st.sampled_from(["", "=", "^", "~", ">", ">=", "<", "<="]))
    parts = [str(draw(_small))]
    depth = draw(st.integers(1, 3))
    wildcard = draw(st.booleans()) and depth > 1 and op in ("", "^", "~")
    for _ in range(depth - 1):
        parts.append(draw(st.sampled_from(["x", "*"])) if wildcard else str(draw(_small)))
    text = ".".join(parts)
    if depth == 3 and not wildcard and draw(st.booleans()):
        text += "-" + ".".join(str(i) for i in draw(_pre))
    return op + text


specs = st.lists(st.lists(comparators(), min_size=1, max_size=2).map(" ".join), min_size=1, max_size=2).map(
    " || ".join)


def npm_matches(spec: str, version: Version) -> bool:
    return bool(nodesemver.satisfies(str(version), spec, loose=False))


@settings(max_examples=500, deadline=None)
@given(specs, st.lists(versions, min_size=1, max_size=8))
def test_matching_is_npms(spec: str, vs: list[Version]) -> None:
    parsed = VersionSpec.parse(spec)
    for v in vs:
        assert parsed.matches(v) == npm_matches(spec, v), (spec, str(v))


@pytest.mark.parametrize("spec", ["^1.2.3", "~1.2", "1.x", ">=1.0.0-rc.1 <2.0.0 || >=3.0.0", "^0.0.3", "*"])
def test_the_highest_match_is_npms(spec: str) -> None:
    available = ["0.0.3", "0.0.4", "1.0.0-rc.2", "1.0.0", "1.2.3", "1.2.9", "1.9.0", "2.0.0-rc.1", "3.1.0"]
    ours = next((str(v) for v in sorted(map(Version.parse, available), reverse=True)
                 if VersionSpec.parse(spec).matches(v)), None)
    assert ours == nodesemver.max_satisfying(available, spec, loose=False)
