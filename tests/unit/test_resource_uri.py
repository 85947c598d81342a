"""agentvm.domain.resource_uri: parsing resource:// URIs, their errors, and finding them in a definition."""

from __future__ import annotations

import pytest

from agentvm.domain.models import RESOURCE_KINDS
from agentvm.domain.resource_uri import (
    KIND_SEGMENTS,
    NAME_PATTERN,
    ResourceRef,
    find_references,
    is_resource_uri,
    is_valid_name,
    parse_resource_uri,
)
from agentvm.domain.semver import Version, VersionSpec

NAME_RULE = "1 to 100 characters of lowercase letters, digits, '.', '_' and '-', starting with a letter or a digit"
KINDS = "prompts, tools, sandboxes, agents, knowledge"


def test_kind_segments() -> None:
    assert dict(KIND_SEGMENTS) == {
        "prompt": "prompts", "tool": "tools", "sandbox": "sandboxes", "agent": "agents", "knowledge": "knowledge",
    }
    assert tuple(KIND_SEGMENTS) == RESOURCE_KINDS


@pytest.mark.parametrize(
    ("uri", "kind", "name", "spec"),
    [
        ("resource://prompts/sales-assistant@^1.2", "prompt", "sales-assistant", "^1.2"),
        ("resource://tools/web-search", "tool", "web-search", "latest"),
        ("resource://sandboxes/python3.12@~1.0", "sandbox", "python3.12", "~1.0"),
        ("resource://agents/sales@1.0.0", "agent", "sales", "1.0.0"),
        ("resource://knowledge/pricing_2024@>=1.0.0 <2.0.0", "knowledge", "pricing_2024", ">=1.0.0 <2.0.0"),
        ("resource://tools/a", "tool", "a", "latest"),
        ("resource://tools/0", "tool", "0", "latest"),
        ("resource://tools/x@latest", "tool", "x", "latest"),
        ("resource://tools/x@*", "tool", "x", "*"),
        ("resource://tools/x@1.x || 2.x", "tool", "x", "1.x || 2.x"),
        ("resource://tools/x@1.0.0-rc.1+build", "tool", "x", "1.0.0-rc.1+build"),
        ("resource://tools/" + "a" * 100, "tool", "a" * 100, "latest"),
    ],
)
def test_parse(uri: str, kind: str, name: str, spec: str) -> None:
    ref = parse_resource_uri(uri)
    assert (ref.kind, ref.name, str(ref.spec)) == (kind, name, spec)
    assert ref.spec == VersionSpec.parse(spec)


@pytest.mark.parametrize(
    "uri",
    [
        "resource://prompts/sales-assistant@^1.2",
        "resource://tools/web-search",
        "resource://sandboxes/py@~1.0",
        "resource://agents/sales@1.0.0",
        "resource://knowledge/pricing@>=1.0.0 <2.0.0",
        "resource://agents/sales@1.0.0-rc.1",
    ],
)
def test_str_round_trips(uri: str) -> None:
    assert str(parse_resource_uri(uri)) == uri


def test_str_omits_a_latest_spec() -> None:
    assert str(parse_resource_uri("resource://tools/x@latest")) == "resource://tools/x"
    assert str(parse_resource_uri("resource://tools/x@*")) == "resource://tools/x"
    assert str(ResourceRef("knowledge", "k", VersionSpec.parse(None))) == "resource://knowledge/k"


def test_pinned_and_unversioned() -> None:
    ref = parse_resource_uri("resource://sandboxes/py@^1.2")
    assert ref.unversioned == "resource://sandboxes/py"
    assert ref.pinned("1.4.0") == "resource://sandboxes/py@1.4.0"
    assert ref.pinned(" 1.4.0+build.7 ") == "resource://sandboxes/py@1.4.0"
    assert ref.pinned(Version(1, 4, 0, ("rc", 1))) == "resource://sandboxes/py@1.4.0-rc.1"
    assert parse_resource_uri(ref.pinned("1.4.0")).spec.exact == Version(1, 4, 0)
    with pytest.raises(ValueError, match=r"version '1\.4': expected MAJOR\.MINOR\.PATCH"):
        ref.pinned("1.4")


def test_ref_is_a_value() -> None:
    a = parse_resource_uri("resource://tools/x@^1")
    assert a == ResourceRef("tool", "x", VersionSpec.parse("^1"))
    assert len({a, parse_resource_uri("resource://tools/x@^1")}) == 1


def test_ref_checks_its_fields() -> None:
    with pytest.raises(ValueError) as info:
        ResourceRef("tools", "x", VersionSpec.parse(None))
    assert str(info.value) == "resource kind 'tools': expected one of prompt, tool, sandbox, agent, knowledge"
    with pytest.raises(ValueError) as info:
        ResourceRef("tool", "X", VersionSpec.parse(None))
    assert str(info.value) == f"resource name 'X': expected {NAME_RULE}"


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("", "empty"),
        ("   ", "empty"),
        (" resource://tools/x", "leading or trailing whitespace"),
        ("resource://tools/x\n", "leading or trailing whitespace"),
        (
            "http://tools/x",
            "must start with 'resource://': resource://<kind>/<name>[@<version spec>], e.g. resource://prompts/sales@^1.2",
        ),
        (
            "RESOURCE://tools/x",
            "must start with 'resource://': resource://<kind>/<name>[@<version spec>], e.g. resource://prompts/sales@^1.2",
        ),
        (
            "resource:/tools/x",
            "must start with 'resource://': resource://<kind>/<name>[@<version spec>], e.g. resource://prompts/sales@^1.2",
        ),
        ("resource://", "missing the kind: expected resource://<kind>/<name>"),
        ("resource:///x", "missing the kind: expected resource://<kind>/<name>"),
        ("resource://widgets/x", f"unknown kind 'widgets': expected one of {KINDS}"),
        ("resource://prompt/x", f"unknown kind 'prompt' (did you mean 'prompts'?): expected one of {KINDS}"),
        ("resource://sandbox/x", f"unknown kind 'sandbox' (did you mean 'sandboxes'?): expected one of {KINDS}"),
        ("resource://knowledges/x", f"unknown kind 'knowledges' (did you mean 'knowledge'?): expected one of {KINDS}"),
        ("resource://Tools/x", f"unknown kind 'Tools': expected one of {KINDS}"),
        ("resource://tools", "missing the name: expected resource://tools/<name>"),
        ("resource://tools/", "missing the name: expected resource://tools/<name>"),
        ("resource://tools/@1.0.0", "missing the name: expected resource://tools/<name>"),
        ("resource://tools/Web-Search", f"bad name 'Web-Search': expected {NAME_RULE}"),
        ("resource://tools/-x", f"bad name '-x': expected {NAME_RULE}"),
        ("resource://tools/web search", f"bad name 'web search': expected {NAME_RULE}"),
        ("resource://tools/" + "a" * 101, f"bad name {'a' * 101!r}: expected {NAME_RULE}"),
        ("resource://tools/x?v=1", f"bad name 'x?v=1': expected {NAME_RULE}"),
        ("resource://tools/x/y", "unexpected path after the name: '/y' (resource://<kind>/<name> has two segments)"),
        ("resource://tools/x/", "unexpected path after the name: '/' (resource://<kind>/<name> has two segments)"),
        (
            "resource://tools/x/y/z@1",
            "unexpected path after the name: '/y/z' (resource://<kind>/<name> has two segments)",
        ),
        ("resource://tools/x@", "empty version spec after '@' (omit the '@' for the latest version)"),
        ("resource://tools/x@ ", "leading or trailing whitespace"),
        ("resource://tools/x@^x", "version spec '^x': '^' needs a version number (e.g. ^1.2.0)"),
        ("resource://tools/x@v1.0.0", "version spec 'v1.0.0': no leading 'v' (write '1.0.0')"),
        ("resource://tools/x@1.0.0@2", "version spec '1.0.0@2': patch '0@2' is not a number (nor x or *)"),
    ],
)
def test_parse_errors(uri: str, problem: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_resource_uri(uri)
    assert str(info.value) == f"resource URI {uri!r}: {problem}"


def test_parse_refuses_a_non_string() -> None:
    with pytest.raises(TypeError):
        parse_resource_uri(None)  # type: ignore[arg-type]


def test_names() -> None:
    for good in ("a", "0", "web-search", "python3.12", "a_b", "a..b", "a" * 100):
        assert is_valid_name(good) and NAME_PATTERN.match(good)
    for bad in ("", "A", "-a", ".a", "_a", "a b", "a/b", "é", "a" * 101, "a\n", None, 3):
        assert not is_valid_name(bad)


def test_is_resource_uri() -> None:
    assert is_resource_uri("resource://tools/x")
    assert is_resource_uri("resource://nonsense")  # a reference, not necessarily a valid one
    for value in ("http://x", " resource://tools/x", "see resource://tools/x", None, 1, ["resource://tools/x"]):
        assert not is_resource_uri(value)


def test_find_references_in_a_nested_definition() -> None:
    definition = {
        "name": "sales",
        "systemPrompt": "resource://prompts/sales-assistant@^1.2",
        "description": "uses resource://tools/not-a-reference inside prose",
        "tools": [
            "resource://tools/web-search",
            {"name": "crm", "ref": "resource://tools/crm@~2.0", "options": {"retries": 3, "enabled": True}},
            "resource://tools/web-search",  # again: listed once
        ],
        "sandbox": {"image": "resource://sandboxes/python@1.x", "env": {"A": "b"}},
        "resource://tools/as-a-key": "keys are not values",
        "knowledge": [["resource://knowledge/pricing"], ("resource://knowledge/faq@1.0.0",)],
        "subAgents": [{"agent": "resource://agents/researcher@2.0.0", "prompt": "resource://prompts/sales-assistant@^1.2"}],
        "nothing": None,
        "number": 1.5,
        "bad": "resource://widgets/still-found",
    }
    assert find_references(definition) == [
        "resource://prompts/sales-assistant@^1.2",
        "resource://tools/web-search",
        "resource://tools/crm@~2.0",
        "resource://sandboxes/python@1.x",
        "resource://knowledge/pricing",
        "resource://knowledge/faq@1.0.0",
        "resource://agents/researcher@2.0.0",
        "resource://widgets/still-found",
    ]


def test_find_references_of_simple_values() -> None:
    assert find_references("resource://tools/x") == ["resource://tools/x"]
    assert find_references("tools/x") == []
    assert find_references(None) == []
    assert find_references(42) == []
    assert find_references([]) == []
    assert find_references({}) == []
    # the same tool at two versions are two references
    assert find_references(["resource://tools/x@1", "resource://tools/x@2"]) == ["resource://tools/x@1", "resource://tools/x@2"]


def test_find_references_in_a_deep_document() -> None:
    value: object = "resource://tools/deep"
    for _ in range(100_000):
        value = [value]
    assert find_references(value) == ["resource://tools/deep"]
