"""The ``gpu-tests`` step of ``scripts/gpu_check.py``: which GPU test files run
(:data:`FOCUS_TESTS` or every file with ``gpu``-marked tests), each in its own process, and
what came back (JUnit reports, or the ``pytest -v`` lines of a file killed before its
report). Standard library only."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from gpu_check_run import ROOT, Check, Command


def gpu_test_files() -> list[Path]:
    """Test files that hold ``gpu``-marked tests (a new one joins the check by itself)."""
    marker = re.compile(r"pytest\.mark\.gpu\b")
    return sorted(p for p in (ROOT / "tests").glob("*/test_*.py") if marker.search(p.read_text()))


#: ``--tests focus``: the GPU tests of the newest work, file -> a pytest ``-k`` expression
#: (``None``: the whole file). Every ``-m gpu`` test passed on an H100 and an H200 before it;
#: a lease spends its minutes on what it has not run yet, then on speed.
FOCUS_TESTS: dict[str, str | None] = {
    "tests/e2e/test_fp8_gpu.py": None,  # fp8: compiled real fp8 against bf16, the refusal
    "tests/unit/test_gpu_step.py": None,  # CUDA graphs with accumulation, no sync, the probe
    "tests/unit/test_one_graph.py": None,  # the pretraining step as one graph on CUDA
    # the Triton LAMB's bitwise resume, bench_gpu --smoke on CUDA (same sequences, rounds)
    "tests/e2e/test_gpu.py": "(resume_is_bitwise and triton) or bench_gpu",
}


def selected_tests(check: Check) -> list[tuple[Path, str | None]]:
    """The test files the check runs and each one's ``-k`` (``--tests``)."""
    if check.tests == "all":
        return [(path, None) for path in gpu_test_files()]
    return [(ROOT / name, expression) for name, expression in FOCUS_TESTS.items()]


def gpu_test_commands(check: Check) -> list[Command]:
    commands = []
    for path, expression in selected_tests(check):
        junit = check.work / f"junit-{path.stem}.xml"
        # -v: a line per test as it ends, read back when a file is killed at the cap before
        # pytest writes its JUnit report
        argv = [check.python, "-m", "pytest", "-m", "gpu", "-o", "addopts=-ra",
                "-p", "no:cacheprovider", "-p", "no:xdist", f"--junitxml={junit}",
                str(path.relative_to(ROOT))]  # fmt: skip
        argv += ["-k", expression] if expression else []
        # no CUDA: collect them (imports, parametrisation, markers), one id per line
        argv += ["-q", "--collect-only"] if check.rehearse else ["-v"]
        if check.test_workers and not check.rehearse:
            argv[argv.index("no:xdist") - 1 : argv.index("no:xdist") + 1] = []
            argv += ["-n", str(check.test_workers)]
        commands.append(Command(path.stem, argv, junit))
    return commands


def junit_findings(reports: list[Path]) -> dict[str, Any]:
    """Counts and failures of JUnit reports (pytest's ``--junitxml``)."""
    counts = {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    for report in reports:
        if not report.is_file():
            continue
        for case in ET.parse(report).getroot().iter("testcase"):
            counts["tests"] += 1
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is not None:
                counts["failed" if bad.tag == "failure" else "errors"] += 1
                message = (bad.get("message") or bad.text or "").strip().splitlines()
                failures.append(f"{case.get('classname')}::{case.get('name')}: "
                                f"{message[0][:300] if message else ''}")  # fmt: skip
            elif case.find("skipped") is not None:
                counts["skipped"] += 1
            else:
                counts["passed"] += 1
    return {**counts, "failures": failures}


def merge_junit(reports: list[Path], dest: Path) -> None:
    merged = ET.Element("testsuites")
    for report in reports:
        if report.is_file():
            root = ET.parse(report).getroot()
            suites = [root] if root.tag == "testsuite" else list(root)
            merged.extend(suites)
    ET.ElementTree(merged).write(dest, encoding="utf-8", xml_declaration=True)


def _collected(log: str) -> int:
    """Tests a ``--collect-only -q`` run listed."""
    return sum(1 for line in log.splitlines() if "::" in line and not line.startswith(" "))


# ``pytest -v``: "tests/x.py::test PASSED"; with pytest-xdist: "[gw0] [ 44%] PASSED tests/x.py::test"
_VERBOSE_RESULT = re.compile(r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)")
_XDIST_RESULT = re.compile(
    r"^\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (tests/\S+::\S+)"
)


def verbose_findings(log: str) -> dict[str, Any]:
    """Counts and failing ids from ``pytest -v`` lines (a file killed before its report)."""
    counts = {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    for line in log.splitlines():
        if match := _VERBOSE_RESULT.match(line):
            test, result = match.groups()
        elif match := _XDIST_RESULT.match(line):
            result, test = match.groups()
        else:
            continue
        key = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "errors"}
        counts["tests"] += 1
        counts[key.get(result, "skipped")] += 1
        if result in ("FAILED", "ERROR"):
            failures.append(f"{test}: {result} (killed at the cap: see steps.log)")
    return {**counts, "failures": failures}


def gpu_test_findings(check: Check, codes: list[int]) -> dict[str, Any]:
    """Counts in total and per file, each file's from its JUnit report or, for a file killed
    before it wrote one, from its ``-v`` lines (``source`` says which)."""
    if check.rehearse:
        text = (check.work / "gpu-tests.log").read_text(errors="replace")
        return {"collected": _collected(text), "exit_codes": codes}
    parts: dict[str, dict[str, Any]] = {}
    for command in gpu_test_commands(check):
        if command.junit is not None and command.junit.is_file():
            found = {**junit_findings([command.junit]), "source": "junit"}
        else:
            log = check.work / f"gpu-tests-{command.label}.log"
            found = verbose_findings(log.read_text(errors="replace") if log.is_file() else "")
            found["failures"].append(f"{command.label}: no JUnit report (killed or crashed)")
            found["source"] = "pytest -v lines (no JUnit report: killed at the cap or crashed)"
        parts[command.label] = found
    keys = ("tests", "passed", "failed", "errors", "skipped")
    total: dict[str, Any] = {k: sum(p[k] for p in parts.values()) for k in keys}
    total["failures"] = [f for p in parts.values() for f in p["failures"]]
    total["per_file"] = {name: {k: p[k] for k in (*keys, "source")} for name, p in parts.items()}
    total["selection"] = check.tests
    return total
