"""The GPU check's CPU rehearsal (``scripts/gpu_check.sh OUT --rehearse``), so the one prepared
command for a GPU lease cannot rot between leases: a bundle built from this checkout is
installed into a fresh target and every step's plumbing runs (the probe with its CUDA checks
skipped, the GPU test files collected, the benchmarks' smoke modes), down to the summary. The
bundle for the device itself (``make gpu-bundle``) needs an index; its size and contents are
checked against the requirements file here without one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gpu_bundle
import gpu_check
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def project_bundle(tmp_path_factory) -> Path:
    """omnibert's wheel alone, for this Python (the rest is installed here already)."""
    dest = tmp_path_factory.mktemp("bundle")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert (
        gpu_bundle.main(["--project-only", "--dest", str(dest), "--python-version", version]) == 0
    )
    return dest


def test_the_rehearsal_runs_every_step_and_writes_the_summary(project_bundle, tmp_path) -> None:
    out = tmp_path / "out"
    # one OpenMP thread a step, as the suite's other subprocesses: the benchmarks' smoke runs
    # are tiny, and two threads a process on a machine the test workers share spin-wait
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out), "--rehearse",
         "--bundle", str(project_bundle), "--deadline", "400"],
        cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == gpu_check.DEFAULT_STEPS
    assert all(s["status"] == "ok" for s in steps), steps
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["mode"] == "rehearsal (CPU)"
    by_step = {e["step"]: e for e in summary["steps"]}
    probe = by_step["probe"]["findings"]["probe"]
    # omnibert came from the bundle's wheel in the target, not from this checkout
    assert "/site/omnibert" in probe["versions"]["detail"]["omnibert"]
    assert probe["triton kernel"]["status"] == "skipped"  # CUDA checks, without CUDA
    assert probe["LAMB step per implementation"]["status"] == "ok"
    # the focus files' gpu-marked tests were collected, each file in its own process
    log = (out / "steps.log").read_text()
    collected = {line.split("::")[0] for line in log.splitlines() if line.startswith("tests/")}
    assert collected == set(gpu_check.FOCUS_TESTS)
    assert by_step["gpu-tests"]["findings"]["collected"] >= 15
    # bench-ablate: the first line against Hugging Face on the same sequences, the variants
    # alone against it; each side profiled
    first, *variants = by_step["bench-ablate"]["findings"]["results"]["cases"]
    assert first["same_sequences"]["how"].startswith("the sequences of omnibert's packed rows")
    assert "profile" in first["hf"] and first["omnibert"]["profile"]["shares"]
    assert [c["options"] for c in variants] == [
        "attention varlen, batch 8, update micro, peer none"
    ]
    assert all("hf" not in c and c["ratio_to_first_case"] > 0 for c in variants)
    assert variants[0]["micro_batch"] == 8 and variants[0]["update"] == "micro"
    # fp8-pair: both curves over the same steps, the tolerance stated, a verdict
    pair = by_step["fp8-pair"]["findings"]["results"]
    assert pair["status"] == "done" and pair["emulate"] is True
    assert len(pair["bf16"]["loss"]) == len(pair["fp8"]["loss"]) == pair["steps_run"]
    assert pair["comparison"]["verdict"] in ("pass", "fail", "inconclusive")
    # bench-modern: ModernBERT against ModernBertForMaskedLM on the same sequences
    (modern,) = by_step["bench-modern"]["findings"]["results"]["cases"]
    assert modern["model"] == "modern_tiny" and modern["hf"]["real_tokens_per_sec"] > 0
    # bench-lamb: timed, its record returned
    assert by_step["bench-lamb"]["findings"]["results"]["status"] == "done"
    # what comes back from a lease: the records' JSON (no figures), at most 8 files in all
    records = {p.name for p in (out / "records").iterdir()}
    assert records == {
        "ablate-gpu-tiny-smoke.json", "fp8-fp8-tiny-seq32-smoke.json",
        "modern-gpu-modern_tiny-smoke.json", "lamb-lamb-tiny.json",
    }, records  # fmt: skip
    assert set(summary["records"]) == {name.removesuffix(".json") for name in records}
    assert json.loads((out / "records" / "lamb-lamb-tiny.json").read_text())["figure"] is None
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(p.relative_to(out).parts) <= 2 for p in files), files
    printed = done.stdout.splitlines()
    assert printed[-1].strip() and any(line.startswith("gpu_check: rehearsal") for line in printed)
    assert any("x" in line and "the first line" in line for line in printed)


def _check(tmp_path: Path, deadline: float) -> gpu_check.Check:
    work = tmp_path / "work"
    work.mkdir()
    return gpu_check.Check(tmp_path, work, tmp_path, tmp_path / "site", True, deadline,
                           env={"PATH": "/usr/bin:/bin"})  # fmt: skip


def test_a_step_past_its_cap_is_killed_and_the_next_one_still_runs(tmp_path) -> None:
    check = _check(tmp_path, deadline=100)
    sleeper = gpu_check.Step("slow", 1, lambda c: [gpu_check.Command("sleep", ["sleep", "60"])])
    start = time.monotonic()
    entry = gpu_check.run_step(check, sleeper)
    assert entry["status"] == "timeout" and entry["timed_out"] == ["sleep"]
    assert time.monotonic() - start < 30  # killed at its cap, not waited for
    quick = gpu_check.Step("quick", 10, lambda c: [gpu_check.Command("true", ["true"])])
    assert gpu_check.run_step(check, quick)["status"] == "ok"
    failing = gpu_check.Step("failing", 10, lambda c: [gpu_check.Command("false", ["false"])])
    assert gpu_check.run_step(check, failing)["status"] == "failed"


def test_a_step_is_skipped_when_the_deadline_leaves_too_little(tmp_path) -> None:
    check = _check(tmp_path, deadline=gpu_check.RESERVE_S + gpu_check.MIN_STEP_S - 1)
    step = gpu_check.Step("any", 60, lambda c: [gpu_check.Command("true", ["true"])])
    entry = gpu_check.run_step(check, step)
    assert entry["status"] == "skipped" and "left before the deadline" in entry["detail"]


def test_a_stale_omnibert_wheel_is_rebuilt_from_the_checkout(project_bundle, tmp_path) -> None:
    stale = tmp_path / "stale"
    shutil.copytree(project_bundle, stale)
    manifest = json.loads((stale / "bundle.json").read_text())
    manifest["project_digest"] = "0" * 64  # built from other files
    (stale / "bundle.json").write_text(json.dumps(manifest))
    for wheel in stale.glob("omnibert-*.whl"):
        wheel.write_bytes(b"not this checkout's wheel")
    target = tmp_path / "site"
    assert gpu_check.install_bundle(stale, target) == 0
    assert (target / "omnibert" / "conf").is_dir()  # the package with its configs


#: what a GPU check imports: the apps and the training pipeline, the GPU plugin and kernels, the
#: GPU test files and the benchmarks
GPU_PATH_MODULES = (
    "omnibert.apps.train", "omnibert.apps.compose", "omnibert.run.pretraining.job",
    "omnibert.tasks.pretraining", "omnibert.data.datamodule", "omnibert.accelerators.gpu",
    "omnibert.checkpoints.saving", "omnibert.callbacks.throughput", "omnibert.optim",
    "omnibert.accelerators.float8", "torchao.float8",  # trainer.precision=fp8 (lazy import)
    "omnibert_kernels.lamb_triton", "omnibert_kernels.lamb_triton_jit",
    "test_gpu", "test_fp8_gpu", "test_attention", "test_lamb_triton", "test_lamb_sharded",
    "dynamo_counts", "bench_gpu", "bench_fp8", "bench_lamb", "gpu_probe",
    "transformers.models.bert.modeling_bert",
)  # fmt: skip

#: run with ``-X importtime`` (the import tree on stderr): prints each module's distribution
# each distribution's name read once and its module files joined as strings (a Path and a
# metadata read per file took 25 s over the development environment's 74,000 files)
_MODULE_OWNERS = """
import importlib, json, os, sys
from importlib.metadata import distributions
for name in sys.argv[1:]:
    importlib.import_module(name)
owner = {}
for dist in distributions():
    files = dist.files or []
    if files:
        base, name = str(dist.locate_file("")), dist.metadata["Name"]
        for f in map(str, files):
            if f.endswith((".py", ".so")):
                owner[os.path.normpath(os.path.join(base, f))] = name
print(json.dumps({name: owner.get(getattr(m, "__file__", None) or "")
                  for name, m in list(sys.modules.items())}))
"""


def direct_imports(importtime: str, owners: dict[str, str | None]) -> set[str]:
    """Distributions that our code, or a distribution outside the image, imports.

    ``-X importtime`` lists each module after the modules it imported, one indent shallower;
    a module belongs to the image's side when its distribution is in the image or its nearest
    importer of another distribution is on the image's side (the image's packages bring what
    they import, in their versions there), else to ours."""
    rows = []
    for line in importtime.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            tree = line.rsplit("|", 1)[1]
            rows.append((len(tree) - len(tree.lstrip()), tree.strip()))
    canonical = gpu_bundle.canonical
    image = {canonical(n) for n in gpu_bundle.IMAGE_PACKAGES}
    needed: set[str] = set()
    parents: list[tuple[int, str | None, bool]] = []  # open ancestors: depth, dist, image side
    for depth, module in reversed(rows):
        while parents and parents[-1][0] >= depth:
            parents.pop()
        dist = owners.get(module)
        dist = canonical(dist) if dist else None
        importer = next((p for p in reversed(parents) if p[1] != dist), None)
        image_side = dist in image or (importer is not None and importer[2])
        if dist is not None and not image_side:
            needed.add(dist)
        parents.append((depth, dist, image_side))
    return needed


def _requirements(dist: str, extra: str | None = None) -> set[str]:
    """The distributions ``dist`` (installed here) requires, and those of ``extra``."""
    from importlib.metadata import requires

    found = set()
    for line in requires(dist) or []:
        if "extra ==" not in line or (extra is not None and f'extra == "{extra}"' in line):
            found.add(gpu_bundle.canonical(re.split(r"[\s<>=!~;\[(]", line, maxsplit=1)[0]))
    return found


def test_the_device_bundle_holds_what_the_gpu_path_imports_beyond_the_image() -> None:
    paths = [str(ROOT / "tests" / sub) for sub in ("", "unit", "e2e")] + [str(ROOT / "scripts")]
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", _MODULE_OWNERS, *GPU_PATH_MODULES],
        env={**os.environ, "PYTHONPATH": ":".join(paths)},
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    owners = json.loads(done.stdout.splitlines()[-1])
    needed = direct_imports(done.stderr, owners)
    canonical = gpu_bundle.canonical
    pins = {canonical(p.split("==")[0]) for p in gpu_bundle.requirements()}
    image = {canonical(n) for n in gpu_bundle.IMAGE_PACKAGES}
    missing = needed - image - {"omnibert"} - pins
    assert not missing, f"imported by the GPU path, in neither the image nor the bundle: {missing}"
    # nothing else: each pin is imported at start-up or required by omnibert (with the bench
    # extra: the benchmarks' peers, imported when they run) or by another pin (torchdata is
    # imported when the loaders are built; Lightning: the image's 2.6 is outside omnibert's range)
    required = set().union(*map(_requirements, pins), _requirements("omnibert", "bench"))
    assert pins - needed <= required, pins - needed - required
    assert {"hydra-core", "datasets", "google-crc32c"} <= needed
    assert not pins & {"wandb", "tensorboardx", "mlperf-logging", "pysbd"}


def test_a_test_file_killed_before_its_report_is_read_from_its_verbose_lines() -> None:
    log = "\n".join([
        "tests/e2e/test_gpu.py::test_a[none-auto] PASSED                     [ 10%]",
        "tests/e2e/test_gpu.py::test_b FAILED                                 [ 20%]",
        "tests/e2e/test_gpu.py::test_c ERROR                                  [ 30%]",
        "tests/e2e/test_gpu.py::test_d SKIPPED (needs two GPUs)               [ 40%]",
        "E   assert 1 == 2",
    ])  # fmt: skip
    found = gpu_check.verbose_findings(log)
    assert (found["tests"], found["passed"], found["failed"], found["errors"]) == (4, 1, 1, 1)
    assert found["skipped"] == 1
    assert [f.split(":")[0] for f in found["failures"]] == [
        "tests/e2e/test_gpu.py",
        "tests/e2e/test_gpu.py",
    ]
    assert "test_b: FAILED" in found["failures"][0]


def test_a_test_file_under_xdist_killed_before_its_report_is_read_too() -> None:
    """The H100 lease: tests/e2e/test_gpu.py at its cap, 17 of 18 passed, counted as none."""
    log = "\n".join([
        "tests/e2e/test_gpu.py::test_one_gpu_ddp ",
        "[gw1] [ 22%] PASSED tests/e2e/test_gpu.py::test_one_gpu_ddp ",
        "[gw3] [ 94%] PASSED tests/e2e/test_gpu.py::test_modern_tiny_trains_on_cuda[varlen-local] ",
        "[gw0] [100%] FAILED tests/e2e/test_gpu.py::test_bench_gpu_smoke_on_cuda ",
    ])  # fmt: skip
    found = gpu_check.verbose_findings(log)
    assert (found["tests"], found["passed"], found["failed"]) == (3, 2, 1)
    assert found["failures"][0].startswith(
        "tests/e2e/test_gpu.py::test_bench_gpu_smoke_on_cuda: FAILED"
    )


def test_a_benchmark_killed_before_its_record_is_summarised_from_its_own_json() -> None:
    ours = {"real_tokens_per_sec": 120000.0, "sequences_per_sec": 500.0, "mfu": 0.4,
            "sequences_per_sec_at_histogram_mean": 470.0}  # fmt: skip
    gpu = {"status": "running", "cases": [
        {"model": "large", "seq": 512, "packing": "online", "micro_batch": 32, "omnibert": ours,
         "hf": {"real_tokens_per_sec": 60000.0}, "ratio_sequences_per_sec": 2.0},
        {"model": "large", "seq": 512, "packing": "online", "micro_batch": 32,
         "options": "attention varlen, peer none", "omnibert": ours, "ratio_to_first_case": 1.0},
    ], "skipped": [{"case": "large:512:online"}]}  # fmt: skip
    lines = gpu_check.partial_lines(gpu)
    assert lines[0] == (
        "large seq 512 online: 120,000 real tokens/s, 500.0 seq/s (470.0 at the histogram's "
        "mean), MFU 40.0%, micro batch 32; hf 60,000 real tokens/s, ratio 2.00 on the same "
        "sequences"
    )
    assert lines[1].startswith("large seq 512 online (attention varlen, peer none): 120,000")
    assert "hf" not in lines[1] and lines[1].endswith("x1.00 the first line")
    assert lines[2].startswith("skipped: ")
    lamb = {"ms_per_step": {"triton": 9.0}, "floor_ms": 6.0, "errors": {"foreach": "boom"}}
    assert gpu_check.partial_lines(lamb) == [
        "ms per step {'triton': 9.0}; floor 6.0 ms ()",
        "error foreach: boom",
    ]
