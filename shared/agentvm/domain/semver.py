"""Semantic versions (SemVer 2.0.0) and npm-style version specs. Pure: standard library only, no I/O.

- `Version`: `MAJOR.MINOR.PATCH[-prerelease][+build]`, compared by SemVer precedence (build metadata
  is accepted and dropped: it takes no part in precedence, so it is not kept).
- `version_key`: a string whose plain lexicographic order is SemVer precedence, for stores to sort by.
- `VersionSpec`: which versions a reference accepts (`^1.2`, `~1.2.3`, `1.x`, `>=1.0.0 <2.0.0 || 3.x`,
  `latest`), with npm's semantics, including its prerelease rule.
- `best_match`: the highest version a spec accepts.

Limits: a version's text is at most `MAX_VERSION_LENGTH` characters, a spec's `MAX_SPEC_LENGTH`;
`version_key` needs every number of the version below `10**9` (see there).

Kept rather than a library (issue 19): node-semver 0.9.1 (the Python port of npm's `semver`) matches
exactly as this module does, which tests/unit/test_semver_npm_reference.py checks on generated specs,
but it accepts 10 of the 24 specs refused here (hyphen ranges, `v1.2.3`, `^x`, `1.x.3`, empty `||`
alternatives, a 300-character spec) and names no part in its errors (`Invalid comparator: ^1.2.z`), so
this parser would stay whole and only `Comparator.test` would go; `semantic_version`'s `NpmSpec` (last
release 2022) fails 5 of the matching cases (an exact spec with build metadata, a prerelease under
`<2.0.0`, `>= 1.2.3` and doubled spaces refused).
The sort key (`version_key`) is ours in any case.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

MAX_VERSION_LENGTH = 128
MAX_SPEC_LENGTH = 256

KEY_NUMBER_LIMIT = 10**9  # version_key: every number (major, minor, patch, numeric identifier) is below this
_KEY_WIDTH = 9

_IDENTIFIER = re.compile(r"[0-9A-Za-z-]+")
_WILDCARDS = frozenset({"x", "X", "*"})
_PART_NAMES = ("major", "minor", "patch")


class _Problem(ValueError):
    """What is wrong, without naming the text: the caller adds `version '...'` or `version spec '...'`."""


def _show(text: str) -> str:
    """`repr(text)`, shortened when huge (an error message names the text, it need not copy 10 KB of it)."""
    return repr(text) if len(text) <= 80 else repr(text[:60]) + "…"


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _number(name: str, part: str, *, or_wildcard: bool = False) -> int:
    if not part:
        raise _Problem(f"{name} is empty")
    if not _is_number(part):
        raise _Problem(f"{name} {part!r} is not a number{' (nor x or *)' if or_wildcard else ''}")
    if len(part) > 1 and part[0] == "0":
        raise _Problem(f"{name} {part!r} has a leading zero")
    return int(part)


def _identifiers(what: str, text: str) -> tuple[str, ...]:
    ids = tuple(text.split("."))
    for ident in ids:
        if not ident:
            raise _Problem(f"empty {what} identifier in {text!r}")
        if not _IDENTIFIER.fullmatch(ident):
            raise _Problem(f"{what} identifier {ident!r} may only contain ASCII letters, digits and '-'")
    return ids


def _qualifiers(text: str) -> tuple[tuple[str | int, ...], bool]:
    """`core[-prerelease][+build]` → (prerelease identifiers, has a prerelease or build).

    Checks the prerelease and the build; the caller checks the core (before calling, so that its
    problems are reported first: `_split_core` gives it)."""
    _, minus, pre = _split_core(text)
    _, plus, build = text.partition("+")
    prerelease: list[str | int] = []
    if minus:
        if not pre:
            raise _Problem("empty prerelease after '-'")
        for ident in _identifiers("prerelease", pre):
            if _is_number(ident):
                if len(ident) > 1 and ident[0] == "0":
                    raise _Problem(f"numeric prerelease identifier {ident!r} has a leading zero")
                prerelease.append(int(ident))
            else:
                prerelease.append(ident)
    if plus:
        if not build:
            raise _Problem("empty build metadata after '+'")
        _identifiers("build metadata", build)
    return tuple(prerelease), bool(minus or plus)


def _split_core(text: str) -> tuple[str, str, str]:
    """(core, "-" or "", prerelease text) of `core[-prerelease][+build]`, unchecked."""
    return text.partition("+")[0].partition("-")


def _check_no_v(text: str) -> None:
    if len(text) > 1 and text[0] in "vV" and text[1].isdigit():
        raise _Problem(f"no leading 'v' (write {text[1:]!r})")


def _parse_version(text: str) -> Version:
    if not text:
        raise _Problem("empty")
    if len(text) > MAX_VERSION_LENGTH:
        raise _Problem(f"longer than {MAX_VERSION_LENGTH} characters")
    _check_no_v(text)
    parts = _split_core(text)[0].split(".")
    if len(parts) != 3:
        raise _Problem("expected MAJOR.MINOR.PATCH (e.g. 1.2.0)")
    major, minor, patch = (_number(name, part) for name, part in zip(_PART_NAMES, parts, strict=True))
    return Version(major, minor, patch, _qualifiers(text)[0])


@dataclass(frozen=True, slots=True, order=False)
class Version:
    """A semantic version. Equal versions have equal fields (build metadata is not kept).

    `prerelease` holds numeric identifiers as `int` and the others as `str` (a digits-only `str` given
    to the constructor becomes an `int`). Ordering (`<`, `<=`, `>`, `>=`) is SemVer precedence."""

    major: int
    minor: int
    patch: int
    prerelease: tuple[str | int, ...] = ()

    def __post_init__(self) -> None:
        for name in _PART_NAMES:
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"version: {name} must be a non-negative int, not {value!r}")
        normalized: list[str | int] = []
        for ident in self.prerelease:
            if isinstance(ident, str) and _is_number(ident):
                if len(ident) > 1 and ident[0] == "0":
                    raise ValueError(f"version: numeric prerelease identifier {ident!r} has a leading zero")
                ident = int(ident)
            if type(ident) is int:
                if ident < 0:
                    raise ValueError(f"version: prerelease identifier {ident!r} is negative")
            elif not isinstance(ident, str) or not _IDENTIFIER.fullmatch(ident):
                raise ValueError(f"version: prerelease identifier {ident!r} may only contain ASCII letters, "
                                 "digits and '-'")
            normalized.append(ident)
        object.__setattr__(self, "prerelease", tuple(normalized))
        if len(str(self)) > MAX_VERSION_LENGTH:
            raise ValueError(f"version {_show(str(self))}: longer than {MAX_VERSION_LENGTH} characters")

    @classmethod
    def parse(cls, text: str) -> Version:
        """`MAJOR.MINOR.PATCH[-prerelease][+build]`, surrounding whitespace ignored; ValueError naming
        the text and the problem otherwise (`1.2`, `v1.2.3`, `01.2.3`, `1.2.3-`, `1.2.3-01`, ...)."""
        if not isinstance(text, str):
            raise TypeError(f"version must be a str, not {type(text).__name__}")
        try:
            return _parse_version(text.strip())
        except _Problem as exc:
            raise ValueError(f"version {_show(text)}: {exc}") from None

    @property
    def is_prerelease(self) -> bool:
        return bool(self.prerelease)

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{'.'.join(map(str, self.prerelease))}" if self.prerelease else core

    def _precedence(self) -> tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]:
        # a release (1) after any prerelease (0) of the same core; numeric identifiers (0, n, "") before
        # alphanumeric ones (1, 0, s); a shorter list of identifiers first when it is a prefix (tuple order)
        ids = tuple((0, i, "") if isinstance(i, int) else (1, 0, i) for i in self.prerelease)
        return (self.major, self.minor, self.patch, 0 if self.prerelease else 1, ids)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._precedence() < other._precedence()

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._precedence() <= other._precedence()

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._precedence() > other._precedence()

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._precedence() >= other._precedence()


def version_key(version: str | Version) -> str:
    """A printable ASCII string whose lexicographic order is SemVer precedence (and equal iff the
    versions are equal), for stores to sort versions by.

    Layout: `MMMMMMMMM.mmmmmmmmm.ppppppppp` (each number zero-padded to 9 digits), then `~` for a
    release, or `-` and each prerelease identifier as `#` + 9 digits (numeric) or `+` + the text
    (alphanumeric). `-` < `~` puts prereleases before the release; `#` < `+` puts numeric identifiers
    before alphanumeric ones; both markers sort below every identifier character (`-`, digits,
    letters), so an identifier sorts before any longer one it begins, and fewer identifiers first.
    `1.0.0` → `000000001.000000000.000000000~`; `1.0.0-rc.1` → `...000000000-+rc#000000001`.

    Bounds: every number (major, minor, patch, numeric prerelease identifier) must be below 10**9,
    else ValueError. The key is 30 characters for a release, plus 10 per numeric identifier and
    1 + its length per alphanumeric one: 43 for `1.0.0-rc.1`, at most 640 for the longest version
    `Version.parse` accepts (MAX_VERSION_LENGTH)."""
    v = Version.parse(version) if isinstance(version, str) else version
    numbers = [(name, getattr(v, name)) for name in _PART_NAMES]
    numbers += [("prerelease identifier", i) for i in v.prerelease if isinstance(i, int)]
    for name, value in numbers:
        if value >= KEY_NUMBER_LIMIT:
            raise ValueError(f"version {_show(str(v))}: {name} {value} is too large for a sort key "
                             f"(every number must be below {KEY_NUMBER_LIMIT:,})")
    w = _KEY_WIDTH
    core = f"{v.major:0{w}d}.{v.minor:0{w}d}.{v.patch:0{w}d}"
    if not v.prerelease:
        return core + "~"
    return core + "-" + "".join(f"#{i:0{w}d}" if isinstance(i, int) else f"+{i}" for i in v.prerelease)


@dataclass(frozen=True, slots=True)
class Comparator:
    """One primitive constraint: `op` (`<`, `<=`, `>`, `>=`, `=`) against a full version."""

    op: str
    version: Version

    def test(self, version: Version) -> bool:
        v = self.version
        if self.op == "=":
            return version == v
        if self.op == "<":
            return version < v
        if self.op == "<=":
            return version <= v
        if self.op == ">":
            return version > v
        if self.op == ">=":
            return version >= v
        raise ValueError(f"comparator: unknown operator {self.op!r}")

    def __str__(self) -> str:
        return f"{self.op}{self.version}"


_OPERATOR = re.compile(r"(<=|>=|<|>|=|\^|~)?(.*)", re.DOTALL)
_OPERATOR_SPACE = re.compile(r"(<=|>=|<|>|=|\^|~)\s+")  # `>= 1.2.3` is `>=1.2.3`

_Partial = tuple[int | None, int | None, int | None, tuple[str | int, ...]]


def _parse_partial(text: str) -> _Partial:
    """`1`, `1.2`, `1.2.3[-pre][+build]`, with `x`/`X`/`*` for any trailing part; missing parts = x."""
    _check_no_v(text)
    parts = _split_core(text)[0].split(".")
    if len(parts) > 3:
        raise _Problem("expected MAJOR[.MINOR[.PATCH]] (e.g. 1.2.0)")
    numbers: list[int | None] = []
    for name, part in zip(_PART_NAMES, parts, strict=False):
        if part in _WILDCARDS:
            numbers.append(None)
        elif numbers and numbers[-1] is None:
            raise _Problem(f"{name} {part!r} after a wildcard (write e.g. 1.x)")
        else:
            numbers.append(_number(name, part, or_wildcard=True))
    prerelease, qualified = _qualifiers(text)
    numbers += [None] * (3 - len(numbers))
    major, minor, patch = numbers
    if qualified and patch is None:
        raise _Problem("a prerelease or build needs a full MAJOR.MINOR.PATCH")
    return major, minor, patch, prerelease


def _desugar(op: str, partial: _Partial) -> list[Comparator]:
    """npm's rules: an x-range, caret, tilde or partial comparator → primitive comparators."""
    major, minor, patch, pre = partial
    if major is None:
        if op:
            raise _Problem(f"{op!r} needs a version number (e.g. {op}1.2.0)")
        return []

    def ge(ma: int, mi: int, pa: int, p: tuple[str | int, ...] = ()) -> Comparator:
        return Comparator(">=", Version(ma, mi, pa, p))

    def lt(ma: int, mi: int, pa: int) -> Comparator:
        return Comparator("<", Version(ma, mi, pa))

    if op in ("", "="):
        if minor is None:
            return [ge(major, 0, 0), lt(major + 1, 0, 0)]
        if patch is None:
            return [ge(major, minor, 0), lt(major, minor + 1, 0)]
        return [Comparator("=", Version(major, minor, patch, pre))]
    low = ge(major, minor or 0, patch or 0, pre)
    if op == "^":  # the leftmost non-zero part stays fixed
        if major > 0 or minor is None:
            return [low, lt(major + 1, 0, 0)]
        if minor > 0 or patch is None:
            return [low, lt(0, minor + 1, 0)]
        return [low, lt(0, 0, patch + 1)]
    if op == "~":  # patch-level changes (minor-level when only the major is given)
        return [low, lt(major + 1, 0, 0) if minor is None else lt(major, minor + 1, 0)]
    if op == ">=":
        return [low]
    if op == ">":
        if minor is None:
            return [ge(major + 1, 0, 0)]
        if patch is None:
            return [ge(major, minor + 1, 0)]
        return [Comparator(">", Version(major, minor, patch, pre))]
    if op == "<":
        return [Comparator("<", Version(major, minor or 0, patch or 0, pre))]
    # "<="
    if minor is None:
        return [lt(major + 1, 0, 0)]
    if patch is None:
        return [lt(major, minor + 1, 0)]
    return [Comparator("<=", Version(major, minor, patch, pre))]


def _parse_sets(text: str) -> tuple[tuple[Comparator, ...], ...]:
    sets: list[tuple[Comparator, ...]] = []
    for alternative in text.split("||"):
        if not alternative.strip():
            raise _Problem("empty alternative around '||'")
        comparators: list[Comparator] = []
        tokens = _OPERATOR_SPACE.sub(r"\1", alternative.strip()).split()
        for token in tokens:
            where = "" if token == text else f"in {_show(token)}: "
            if token == "-":
                raise _Problem("hyphen ranges (A - B) are not supported: write '>=A <=B'")
            if token == "latest":
                raise _Problem("'latest' must be the whole spec")
            match = _OPERATOR.fullmatch(token)
            assert match is not None  # the pattern matches every string
            op, body = match.group(1) or "", match.group(2)
            try:
                if not body:
                    raise _Problem(f"{op!r} needs a version number (e.g. {op}1.2.0)")
                comparators += _desugar(op, _parse_partial(body))
            except _Problem as exc:
                raise _Problem(f"{where}{exc}") from None
        sets.append(tuple(comparators))
    return tuple(sets)


@dataclass(frozen=True, slots=True)
class VersionSpec:
    """Which versions a reference accepts: an OR (`||`) of sets of comparators ANDed together.

    Forms (npm semantics): `latest` / `*` / `x` / empty / None (any release); `1.2.3` or `=1.2.3`
    (exact, prerelease allowed); `^1.2.3` (>=1.2.3 <2.0.0; `^0.2.3` <0.3.0; `^0.0.3` <0.0.4; `^1.2`,
    `^1`, `^0.2`, `^0` alike); `~1.2.3` (>=1.2.3 <1.3.0; `~1.2` alike; `~1` <2.0.0); x-ranges `1.x`,
    `1.2.x`, `1.*`, `1`, `1.2`; comparators `>=`, `>`, `<`, `<=`, `=` (a partial version fills in as
    npm does: `>1.2` is `>=1.3.0`, `<=1` is `<2.0.0`); space-separated AND; `||` OR.

    A prerelease version matches a set only when some comparator of the set names a prerelease of
    the same MAJOR.MINOR.PATCH (so `^1.2.3-beta.1` accepts `1.2.3-beta.4`, not `1.3.0-beta`), which
    includes an exact spec naming that prerelease.

    `sets` is the desugared form; `text` the spec as given, trimmed (`latest` for None or empty)."""

    text: str
    sets: tuple[tuple[Comparator, ...], ...]

    @classmethod
    def parse(cls, text: str | None) -> VersionSpec:
        """ValueError naming the text and the problem (`version spec '^x': ...`)."""
        if text is None:
            return cls("latest", ((),))
        if not isinstance(text, str):
            raise TypeError(f"version spec must be a str, not {type(text).__name__}")
        trimmed = text.strip()
        if trimmed in ("", "latest"):
            return cls("latest", ((),))
        try:
            if len(trimmed) > MAX_SPEC_LENGTH:
                raise _Problem(f"longer than {MAX_SPEC_LENGTH} characters")
            return cls(trimmed, _parse_sets(trimmed))
        except _Problem as exc:
            raise ValueError(f"version spec {_show(trimmed)}: {exc}") from None

    @property
    def is_latest(self) -> bool:
        """No constraint: any release (`latest`, `*`, `x`, empty)."""
        return self.sets == ((),)

    @property
    def exact(self) -> Version | None:
        """The version of an exact spec (`1.2.3`, `=1.2.3`, `1.2.3-rc.1`), else None."""
        if len(self.sets) == 1 and len(self.sets[0]) == 1 and self.sets[0][0].op == "=":
            return self.sets[0][0].version
        return None

    @property
    def is_exact(self) -> bool:
        return self.exact is not None

    def matches(self, version: Version) -> bool:
        return any(_set_matches(s, version) for s in self.sets)

    def __str__(self) -> str:
        return self.text


def _set_matches(comparators: tuple[Comparator, ...], version: Version) -> bool:
    if not all(c.test(version) for c in comparators):
        return False
    if not version.prerelease:
        return True
    core = (version.major, version.minor, version.patch)
    return any(c.version.prerelease and (c.version.major, c.version.minor, c.version.patch) == core
               for c in comparators)


def best_match(spec: VersionSpec, versions: Iterable[str | Version]) -> Version | None:
    """The highest version `spec` accepts, None when none does. A str is parsed (ValueError if bad)."""
    best: Version | None = None
    for item in versions:
        version = Version.parse(item) if isinstance(item, str) else item
        if spec.matches(version) and (best is None or version > best):
            best = version
    return best
