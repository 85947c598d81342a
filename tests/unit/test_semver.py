"""agentvm.domain.semver: versions, precedence, sort keys, version specs (npm semantics), best_match."""

from __future__ import annotations

import functools
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentvm.domain.semver import MAX_VERSION_LENGTH, Comparator, Version, VersionSpec, best_match, version_key

# ---- Version: parsing and text -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.0.0", Version(0, 0, 0)),
        ("1.2.3", Version(1, 2, 3)),
        ("10.20.30", Version(10, 20, 30)),
        ("1.0.0-alpha", Version(1, 0, 0, ("alpha",))),
        ("1.0.0-alpha.1", Version(1, 0, 0, ("alpha", 1))),
        ("1.0.0-0.3.7", Version(1, 0, 0, (0, 3, 7))),
        ("1.0.0-x.7.z.92", Version(1, 0, 0, ("x", 7, "z", 92))),
        ("1.0.0-x-y-z.--", Version(1, 0, 0, ("x-y-z", "--"))),
        ("1.0.0-0a", Version(1, 0, 0, ("0a",))),
        ("2.0.0-rc.1+build.123", Version(2, 0, 0, ("rc", 1))),
        ("1.0.0+20130313144700", Version(1, 0, 0)),
        ("1.0.0+exp.sha.5114f85", Version(1, 0, 0)),
        ("1.0.0+001", Version(1, 0, 0)),  # leading zeros are fine in build metadata
        ("  1.2.3\n", Version(1, 2, 3)),
        ("99999999999.0.0", Version(99999999999, 0, 0)),
    ],
)
def test_parse(text: str, expected: Version) -> None:
    assert Version.parse(text) == expected


@pytest.mark.parametrize(
    "text", ["0.0.0", "1.2.3", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-0.3.7", "1.0.0-x.7.z.92", "1.0.0-x-y-z.--"]
)
def test_str_round_trips(text: str) -> None:
    assert str(Version.parse(text)) == text


def test_str_drops_build_metadata() -> None:
    assert str(Version.parse("1.2.3-rc.1+build.5")) == "1.2.3-rc.1"
    assert Version.parse("1.2.3+a") == Version.parse("1.2.3+b") == Version.parse("1.2.3")
    assert hash(Version.parse("1.2.3+a")) == hash(Version(1, 2, 3))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1.2", "version '1.2': expected MAJOR.MINOR.PATCH (e.g. 1.2.0)"),
        ("1", "version '1': expected MAJOR.MINOR.PATCH (e.g. 1.2.0)"),
        ("1.2.3.4", "version '1.2.3.4': expected MAJOR.MINOR.PATCH (e.g. 1.2.0)"),
        ("1.2-rc.1", "version '1.2-rc.1': expected MAJOR.MINOR.PATCH (e.g. 1.2.0)"),
        ("", "version '': empty"),
        ("   ", "version '   ': empty"),
        ("v1.2.3", "version 'v1.2.3': no leading 'v' (write '1.2.3')"),
        ("V1.2.3", "version 'V1.2.3': no leading 'v' (write '1.2.3')"),
        ("01.2.3", "version '01.2.3': major '01' has a leading zero"),
        ("1.02.3", "version '1.02.3': minor '02' has a leading zero"),
        ("1.2.03", "version '1.2.03': patch '03' has a leading zero"),
        ("1.a.3", "version '1.a.3': minor 'a' is not a number"),
        ("1..3", "version '1..3': minor is empty"),
        ("1.2.x", "version '1.2.x': patch 'x' is not a number"),
        ("1.2.-3", "version '1.2.-3': patch is empty"),
        ("1.2.٣", "version '1.2.٣': patch '٣' is not a number"),  # a non-ASCII digit
        ("1.2.3-", "version '1.2.3-': empty prerelease after '-'"),
        ("1.2.3-a..b", "version '1.2.3-a..b': empty prerelease identifier in 'a..b'"),
        ("1.2.3-rc.", "version '1.2.3-rc.': empty prerelease identifier in 'rc.'"),
        ("1.2.3-01", "version '1.2.3-01': numeric prerelease identifier '01' has a leading zero"),
        ("1.2.3-rc_1", "version '1.2.3-rc_1': prerelease identifier 'rc_1' "
         "may only contain ASCII letters, digits and '-'"),
        ("1.2.3-é", "version '1.2.3-é': prerelease identifier 'é' "
         "may only contain ASCII letters, digits and '-'"),
        ("1.2.3+", "version '1.2.3+': empty build metadata after '+'"),
        ("1.2.3+a..b", "version '1.2.3+a..b': empty build metadata identifier in 'a..b'"),
        ("1.2.3+a_b", "version '1.2.3+a_b': build metadata identifier 'a_b' "
         "may only contain ASCII letters, digits and '-'"),
        ("1.2.3+a+b", "version '1.2.3+a+b': build metadata identifier 'a+b' "
         "may only contain ASCII letters, digits and '-'"),
        ("1.2.3 4", "version '1.2.3 4': patch '3 4' is not a number"),
        (
            "1.0.0-" + "a" * MAX_VERSION_LENGTH,
            f"version {('1.0.0-' + 'a' * MAX_VERSION_LENGTH)[:60]!r}…: longer than {MAX_VERSION_LENGTH} characters",
        ),
    ],
)
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        Version.parse(text)
    assert str(info.value) == message


def test_parse_refuses_a_non_string() -> None:
    with pytest.raises(TypeError):
        Version.parse(1)  # type: ignore[arg-type]


def test_constructor_validates_and_normalizes() -> None:
    assert Version(1, 0, 0, ("rc", "7")).prerelease == ("rc", 7)
    assert Version(1, 0, 0, ("rc", "7")) == Version(1, 0, 0, ("rc", 7))
    bad: list[tuple[int, int, int, tuple[str | int, ...]]] = [
        (-1, 0, 0, ()), (1, 0, 0, ("a b",)), (1, 0, 0, ("",)), (1, 0, 0, ("07",)), (1, 0, 0, (-1,))
    ]
    for fields in bad:
        with pytest.raises(ValueError):
            Version(*fields)
    with pytest.raises(ValueError):
        Version(True, 0, 0)
    assert Version(1, 2, 3).is_prerelease is False
    assert Version(1, 2, 3, ("a",)).is_prerelease is True


# ---- Version: precedence -------------------------------------------------------------------------

SEMVER_ORG_ORDER = [  # semver.org §11
    "1.0.0-alpha",
    "1.0.0-alpha.1",
    "1.0.0-alpha.beta",
    "1.0.0-beta",
    "1.0.0-beta.2",
    "1.0.0-beta.11",
    "1.0.0-rc.1",
    "1.0.0",
    "2.0.0",
    "2.1.0",
    "2.1.1",
]


def test_semver_org_precedence() -> None:
    versions = [Version.parse(t) for t in SEMVER_ORG_ORDER]
    for a, b in itertools.pairwise(versions):
        assert a < b and a <= b and b > a and b >= a and a != b
    for i, j in itertools.product(range(len(versions)), repeat=2):
        assert (versions[i] < versions[j]) == (i < j)
        assert (versions[i] == versions[j]) == (i == j)
    assert sorted(reversed(versions)) == versions
    assert [str(v) for v in sorted(versions, key=version_key)] == SEMVER_ORG_ORDER


@pytest.mark.parametrize(
    ("low", "high"),
    [
        ("1.9.0", "1.10.0"),  # numerically, not as text
        ("1.10.0", "2.0.0"),
        ("1.0.0-2", "1.0.0-10"),
        ("1.0.0-10", "1.0.0-a"),  # numeric before alphanumeric
        ("1.0.0-999999999", "1.0.0--"),
        ("1.0.0-a", "1.0.0-a.0"),  # fewer identifiers first
        ("1.0.0-a", "1.0.0-a-"),
        ("1.0.0-a.b", "1.0.0-a-"),
        ("1.0.0-A", "1.0.0-a"),  # ASCII order
        ("1.0.0-Z", "1.0.0-a"),
        ("1.0.0-0a", "1.0.0-a"),
        ("1.0.0-alpha", "1.0.0"),
        ("0.9.9", "1.0.0-0"),
    ],
)
def test_precedence_examples(low: str, high: str) -> None:
    a, b = Version.parse(low), Version.parse(high)
    assert a < b and b > a and not b < a and not a >= b
    assert version_key(a) < version_key(b)


def test_comparing_with_something_else() -> None:
    text: object = "1.0.0"
    assert Version(1, 0, 0) != text
    with pytest.raises(TypeError):
        _ = Version(1, 0, 0) < "2.0.0"


# ---- version_key ---------------------------------------------------------------------------------


def test_version_key_layout() -> None:
    assert version_key("1.0.0") == "000000001.000000000.000000000~"
    assert version_key("1.0.0-rc.1") == "000000001.000000000.000000000-+rc#000000001"
    assert version_key(Version(1, 2, 3)) == version_key("1.2.3+build")
    assert len(version_key("999999999.999999999.999999999-rc.999999999")) == 43


def test_version_key_bounds() -> None:
    assert version_key("999999999.999999999.999999999-999999999")
    with pytest.raises(ValueError) as info:
        version_key("1000000000.0.0")
    assert str(info.value) == (
        "version '1000000000.0.0': major 1000000000 is too large for a sort key "
        "(every number must be below 1,000,000,000)"
    )
    with pytest.raises(ValueError, match="prerelease identifier 1000000000 is too large"):
        version_key("1.0.0-rc.1000000000")
    with pytest.raises(ValueError, match=r"expected MAJOR\.MINOR\.PATCH"):
        version_key("1.0")


def test_version_key_length_of_the_longest_version() -> None:
    longest = "0.0.0-" + ".".join(["0"] * 61)
    assert len(longest) <= MAX_VERSION_LENGTH
    assert len(version_key(longest)) == 640


# small alphabets and mostly small numbers, so that versions often share a prefix and differ just after it
# (`a` vs `a-`, `1` vs `a`, a release vs its prereleases), with now and then the largest number a key allows
_numbers = st.one_of(st.integers(0, 1), st.integers(0, 1), st.integers(0, 1), st.sampled_from([2, 10, 10**9 - 1]))
_alphanumeric = st.text(alphabet="0-Za", min_size=1, max_size=3).filter(lambda s: not s.isdigit())
_identifier = st.one_of(_numbers, _alphanumeric)
_prerelease = st.lists(_identifier, max_size=3).map(tuple)
versions = st.builds(Version, _numbers, _numbers, _numbers, _prerelease)
same_core = st.builds(Version, st.just(1), st.just(0), st.just(0), _prerelease)  # only the prerelease differs


def _reference_compare(a: str, b: str) -> int:
    """semver.org §11 on the texts, independently of Version: -1, 0 or 1."""

    def sign(x: int) -> int:
        return (x > 0) - (x < 0)

    core_a, _, pre_a = a.partition("-")
    core_b, _, pre_b = b.partition("-")
    for x, y in zip(core_a.split("."), core_b.split("."), strict=True):
        if int(x) != int(y):
            return sign(int(x) - int(y))
    if not pre_a or not pre_b:
        return (not pre_a) - (not pre_b)
    ids_a, ids_b = pre_a.split("."), pre_b.split(".")
    for x, y in zip(ids_a, ids_b, strict=False):
        if x == y:
            continue
        if x.isdigit() and y.isdigit():
            return sign(int(x) - int(y))
        if x.isdigit() != y.isdigit():
            return -1 if x.isdigit() else 1
        return -1 if x < y else 1
    return sign(len(ids_a) - len(ids_b))


@settings(max_examples=300)
@given(st.lists(versions, min_size=2, max_size=30))
def test_sorting_by_key_is_sorting_by_precedence(vs: list[Version]) -> None:
    assert sorted(vs, key=version_key) == sorted(vs)
    by_reference = sorted(vs, key=functools.cmp_to_key(lambda x, y: _reference_compare(str(x), str(y))))
    assert sorted(vs) == by_reference


@settings(max_examples=300)
@given(st.lists(same_core, min_size=2, max_size=30))
def test_sorting_prereleases_by_key_is_sorting_by_precedence(vs: list[Version]) -> None:
    assert sorted(vs, key=version_key) == sorted(vs)
    assert [str(v) for v in sorted(vs)] == [
        str(v) for v in sorted(vs, key=functools.cmp_to_key(lambda x, y: _reference_compare(str(x), str(y))))
    ]


@settings(max_examples=500)
@given(st.one_of(st.tuples(versions, versions), st.tuples(same_core, same_core)))
def test_key_order_equals_precedence_pairwise(pair: tuple[Version, Version]) -> None:
    a, b = pair
    _check_pair(a, b)


def _check_pair(a: Version, b: Version) -> None:
    ka, kb = version_key(a), version_key(b)
    assert (ka < kb) == (a < b)
    assert (ka == kb) == (a == b)
    assert (a < b) + (a == b) + (a > b) == 1
    assert (a < b) == (_reference_compare(str(a), str(b)) < 0)
    assert ka.isascii() and ka.isprintable()


@given(versions)
def test_parse_str_round_trip(v: Version) -> None:
    assert Version.parse(str(v)) == v
    assert str(Version.parse(str(v))) == str(v)


# ---- VersionSpec ---------------------------------------------------------------------------------


def _matches(spec: str | None, version: str) -> bool:
    return VersionSpec.parse(spec).matches(Version.parse(version))


@pytest.mark.parametrize(
    ("spec", "yes", "no"),
    [
        # any release
        (None, ["0.0.0", "1.2.3", "99.0.0"], ["1.0.0-rc.1"]),
        ("", ["1.2.3"], ["1.0.0-rc.1"]),
        ("latest", ["1.2.3"], ["1.0.0-rc.1"]),
        ("*", ["0.0.1", "1.2.3"], ["1.0.0-rc.1"]),
        ("x", ["1.2.3"], ["1.0.0-rc.1"]),
        # exact
        ("1.2.3", ["1.2.3"], ["1.2.4", "1.2.2", "1.2.3-rc.1"]),
        ("=1.2.3", ["1.2.3"], ["1.2.4"]),
        ("1.2.3+build.1", ["1.2.3"], ["1.2.4"]),
        ("1.2.3-rc.1", ["1.2.3-rc.1"], ["1.2.3", "1.2.3-rc.2"]),
        # caret
        ("^1.2.3", ["1.2.3", "1.2.9", "1.9.0", "1.99.99"], ["1.2.2", "2.0.0", "2.0.0-rc.1", "1.3.0-rc.1", "0.9.0"]),
        ("^1.2", ["1.2.0", "1.9.9"], ["1.1.9", "2.0.0"]),
        ("^1", ["1.0.0", "1.9.9"], ["0.9.9", "2.0.0"]),
        ("^1.x", ["1.0.0", "1.9.9"], ["2.0.0"]),
        ("^0.2.3", ["0.2.3", "0.2.9"], ["0.2.2", "0.3.0", "1.0.0"]),
        ("^0.2", ["0.2.0", "0.2.9"], ["0.1.9", "0.3.0"]),
        ("^0.0.3", ["0.0.3"], ["0.0.2", "0.0.4", "0.1.0"]),
        ("^0.0", ["0.0.0", "0.0.9"], ["0.1.0"]),
        ("^0", ["0.0.0", "0.9.9"], ["1.0.0"]),
        (
            "^1.2.3-beta.2",
            ["1.2.3-beta.2", "1.2.3-beta.4", "1.2.3", "1.9.0"],
            ["1.2.3-beta.1", "1.2.4-beta.1", "2.0.0"],
        ),
        # tilde
        ("~1.2.3", ["1.2.3", "1.2.9"], ["1.2.2", "1.3.0", "2.0.0"]),
        ("~1.2", ["1.2.0", "1.2.9"], ["1.1.9", "1.3.0"]),
        ("~1", ["1.0.0", "1.9.9"], ["2.0.0"]),
        ("~0.2.3", ["0.2.3", "0.2.9"], ["0.3.0"]),
        ("~1.2.3-beta.2", ["1.2.3-beta.2", "1.2.3-beta.3", "1.2.9"], ["1.2.3-beta.1", "1.2.4-beta.1", "1.3.0"]),
        # x-ranges and partial versions
        ("1.x", ["1.0.0", "1.9.9"], ["0.9.9", "2.0.0", "1.5.0-rc.1"]),
        ("1.X", ["1.0.0"], ["2.0.0"]),
        ("1.*", ["1.0.0", "1.9.9"], ["2.0.0"]),
        ("1.x.x", ["1.0.0"], ["2.0.0"]),
        ("1", ["1.0.0", "1.9.9"], ["2.0.0", "0.1.0"]),
        ("1.2.x", ["1.2.0", "1.2.9"], ["1.3.0", "1.1.0"]),
        ("1.2.*", ["1.2.0"], ["1.3.0"]),
        ("1.2", ["1.2.0", "1.2.9"], ["1.3.0", "1.1.9"]),
        ("=1.2", ["1.2.0"], ["1.3.0"]),
        # comparators
        (">=1.0.0", ["1.0.0", "5.0.0"], ["0.9.9", "1.0.0-rc.1"]),
        (">1.0.0", ["1.0.1", "2.0.0"], ["1.0.0", "0.1.0"]),
        ("<2.0.0", ["1.9.9", "0.0.0"], ["2.0.0", "2.0.0-rc.1", "1.5.0-rc.1"]),
        ("<=2.0.0", ["2.0.0", "1.0.0"], ["2.0.1"]),
        (">=1.2", ["1.2.0"], ["1.1.9"]),
        (">1.2", ["1.3.0"], ["1.2.9"]),
        (">1", ["2.0.0"], ["1.9.9"]),
        ("<1.2", ["1.1.9"], ["1.2.0"]),
        ("<=1.2", ["1.2.9"], ["1.3.0"]),
        ("<=1", ["1.9.9"], ["2.0.0"]),
        (">=1.0.0-rc.1", ["1.0.0-rc.1", "1.0.0-rc.2", "1.0.0", "2.0.0"], ["1.0.0-beta", "1.0.1-rc.1"]),
        (">= 1.2.3", ["1.2.3"], ["1.2.2"]),  # a space after the operator
        # AND, OR
        (">=1.2.0 <2.0.0", ["1.2.0", "1.9.9"], ["1.1.9", "2.0.0"]),
        (">1.0.0   <=1.5.0", ["1.5.0"], ["1.0.0", "1.5.1"]),
        ("1.x || >=3.1.0 <4", ["1.5.0", "3.1.0", "3.9.9"], ["2.0.0", "3.0.0", "4.0.0"]),
        ("^1.2.3 || ^2", ["1.2.3", "2.5.0"], ["3.0.0", "1.2.2"]),
        ("1.0.0 || 1.0.0-rc.1", ["1.0.0", "1.0.0-rc.1"], ["1.0.0-rc.2"]),
        (">=1.0.0-rc.1 <2.0.0 || >=3.0.0", ["1.0.0-rc.5", "3.0.0"], ["3.0.0-rc.1", "1.5.0-rc.1"]),
    ],
)
def test_spec_matches(spec: str | None, yes: list[str], no: list[str]) -> None:
    for version in yes:
        assert _matches(spec, version), f"{spec!r} should match {version}"
    for version in no:
        assert not _matches(spec, version), f"{spec!r} should not match {version}"


@pytest.mark.parametrize(
    ("spec", "desugared"),
    [
        ("^1.2.3", [[">=1.2.3", "<2.0.0"]]),
        ("^0.2.3", [[">=0.2.3", "<0.3.0"]]),
        ("^0.0.3", [[">=0.0.3", "<0.0.4"]]),
        ("~1.2", [[">=1.2.0", "<1.3.0"]]),
        ("1.x", [[">=1.0.0", "<2.0.0"]]),
        (">1.2", [[">=1.3.0"]]),
        ("1.2.3", [["=1.2.3"]]),
        ("*", [[]]),
        (">=1.2.0 <2.0.0 || 3", [[">=1.2.0", "<2.0.0"], [">=3.0.0", "<4.0.0"]]),
    ],
)
def test_spec_desugars(spec: str, desugared: list[list[str]]) -> None:
    assert [[str(c) for c in s] for s in VersionSpec.parse(spec).sets] == desugared


def test_the_prerelease_rule() -> None:
    # a prerelease matches only a set naming a prerelease of the same MAJOR.MINOR.PATCH
    assert not _matches("^1.0.0", "1.1.0-rc.1")
    assert _matches("^1.1.0-rc.1", "1.1.0-rc.2")
    assert not _matches("^1.1.0-rc.1", "1.2.0-rc.1")
    assert _matches("<1.1.0-rc.5", "1.1.0-rc.1")
    assert not _matches("<1.1.0-rc.5", "1.0.0-rc.1")
    assert _matches("1.1.0-rc.1", "1.1.0-rc.1")  # an exact spec
    # the naming comparator must be in the set that matches
    assert _matches(">=1.1.0-rc.1 <1.1.0 || >=1.2.0-rc.1 <1.3.0", "1.1.0-rc.5")
    assert not _matches(">=1.1.0-rc.1 <1.1.0 || >=1.2.0-rc.1 <1.3.0", "1.2.5-rc.1")
    assert not _matches("1.1.0-rc.1 || ^1.0.0", "1.1.0-rc.2")


def test_spec_properties() -> None:
    for latest in (None, "", "  ", "latest", "*", "x", "X", " * "):
        spec = VersionSpec.parse(latest)
        assert spec.is_latest and not spec.is_exact and spec.exact is None
    assert str(VersionSpec.parse(None)) == "latest"
    assert str(VersionSpec.parse("")) == "latest"
    assert str(VersionSpec.parse(" * ")) == "*"
    for exact in ("1.2.3", "=1.2.3", " 1.2.3 ", "1.2.3-rc.1", "= 1.2.3"):
        spec = VersionSpec.parse(exact)
        assert spec.is_exact and not spec.is_latest
    assert VersionSpec.parse("1.2.3-rc.1").exact == Version(1, 2, 3, ("rc", 1))
    for neither in ("^1.2.3", "1.x", ">=1.0.0", "1.2.3 || 1.2.4", "1.2", "* || 1.0.0"):
        spec = VersionSpec.parse(neither)
        assert not spec.is_exact and not spec.is_latest
    assert str(VersionSpec.parse("  >=1.2.0 <2.0.0  ")) == ">=1.2.0 <2.0.0"
    assert VersionSpec.parse("^1.2") == VersionSpec.parse(" ^1.2")
    assert hash(VersionSpec.parse("^1.2")) == hash(VersionSpec.parse("^1.2"))
    assert str(Comparator(">=", Version(1, 0, 0))) == ">=1.0.0"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("^x", "version spec '^x': '^' needs a version number (e.g. ^1.2.0)"),
        ("~*", "version spec '~*': '~' needs a version number (e.g. ~1.2.0)"),
        (">=", "version spec '>=': '>=' needs a version number (e.g. >=1.2.0)"),
        ("^", "version spec '^': '^' needs a version number (e.g. ^1.2.0)"),
        ("abc", "version spec 'abc': major 'abc' is not a number (nor x or *)"),
        ("^1.2.z", "version spec '^1.2.z': patch 'z' is not a number (nor x or *)"),
        ("1.x.3", "version spec '1.x.3': patch '3' after a wildcard (write e.g. 1.x)"),
        ("1.2.3.4", "version spec '1.2.3.4': expected MAJOR[.MINOR[.PATCH]] (e.g. 1.2.0)"),
        ("01.2", "version spec '01.2': major '01' has a leading zero"),
        ("v1.2.3", "version spec 'v1.2.3': no leading 'v' (write '1.2.3')"),
        ("^v1", "version spec '^v1': no leading 'v' (write '1')"),
        ("1.2-beta", "version spec '1.2-beta': a prerelease or build needs a full MAJOR.MINOR.PATCH"),
        ("1.2.3-", "version spec '1.2.3-': empty prerelease after '-'"),
        ("^1.2.3-01", "version spec '^1.2.3-01': numeric prerelease identifier '01' has a leading zero"),
        (">=1.0.0 <2.x.1", "version spec '>=1.0.0 <2.x.1': in '<2.x.1': patch '1' after a wildcard (write e.g. 1.x)"),
        ("1.0.0 ||", "version spec '1.0.0 ||': empty alternative around '||'"),
        ("|| 1.0.0", "version spec '|| 1.0.0': empty alternative around '||'"),
        ("1.0.0 | 2.0.0", "version spec '1.0.0 | 2.0.0': in '|': major '|' is not a number (nor x or *)"),
        ("1.0.0 - 2.0.0", "version spec '1.0.0 - 2.0.0': hyphen ranges (A - B) are not supported: write '>=A <=B'"),
        ("1.0.0 latest", "version spec '1.0.0 latest': 'latest' must be the whole spec"),
        ("=>1.0.0", "version spec '=>1.0.0': major '>1' is not a number (nor x or *)"),
        ("^1.0.0 ~", "version spec '^1.0.0 ~': in '~': '~' needs a version number (e.g. ~1.2.0)"),
        ("1" * 300, f"version spec {'1' * 60!r}…: longer than 256 characters"),
    ],
)
def test_spec_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        VersionSpec.parse(spec)
    assert str(info.value) == message


# ---- best_match ----------------------------------------------------------------------------------

AVAILABLE = ["0.9.0", "1.0.0", "1.2.0", "1.2.5", "1.10.0", "2.0.0-rc.1", "2.0.0-rc.2", "1.11.0-beta.1"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, "1.10.0"),
        ("^1.2", "1.10.0"),  # 1.10 > 1.2: precedence, not text order
        ("~1.2", "1.2.5"),
        ("1.2.0", "1.2.0"),
        ("<1.0.0", "0.9.0"),
        ("^2.0.0-rc.1", "2.0.0-rc.2"),
        ("2.0.0-rc.1", "2.0.0-rc.1"),
        ("^1.11.0-beta.0", "1.11.0-beta.1"),
        ("^3", None),
        ("2.x", None),  # prereleases only: none unless named
    ],
)
def test_best_match(spec: str | None, expected: str | None) -> None:
    found = best_match(VersionSpec.parse(spec), AVAILABLE)
    assert (None if found is None else str(found)) == expected
    found = best_match(VersionSpec.parse(spec), reversed([Version.parse(v) for v in AVAILABLE]))
    assert (None if found is None else str(found)) == expected


def test_best_match_of_nothing_and_of_a_bad_version() -> None:
    assert best_match(VersionSpec.parse(None), []) is None
    with pytest.raises(ValueError, match=r"version '1\.0': expected MAJOR\.MINOR\.PATCH"):
        best_match(VersionSpec.parse(None), ["1.0"])


@settings(max_examples=200)
@given(st.lists(versions, max_size=20), st.sampled_from(["*", "^1", "~0.1", ">=1.2.0 <3", "0.x || 2.x", "^0.0.1"]))
def test_best_match_is_the_highest_match(vs: list[Version], text: str) -> None:
    spec = VersionSpec.parse(text)
    matching = [v for v in vs if spec.matches(v)]
    assert best_match(spec, vs) == (max(matching) if matching else None)
