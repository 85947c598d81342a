"""The official FOCUS validator (focus_validator 1.0.0), run from its own virtualenv `<repo>/.venv-focus`
(`make focus-validator`; `make test` builds it).

It exits 0 even when checks fail, so its JUnit XML report is read instead: every check must pass. Its "1.0"
rules still look for five pre-1.0 column names (see `agentvm.services.usage_export`): an export with the 1.0
names is validated with exactly those five checks overridden (`LEGACY_NAME_CHECKS`).
"""

from __future__ import annotations

import csv
import io
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOCUS_VENV = ROOT / ".venv-focus"
VALIDATOR = FOCUS_VENV / "bin" / "focus-validator"
FOCUS_VERSION = "1.0"
TIMEOUT_S = 300
MIN_CHECKS = 100
# focus_validator 1.0.0's checks of pre-1.0 names (Provider, Publisher, InvoiceIssuer, ResourceID; ChargeType
# in SkuPriceId's rule): overridden for the default export, which uses the 1.0 names.
LEGACY_NAME_CHECKS = frozenset({"InvoiceIssuer_Required", "Provider_Required", "Publisher_Required",
                                "ResourceID_Required", "SkuPriceId_Nullable"})


@dataclass
class Report:
    """One focus-validator run: its exit code and output, and the checks of its JUnit XML report."""

    returncode: int
    output: str
    tests: int = 0
    failed: set[str] = field(default_factory=set)
    errored: set[str] = field(default_factory=set)
    skipped: set[str] = field(default_factory=set)

    def problems(self) -> str:
        return f"exit {self.returncode}, failed {sorted(self.failed)}, errored {sorted(self.errored)}\n{self.output}"


def parse_report(returncode: int, output: str, xml_path: Path) -> Report:
    report = Report(returncode, output)
    if not xml_path.exists():
        return report
    root = ET.parse(xml_path).getroot()
    report.tests = int(root.get("tests", "0"))
    for case in root.iter("testcase"):
        name = case.get("name", "").split(" :: ")[0]
        for outcome, bucket in (("failure", report.failed), ("error", report.errored),
                                ("skipped", report.skipped)):
            if case.find(outcome) is not None:
                bucket.add(name)
    # The summary counts must agree with the cases (a failure the cases do not show still fails).
    if int(root.get("failures", "0")) > len(report.failed) or int(root.get("errors", "0")) > len(report.errored):
        report.failed.add("<summary counts more failures than the report lists>")
    return report


def site_packages() -> Path:
    """The validator reads its currency codes from a path relative to the working directory: it runs from
    its site-packages."""
    found = sorted(FOCUS_VENV.glob("lib/python3*/site-packages/focus_validator"))
    if not found:
        pytest.fail(f"focus_validator is not installed in {FOCUS_VENV}: run `make focus-validator`")
    return found[-1].parent


def validator_cwd() -> Path:
    """The directory to run the validator from; fails the test (never skips) if .venv-focus is missing."""
    if not VALIDATOR.exists():
        pytest.fail(f"the FOCUS validator is missing: {VALIDATOR} does not exist. "
                    "Run `make focus-validator` (`make test` builds it) to create .venv-focus.")
    return site_packages()


def write_override(path: Path, checks: frozenset[str] = LEGACY_NAME_CHECKS) -> Path:
    """A validator override file skipping `checks`."""
    path.write_text("overrides:\n" + "".join(f"  - {check}\n" for check in sorted(checks)))
    return path


def start_validator(data: Path, xml_path: Path, *, cwd: Path, override: Path | None = None) -> subprocess.Popen[str]:
    """Start the validator on `data` (FOCUS 1.0), writing its JUnit XML report to `xml_path`."""
    args = [str(VALIDATOR), "--data-file", str(data), "--validate-version", FOCUS_VERSION,
            "--output-type", "unittest", "--output-destination", str(xml_path)]
    if override is not None:
        args += ["--override-file", str(override)]
    return subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish_validator(proc: subprocess.Popen[str], xml_path: Path) -> Report:
    """Wait for a run started by `start_validator` and read its report (a run that hangs is killed)."""
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return parse_report(proc.returncode, output, xml_path)


def clean_problems(report: Report, *, skipped: frozenset[str] = frozenset()) -> list[str]:
    """Why `report` is not a clean pass (empty if it is): exit 0, at least `MIN_CHECKS` checks run, none failed
    or errored, exactly `skipped` skipped, and no failure or traceback in the output."""
    if report.returncode != 0:
        return [report.problems()]
    if report.tests < MIN_CHECKS:
        return [f"the validator ran {report.tests} checks: no 1.0 rule set?\n{report.output}"]
    if report.failed or report.errored:
        return [report.problems()]
    if report.skipped != skipped:
        return [f"skipped {sorted(report.skipped)}, expected {sorted(skipped)}: {report.problems()}"]
    if "Traceback" in report.output or "failed" in report.output.lower():
        return [report.output]
    return []


def assert_clean(report: Report, *, skipped: frozenset[str] = frozenset()) -> None:
    problems = clean_problems(report, skipped=skipped)
    assert not problems, "\n".join(problems)


def assert_valid_focus(csv_text: str, path: Path) -> list[dict[str, str]]:
    """Write `csv_text` to `path`, have the validator accept it as FOCUS 1.0 (with the 1.0 names, i.e. with
    `LEGACY_NAME_CHECKS` overridden) or fail the test with its problems, and return the CSV's rows."""
    cwd = validator_cwd()
    path.write_text(csv_text)
    override = write_override(path.with_name(f"{path.stem}.legacy-names.yaml"))
    xml_path = path.with_name(f"{path.stem}.validator.xml")
    try:
        report = finish_validator(start_validator(path, xml_path, cwd=cwd, override=override), xml_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the FOCUS validator did not finish on {path} within {TIMEOUT_S}s")
    problems = clean_problems(report, skipped=LEGACY_NAME_CHECKS)
    if problems:
        pytest.fail(f"the FOCUS validator rejects {path}:\n" + "\n".join(problems))
    return list(csv.DictReader(io.StringIO(csv_text)))
