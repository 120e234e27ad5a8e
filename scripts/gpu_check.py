"""The one prepared GPU check: ``scripts/gpu_check.sh OUT`` (``make gpu-check``).

Made for a GPU machine lent for minutes, without network (docs/accelerators/gpu.md): it
installs the wheel bundle (``make gpu-bundle``: ``.gpu-bundle/``, copied there with the
checkout) into a target directory with ``--no-index --no-deps``, then runs its steps under one
shared deadline (``--deadline``, 450 s by default), each with its own cap. A step that fails
or runs out of time never stops the next. What comes back, all under ``OUT``:

* ``steps.jsonl``: one line per step (name, status, seconds, cap, its commands' exit codes);
* ``steps.log``: every command's output, step after step;
* ``junit.xml``: the test steps' JUnit reports in one file;
* ``records/``: the benchmarks' records (JSON and SVG, as ``docs/benchmarks/`` keeps them);
* ``summary.json``: the steps, the probe's findings, test counts and failures, the benchmark
  figures; the same summary is printed last.

Steps, most important first (the default list; every step can be named in ``--steps``):
``install``; ``probe`` (``scripts/gpu_probe.py``: versions, ``nvidia-smi``, compiler, a Triton
kernel, ``torch.compile``, varlen attention, LAMB per implementation, the bandwidth and
matrix-product ceilings); ``gpu-tests`` (``--tests focus``, the default: the GPU tests of the
newest work, :data:`FOCUS_TESTS`; ``--tests all``: every test file with ``gpu``-marked tests;
each file in its own process so a broken CUDA context stays in its file, all at once);
``bench-ablate`` (``scripts/bench_gpu.py`` on BERT-large seq 512 packed: today's settings
against Hugging Face on the same sequences, then one variant a line, omnibert alone: varlen
attention, the whole model compiled, CUDA graphs, fp8, micro batch 64 and probed, LAMB per
micro batch, all together; then unpacked and phase 1 (BERT-base seq 128); each profiled);
``fp8-pair`` (``scripts/bench_fp8.py --lease``: the same steps in bf16 and fp8 from the same
weights and batches, both loss curves against a tolerance stated before the run);
``bench-modern`` (ModernBERT-base seq 1024 packed against ``ModernBertForMaskedLM`` on the same
sequences); ``bench-lamb`` (``scripts/bench_lamb.py --device cuda``, the floor at the probe's
copy bandwidth). ``bench-gpu`` (``bench_gpu.py --lease``: three cases against Hugging Face) is
there to be named.

``--rehearse`` runs the same plumbing on a CPU (the default suite does, so the check cannot
rot between leases): the same install, the probe with its CUDA checks skipped, the GPU test
files collected instead of run, the benchmarks' CPU smoke modes.

Standard library only: it starts before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
DEFAULT_BUNDLE = ROOT / ".gpu-bundle"
#: kept back from the deadline for the summary
RESERVE_S = 5.0
#: a step is skipped when less than this is left
MIN_STEP_S = 15.0


@dataclass
class Command:
    label: str
    argv: list[str]
    #: a JUnit report this command writes (test steps)
    junit: Path | None = None


@dataclass
class Step:
    name: str
    cap_s: float
    commands: Callable[[Check], list[Command]]
    #: run after the commands, with their exit codes; returns findings for the summary
    collect: Callable[[Check, list[int]], dict[str, Any]] | None = None


@dataclass
class Check:
    out: Path
    work: Path
    bundle: Path
    target: Path
    rehearse: bool
    deadline_s: float
    #: ``bench_gpu.py --cases`` instead of the lease's own order
    bench_gpu_cases: str | None = None
    #: pytest-xdist workers per GPU test file (0: one process per file)
    test_workers: int = 0
    #: ``focus`` (:data:`FOCUS_TESTS`) or ``all`` (every file with gpu-marked tests)
    tests: str = "focus"
    #: the cap of the step whose commands are being built (their own deadlines stay inside)
    step_cap_s: float = float("inf")
    start: float = field(default_factory=time.monotonic)
    env: dict[str, str] = field(default_factory=dict)

    def left(self) -> float:
        return self.deadline_s - (time.monotonic() - self.start)

    @property
    def python(self) -> str:
        return sys.executable


# ----------------------------------------------------------------------------- install


def _install(check: Check) -> list[Command]:
    return [Command("install", [check.python, str(Path(__file__)), "--install-only",
                                "--bundle", str(check.bundle), "--target", str(check.target)])]  # fmt: skip


def install_bundle(bundle: Path, target: Path) -> int:
    """Install every wheel of the bundle into ``target`` (no index, no dependencies); an
    omnibert wheel built from other files than this checkout is rebuilt here first."""
    manifest_file = bundle / "bundle.json"
    if not manifest_file.is_file():
        print(f"install: {manifest_file} is missing; build the bundle with `make gpu-bundle`")
        return 2
    manifest = json.loads(manifest_file.read_text())
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if manifest["python_version"] != here:
        print(f"install: the bundle is for Python {manifest['python_version']}, this is {here}")
        return 2
    sys.path.insert(0, str(SCRIPTS))
    import gpu_bundle

    wheels = [bundle / p["file"] for p in manifest["packages"]]
    if gpu_bundle.project_digest() != manifest["project_digest"]:
        print("install: the bundle's omnibert wheel was built from other files than this "
              "checkout; building omnibert's wheel here (make gpu-bundle avoids this)")  # fmt: skip
        fresh = Path(tempfile.mkdtemp(prefix="omnibert-wheel-"))
        wheels = [w for w in wheels if not w.name.startswith("omnibert-")]
        wheels.append(gpu_bundle.wheelhouse.build_project_wheel(fresh, fresh, isolated=False))
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--disable-pip-version-check", "--upgrade", "--target", str(target),
           *map(str, wheels)]  # fmt: skip
    done = subprocess.run(cmd, check=False)
    print(f"install: {len(wheels)} wheels into {target}: pip exit {done.returncode}")
    return done.returncode


# ----------------------------------------------------------------------------- probe


def _probe(check: Check) -> list[Command]:
    return [Command("probe", [check.python, str(SCRIPTS / "gpu_probe.py"),
                              "--json", str(check.work / "probe.json")])]  # fmt: skip


def _probe_findings(check: Check, codes: list[int]) -> dict[str, Any]:
    path = check.work / "probe.json"
    return {"probe": json.loads(path.read_text())} if path.is_file() else {}


# ----------------------------------------------------------------------------- tests


def gpu_test_files() -> list[Path]:
    """Test files that hold ``gpu``-marked tests (a new one joins the check by itself)."""
    marker = re.compile(r"pytest\.mark\.gpu\b")
    return sorted(p for p in (ROOT / "tests").glob("test_*.py") if marker.search(p.read_text()))


#: ``--tests focus``: the GPU tests of the newest work, file -> a pytest ``-k`` expression
#: (``None``: the whole file). Every ``-m gpu`` test passed on an H100 and an H200 before it;
#: a lease spends its minutes on what it has not run yet, then on speed.
FOCUS_TESTS: dict[str, str | None] = {
    "tests/test_fp8_gpu.py": None,  # fp8: compiled real fp8 against bf16, the refusal
    "tests/test_gpu_step.py": None,  # CUDA graphs with accumulation, no sync, the probe
    "tests/test_one_graph.py": None,  # the pretraining step as one graph on CUDA
    # the Triton LAMB's bitwise resume, bench_gpu --smoke on CUDA (same sequences, rounds)
    "tests/test_gpu.py": "(resume_is_bitwise and triton) or bench_gpu",
}


def selected_tests(check: Check) -> list[tuple[Path, str | None]]:
    """The test files the check runs and each one's ``-k`` (``--tests``)."""
    if check.tests == "all":
        return [(path, None) for path in gpu_test_files()]
    return [(ROOT / name, expression) for name, expression in FOCUS_TESTS.items()]


def _tests(check: Check) -> list[Command]:
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


def _test_findings(check: Check, codes: list[int]) -> dict[str, Any]:
    """Counts in total and per file, each file's from its JUnit report or, for a file killed
    before it wrote one, from its ``-v`` lines (``source`` says which)."""
    if check.rehearse:
        text = (check.work / "gpu-tests.log").read_text(errors="replace")
        return {"collected": _collected(text), "exit_codes": codes}
    parts: dict[str, dict[str, Any]] = {}
    for command in _tests(check):
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


# ----------------------------------------------------------------------------- benchmarks


def _records(check: Check) -> Path:
    """Where the benchmarks write their records (JSON and SVG): the work folder. The check
    copies the JSONs into ``OUT/records`` at its end (:func:`return_records`): a lease returns
    at most eight files."""
    return check.work / "records"


def _bench_lamb(check: Check) -> list[Command]:
    argv = [check.python, str(SCRIPTS / "bench_lamb.py"), "--json", str(check.work / "bench_lamb.json"),
            "--results-dir", str(_records(check))]  # fmt: skip
    argv += ["--smoke"] if check.rehearse else ["--device", "cuda", "--lease"]
    probe = check.work / "probe.json"
    if not check.rehearse and probe.is_file():  # the floor at the probe's copy bandwidth
        argv += ["--bandwidth-from", str(probe)]
    return [Command("bench_lamb", argv)]


def bench_deadline(check: Check) -> float:
    """The seconds a benchmark of this step may plan for: what its cap and the check's
    deadline leave, less a margin for its record (it skips what would not fit)."""
    return max(min(check.step_cap_s, check.left() - RESERVE_S) - 10, 20)


def _bench_gpu_argv(check: Check, name: str) -> list[str]:
    """``bench_gpu.py --lease --profile`` (``--smoke`` in the rehearsal) writing its JSON to
    ``bench_<name>.json`` in the work folder, within its step's time."""
    deadline = bench_deadline(check)
    argv = [check.python, str(SCRIPTS / "bench_gpu.py"), "--json", str(check.work / f"bench_{name}.json"),
            "--results-dir", str(_records(check)), "--deadline", f"{deadline:.0f}", "--lease",
            "--profile"]  # fmt: skip
    return argv + (["--smoke"] if check.rehearse else [])


def _bench_gpu(check: Check) -> list[Command]:
    argv = _bench_gpu_argv(check, "gpu")
    if check.bench_gpu_cases:
        argv += ["--cases", check.bench_gpu_cases]
    return [Command("bench_gpu", argv)]


#: ``bench-ablate``: BERT-large seq 512 packed with the Wikipedia lengths as the last lease ran
#: it (SDPA, each layer compiled) against Hugging Face on the same sequences, then one change a
#: line (omnibert alone, each against the first line), all of them together, then unpacked
#: and phase 1; most important first (the deadline skips from the end)
_PACKED = "large:512:online:wiki:attention=sdpa:scope=layers"
ABLATE_CASES = ",".join(
    [
        _PACKED,
        "large:512:online:wiki:attention=varlen:scope=layers:peer=none",
        "large:512:online:wiki:attention=sdpa:scope=model:peer=none",
        f"{_PACKED}:graphs=on:peer=none",
        f"{_PACKED}:precision=fp8:peer=none",
        f"{_PACKED}:batch=64:peer=none",
        f"{_PACKED}:batch=probe:peer=none",
        f"{_PACKED}:update=micro:peer=none",
        # all together: varlen and CUDA graphs exclude each other (data-dependent shapes)
        "large:512:online:wiki:attention=varlen:scope=model:precision=fp8:peer=none",
        "large:512:online:wiki:attention=sdpa:scope=model:graphs=on:precision=fp8:peer=none",
        "large:512:none:attention=varlen:scope=layers",
        "base:128:none:scope=layers",
        "base:128:none:scope=model:graphs=on:peer=none",
    ]
)
#: the rehearsal's: the same keys on the tiny model on a CPU (no CUDA graphs, no fp8)
REHEARSE_ABLATE_CASES = (
    "tiny:32:online,tiny:32:online:attention=varlen:batch=8:update=micro:peer=none"
)


def _bench_ablate(check: Check) -> list[Command]:
    argv = _bench_gpu_argv(check, "ablate")
    argv += ["--cases", REHEARSE_ABLATE_CASES if check.rehearse else ABLATE_CASES]
    return [Command("bench_ablate", argv)]


#: ``bench-modern``: ModernBERT-base (conf/model/modernbert_base.yaml) at seq 1024, packed with
#: the Wikipedia lengths, against ModernBertForMaskedLM on the same sequences
MODERN_CASES = "modernbert_base:1024:online:wiki:scope=layers"
REHEARSE_MODERN_CASES = "modern_tiny:64:online"


def _bench_modern(check: Check) -> list[Command]:
    argv = _bench_gpu_argv(check, "modern")
    argv += ["--cases", REHEARSE_MODERN_CASES if check.rehearse else MODERN_CASES]
    return [Command("bench_modern", argv)]


def _fp8_pair(check: Check) -> list[Command]:
    """``bench_fp8.py --lease`` (``--smoke`` in the rehearsal: emulated fp8 on the CPU)."""
    deadline = bench_deadline(check)
    argv = [check.python, str(SCRIPTS / "bench_fp8.py"), "--json", str(check.work / "bench_fp8.json"),
            "--results-dir", str(_records(check)), "--deadline", f"{deadline:.0f}"]  # fmt: skip
    return [Command("bench_fp8", argv + (["--smoke"] if check.rehearse else ["--lease"]))]


def _bench_findings(name: str, prefix: str) -> Callable[[Check, list[int]], dict[str, Any]]:
    """The benchmark's own JSON, which it rewrites after every case or stage (what finished
    before a kill at the cap is kept too), and the headline and tables of the records it
    wrote at its end whose names start with ``prefix``."""

    def collect(check: Check, codes: list[int]) -> dict[str, Any]:
        found: dict[str, Any] = {"records": {}}
        for path in sorted(_records(check).glob(f"{prefix}*.json")):
            record = json.loads(path.read_text())
            if record.get("command", "").find(f"bench_{name}.json") < 0:
                continue  # another step's record of the same script
            found["records"][path.stem] = {"headline": record.get("headline"),
                                           "tables": record.get("tables")}  # fmt: skip
        partial = check.work / f"bench_{name}.json"
        if partial.is_file():
            found["results"] = json.loads(partial.read_text())
        return found

    return collect


def return_records(check: Check) -> list[str]:
    """Each step's records into ``OUT/records`` as ``<step's json stem>-<record>.json``, the
    figure left behind (``"figure": null``; a lease returns at most eight files: the four of
    the check and these); the names copied."""
    dest = check.out / "records"
    copied = []
    for path in sorted(_records(check).glob("*.json")):
        record = json.loads(path.read_text())
        step = re.search(r"bench_(\w+)\.json", record.get("command", ""))
        name = f"{step.group(1)}-{path.stem}" if step else path.stem
        record["figure"] = None
        dest.mkdir(parents=True, exist_ok=True)
        (dest / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
        copied.append(name)
    return copied


STEPS = [
    Step("install", 90, _install),
    Step("probe", 120, _probe, _probe_findings),
    Step("gpu-tests", 150, _tests, _test_findings),
    Step("bench-ablate", 170, _bench_ablate, _bench_findings("ablate", "gpu-")),
    Step("fp8-pair", 110, _fp8_pair, _bench_findings("fp8", "fp8")),
    Step("bench-modern", 60, _bench_modern, _bench_findings("modern", "gpu-")),
    Step("bench-lamb", 30, _bench_lamb, _bench_findings("lamb", "lamb")),
    Step("bench-gpu", 300, _bench_gpu, _bench_findings("gpu", "gpu-")),
]
#: what runs without ``--steps``: all but ``bench-gpu`` (the ablation's first lines hold its
#: comparison with Hugging Face)
DEFAULT_STEPS = [s.name for s in STEPS if s.name != "bench-gpu"]


# ----------------------------------------------------------------------------- running


def run_step(check: Check, step: Step) -> dict[str, Any]:
    """Run a step's commands at once, each until the step's cap or the deadline."""
    left = check.left() - RESERVE_S
    entry: dict[str, Any] = {"step": step.name, "cap_s": step.cap_s}
    if left < MIN_STEP_S:
        return {**entry, "status": "skipped", "seconds": 0.0,
                "detail": f"{left:.0f} s left before the deadline"}  # fmt: skip
    timeout = min(step.cap_s, left)
    check.step_cap_s = timeout
    commands = step.commands(check)
    log_path = check.work / f"{step.name}.log"
    start = time.monotonic()
    with log_path.open("w") as log:
        procs = []
        for command in commands:
            part = check.work / f"{step.name}-{command.label}.log"
            handle = part.open("w")
            proc = subprocess.Popen(command.argv, cwd=ROOT, env=check.env, stdout=handle,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            procs.append((command, proc, handle, part))
        codes, timed_out = [], []
        for command, proc, handle, part in procs:
            try:
                codes.append(proc.wait(timeout=max(timeout - (time.monotonic() - start), 1)))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                codes.append(proc.wait())
                timed_out.append(command.label)
            handle.close()
            log.write(f"===== {step.name} / {command.label}: {' '.join(command.argv)}\n")
            log.write(part.read_text(errors="replace"))
            log.write(f"===== exit {codes[-1]}\n")
    seconds = time.monotonic() - start
    status = "timeout" if timed_out else ("ok" if all(c == 0 for c in codes) else "failed")
    entry.update(status=status, seconds=round(seconds, 1), exit_codes=codes)
    if timed_out:
        entry["timed_out"] = timed_out
    if step.collect is not None:
        try:
            entry["findings"] = step.collect(check, codes)
        except Exception as err:  # a broken report is a finding, not a stop
            entry["findings"] = {"error": repr(err)}
    return entry


def _rate(value: Any, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def case_line(case: dict[str, Any]) -> str:
    """One bench_gpu case in a line: real tokens/s, sequences/s (at the histogram's mean where
    it applies), MFU, against Hugging Face on the same sequences or against the first case."""
    ours = case["omnibert"]
    options = f" ({case['options']})" if case.get("options") else ""
    line = (
        f"{case.get('model')} seq {case['seq']} {case['packing']}{options}: "
        f"{ours['real_tokens_per_sec']:,.0f} real tokens/s, {ours['sequences_per_sec']:.1f} seq/s"
        f" ({_rate(ours.get('sequences_per_sec_at_histogram_mean'), '.1f')} at the histogram's "
        f"mean), MFU {_rate(ours.get('mfu'), '.1%')}, micro batch {case['micro_batch']}"
    )
    if "hf" in case:
        line += (f"; hf {case['hf']['real_tokens_per_sec']:,.0f} real tokens/s, ratio "
                 f"{case['ratio_sequences_per_sec']:.2f} on the same sequences")  # fmt: skip
    if case.get("ratio_to_first_case") is not None:
        line += f"; x{case['ratio_to_first_case']:.2f} the first line"
    return line


def partial_lines(results: dict[str, Any]) -> list[str]:
    """A benchmark's own JSON in a few lines: bench_gpu's cases (one a line, each side's
    profile below it), bench_lamb's ms per step, bench_fp8's verdict."""
    lines = []
    for case in results.get("cases", []):
        lines.append(case_line(case))
        for name in ("omnibert", "hf"):
            prof = (case.get(name) or {}).get("profile")
            if prof:
                shares = ", ".join(f"{k} {v:.0%}" for k, v in sorted(prof["shares"].items(),
                                                                    key=lambda kv: -kv[1]))  # fmt: skip
                busy = "n/a" if prof.get("busy") is None else f"{prof['busy']:.0%}"
                top = prof["top"][0]["name"][:60] if prof.get("top") else "-"
                lines.append(f"  profile {name}: busy {busy} of {prof['wall_seconds'] * 1e3:.0f} ms; "
                             f"{shares}; top {top}")  # fmt: skip
    for key in ("skipped", "failed"):
        lines += [f"{key}: {str(item)[:300]}" for item in results.get(key) or []]
    if "ms_per_step" in results:
        lines.append(f"ms per step {results['ms_per_step']}; floor {results.get('floor_ms')} ms "
                     f"({results.get('floor_bandwidth_source', '')})")  # fmt: skip
        lines += [f"error {k}: {str(v)[:200]}" for k, v in (results.get("errors") or {}).items()]
    if "verdict" in results:
        lines.append(f"fp8 against bf16: {results['verdict']}")
    return lines


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The printed summary: a line per step, then what failed, then the figures."""
    lines = [f"gpu_check: {summary['mode']} on {summary.get('device', '?')}, "
             f"{summary['seconds']:.0f} s of {summary['deadline_s']:.0f}"]  # fmt: skip
    for entry in summary["steps"]:
        lines.append(f"  {entry['step']:<12} {entry['status']:<8} {entry['seconds']:6.1f} s"
                     + (f"  {entry['detail']}" if "detail" in entry else ""))  # fmt: skip
        findings = entry.get("findings", {})
        for name, item in findings.get("probe", {}).items():
            detail = json.dumps(item["detail"])
            lines.append(f"      {name:<50} {item['status']:<7} {detail[:220]}")
        if "tests" in findings:
            lines.append("      tests {tests}: passed {passed}, failed {failed}, errors {errors}, "
                         "skipped {skipped}".format(**findings))  # fmt: skip
            for name, part in findings.get("per_file", {}).items():
                lines.append(f"        {name}: {part['passed']} of {part['tests']} passed "
                             f"({part['source']})")  # fmt: skip
            lines += [f"      FAIL {f}" for f in findings["failures"][:40]]
        if "collected" in findings:
            lines.append(f"      collected {findings['collected']} gpu tests")
        results = findings.get("results") or {}
        if results:
            lines.append(f"      (its JSON as last written: {results.get('status')})")
            lines += ["      " + line for line in partial_lines(results)]
        for name, record in findings.get("records", {}).items():
            lines.append(f"      {name}: {record['headline']}")
    if summary.get("records"):
        lines.append(f"  records in OUT/records: {', '.join(summary['records'])}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="the folder that receives the results")
    parser.add_argument("--deadline", type=float, default=450.0, help="seconds for all steps")
    parser.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE)
    parser.add_argument("--target", type=Path, default=None,
                        help="install the bundle here (default: a new temporary folder)")  # fmt: skip
    parser.add_argument("--rehearse", action="store_true", help="the CPU rehearsal")
    parser.add_argument("--steps", default=",".join(DEFAULT_STEPS),
                        help="comma-separated steps to run, in the check's order (default: "
                             f"{','.join(DEFAULT_STEPS)})")  # fmt: skip
    parser.add_argument("--tests", choices=["focus", "all"], default="focus",
                        help="gpu-tests: the newest work's GPU tests (FOCUS_TESTS) or every "
                             "file with gpu-marked tests")  # fmt: skip
    parser.add_argument(
        "--bench-gpu-cases",
        default=None,
        help="bench_gpu.py --cases for the bench-gpu step (default: the lease's)",
    )
    parser.add_argument(
        "--test-workers",
        type=int,
        default=0,
        help="pytest-xdist workers per GPU test file (default 0: one process "
        "per file, the files at once)",
    )
    parser.add_argument("--cap", action="append", default=[], metavar="STEP=SECONDS",
                        help="another cap for a step (repeatable), e.g. --cap gpu-tests=90")  # fmt: skip
    parser.add_argument("--install-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.install_only:
        return install_bundle(args.bundle, args.target)
    if args.out is None:
        parser.error("the OUT folder is required")
    unknown = set(args.steps.split(",")) - {s.name for s in STEPS}
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; choose from {[s.name for s in STEPS]}")
    caps = {s.name: s.cap_s for s in STEPS}
    for item in args.cap:
        name, _, value = item.partition("=")
        if name not in caps or not value.replace(".", "", 1).isdigit():
            parser.error(f"--cap {item}: give STEP=SECONDS with a step of {list(caps)}")
        caps[name] = float(value)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    target = (args.target or work / "site").resolve()
    check = Check(out, work, args.bundle.resolve(), target, args.rehearse, args.deadline,
                  args.bench_gpu_cases, args.test_workers, args.tests)  # fmt: skip
    paths = [str(target), str(ROOT / "tests"), str(SCRIPTS)]
    check.env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
                 "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
                 "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}  # fmt: skip
    entries = []
    (out / "steps.jsonl").write_text("")
    chosen = [replace(s, cap_s=caps[s.name]) for s in STEPS if s.name in args.steps.split(",")]
    for step in chosen:
        print(
            f"gpu_check: {step.name} (cap {step.cap_s:.0f} s, {check.left():.0f} s left)",
            flush=True,
        )
        entry = run_step(check, step)
        entries.append(entry)
        with (out / "steps.jsonl").open("a") as fh:
            fh.write(json.dumps({k: v for k, v in entry.items() if k != "findings"}) + "\n")
        with (out / "steps.log").open("a") as fh:
            log = work / f"{step.name}.log"
            fh.write(
                log.read_text(errors="replace")
                if log.is_file()
                else f"===== {step.name}: skipped\n"
            )
        print(f"gpu_check: {step.name} {entry['status']} in {entry['seconds']} s", flush=True)
    merge_junit(sorted(work.glob("junit-*.xml")), out / "junit.xml")
    records = return_records(check)
    probe = next((e["findings"]["probe"] for e in entries if "probe" in e.get("findings", {})), {})
    versions = probe.get("versions", {}).get("detail", {})
    summary = {
        "mode": "rehearsal (CPU)" if args.rehearse else "GPU check",
        "device": versions.get("device", "cpu" if args.rehearse else "?"),
        "nvidia-smi": probe.get("nvidia-smi", {}).get("detail"),
        "versions": versions,
        "deadline_s": args.deadline,
        "seconds": round(time.monotonic() - check.start, 1),
        "ok": all(e["status"] == "ok" for e in entries),
        "steps": entries,
        "records": records,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n".join(summary_lines(summary)), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
