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

Standard library only: it starts before anything is installed. Beside it:
:mod:`gpu_check_run` (a step's commands under its cap and the deadline),
:mod:`gpu_check_tests` (the GPU test files and their reports), :mod:`gpu_check_benches` (the
benchmark steps and their records) and :mod:`gpu_check_summary` (the printed summary).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchharness import write_json
from gpu_check_benches import (
    ablate_commands,
    bench_findings,
    fp8_commands,
    gpu_commands,
    lamb_commands,
    modern_commands,
    return_records,
)
from gpu_check_run import MIN_STEP_S, RESERVE_S, ROOT, SCRIPTS, Check, Command, Step, run_step
from gpu_check_summary import partial_lines, summary_lines
from gpu_check_tests import (
    FOCUS_TESTS,
    gpu_test_commands,
    gpu_test_findings,
    merge_junit,
    verbose_findings,
)

__all__ = ["DEFAULT_STEPS", "FOCUS_TESTS", "MIN_STEP_S", "RESERVE_S", "STEPS", "Check",
           "Command", "Step", "install_bundle", "main", "partial_lines", "run_step",
           "summary_lines", "verbose_findings"]  # fmt: skip

DEFAULT_BUNDLE = ROOT / ".gpu-bundle"


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


# ----------------------------------------------------------------------------- the steps


STEPS = [
    Step("install", 90, _install),
    Step("probe", 120, _probe, _probe_findings),
    Step("gpu-tests", 150, gpu_test_commands, gpu_test_findings),
    Step("bench-ablate", 170, ablate_commands, bench_findings("ablate", "gpu-")),
    Step("fp8-pair", 110, fp8_commands, bench_findings("fp8", "fp8")),
    Step("bench-modern", 60, modern_commands, bench_findings("modern", "gpu-")),
    Step("bench-lamb", 30, lamb_commands, bench_findings("lamb", "lamb")),
    Step("bench-gpu", 300, gpu_commands, bench_findings("gpu", "gpu-")),
]
#: what runs without ``--steps``: all but ``bench-gpu`` (the ablation's first lines hold its
#: comparison with Hugging Face)
DEFAULT_STEPS = [s.name for s in STEPS if s.name != "bench-gpu"]


# ----------------------------------------------------------------------------- main


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
    write_json(out / "summary.json", summary)
    print("\n".join(summary_lines(summary)), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
