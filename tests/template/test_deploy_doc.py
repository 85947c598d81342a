"""docs/deploy.md, the operator's guide, against template.yaml: every parameter has one row in its
parameters table with the template's default, no row names a parameter the template lacks, the
outputs the guide tells the operator to read exist, and the guide is linked from where operators look."""

from __future__ import annotations

import re

from tests.template.template_model import ROOT, _template

GUIDE = ROOT / "docs" / "deploy.md"
ROW = re.compile(r"^\| `(?P<name>[A-Za-z0-9]+)` \| (?P<default>[^|]+?) \| (?P<does>[^|]+?) \| (?P<costs>[^|]+?) \|$")


def rows(text: str) -> dict[str, list[dict[str, str]]]:
    """The parameters table's rows by parameter name (a list: a name listed twice is an error)."""
    section = text.split("\n## Parameters\n", 1)[1].split("\n## ", 1)[0]
    found: dict[str, list[dict[str, str]]] = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            found.setdefault(match["name"], []).append(match.groupdict())
    return found


def documented_default(value: object) -> str:
    return "blank" if value in ("", None) else f"`{value}`"


def problems(text: str, parameters: dict[str, dict[str, object]]) -> list[str]:
    table = rows(text)
    found = []
    for name, spec in parameters.items():
        listed = table.get(name, [])
        if not listed:
            found.append(f"{name}: no row in the parameters table of docs/deploy.md")
            continue
        if len(listed) > 1:
            found.append(f"{name}: {len(listed)} rows")
        want = documented_default(spec.get("Default"))
        if listed[0]["default"] != want:
            found.append(f"{name}: the guide says the default is {listed[0]['default']}, the template {want}")
    found += [f"{name}: a row for a parameter the template does not have" for name in table if name not in parameters]
    return found


def test_every_parameter_has_a_row_with_the_templates_default() -> None:
    parameters = _template()["Parameters"]
    assert len(parameters) >= 28
    assert problems(GUIDE.read_text(encoding="utf-8"), parameters) == []


def test_the_check_finds_a_missing_row_a_wrong_default_and_a_stale_row() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    parameters = dict(_template()["Parameters"])
    parameters["NotATemplateParameter"] = {"Type": "String", "Default": ""}
    parameters["LogLevel"] = {**parameters["LogLevel"], "Default": "DEBUG"}
    del parameters["HttpThrottleBurst"]
    assert problems(text, parameters) == [
        "LogLevel: the guide says the default is `INFO`, the template `DEBUG`",
        "NotATemplateParameter: no row in the parameters table of docs/deploy.md",
        "HttpThrottleBurst: a row for a parameter the template does not have",
    ]


def test_the_outputs_the_guide_names_exist_and_the_guide_is_linked() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    outputs = set(_template()["Outputs"])
    table = text.split("| Output | What it is |", 1)[1].split("\n\n", 1)[0]
    named = {name for line in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", line.split(" | ")[0])}
    named |= set(re.findall(r"\$\(out (\w+)\)", text))  # the smoke test's command
    assert {"WebSocketUrl", "HttpApiUrl", "ChatStreamUrl", "TableName", "BucketName"} <= named
    assert named <= outputs, named - outputs
    for page in ("README.md", "docs/cloud-design.md", "infra/README.md"):
        assert "deploy.md" in (ROOT / page).read_text(encoding="utf-8"), page
