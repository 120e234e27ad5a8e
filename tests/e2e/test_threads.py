"""Host threads and bf16 on the CPU (issue 16, points 1 and 11): the thread count comes from
the CPUs this process may use (affinity, cgroup quota) less the cores its loader workers use, an override
is taken as given, the choice and its reason reach the plan; bf16 on a CPU without native
bf16 is refused with the measured reason and the fix. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omnibert import threads
from omnibert.accelerators import cpu_bf16
from omnibert.accelerators.base import AcceleratorError
from omnibert.accelerators.cpu import CPUPlugin
from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_cgroup_v2_quota_is_read_from_the_processs_cgroup(tmp_path):
    proc = _write(tmp_path / "proc_cgroup", "0::/job/step\n")
    _write(tmp_path / "cg" / "cpu.max", "max 100000\n")  # the root: no limit
    _write(tmp_path / "cg" / "job" / "cpu.max", "250000 100000\n")
    _write(tmp_path / "cg" / "job" / "step" / "cpu.max", "150000 100000\n")
    cpus, where = threads.cgroup_cpu_limit(tmp_path / "cg", proc)
    assert cpus == 1.5 and "step/cpu.max" in where


def test_cgroup_v1_quota_and_no_quota(tmp_path):
    proc = _write(tmp_path / "proc_cgroup", "5:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n")
    folder = tmp_path / "cg" / "cpu,cpuacct" / "docker" / "abc"
    _write(folder / "cpu.cfs_quota_us", "300000\n")
    _write(folder / "cpu.cfs_period_us", "100000\n")
    assert threads.cgroup_cpu_limit(tmp_path / "cg", proc)[0] == 3.0
    _write(folder / "cpu.cfs_quota_us", "-1\n")  # v1's "no limit"
    assert threads.cgroup_cpu_limit(tmp_path / "cg", proc) == (None, "no cgroup CPU quota")
    assert threads.cgroup_cpu_limit(tmp_path / "none", tmp_path / "missing")[0] is None


def test_usable_cpus_is_the_affinity_mask_capped_by_the_quota():
    eight = lambda: set(range(8))  # noqa: E731
    assert threads.usable_cpus(eight, lambda: (None, "no quota"))[0] == 8
    cpus, how = threads.usable_cpus(eight, lambda: (2.5, "cpu.max: 250000 100000"))
    assert cpus == 2 and "affinity 8 CPUs" in how and "cgroup quota 2.5" in how
    assert threads.usable_cpus(eight, lambda: (0.5, "cpu.max"))[0] == 1
    assert threads.usable_cpus(lambda: {3}, lambda: (4.0, "cpu.max"))[0] == 1


def test_loader_workers_are_subtracted_only_for_the_cores_they_use():
    env: dict[str, str] = {}
    assert threads.choose_threads(None, 0, environ=env, cpus=(4, "affinity 4 CPUs"))[0] == 4
    # pre-tokenised rows at CPU rates: a worker needs ~1 % of a core, the cores stay for compute
    n, why = threads.choose_threads(None, 1, environ=env, cpus=(2, "affinity 2 CPUs"))
    assert n == 2  # the demo on 2 cores: both compute
    assert why == "auto: affinity 2 CPUs (1 loader worker not subtracted: they need 0.01 of a core)"
    n, why = threads.choose_threads(None, 2, environ=env, cpus=(2, "a"), rows_per_second=150)
    assert n == 2 and "0.01 of a core at 150 rows/s" in why
    # a model fast enough that the workers need whole cores: those are subtracted
    n, why = threads.choose_threads(None, 4, environ=env, cpus=(16, "a"), rows_per_second=20_000)
    assert threads.worker_cores(4, 20_000) == pytest.approx(1.6)
    assert n == 14 and "- 2 cores for 4 loader workers (1.60 of a core at 20,000 rows/s)" in why
    assert threads.worker_cores(1, 1e9) == 1.0  # a worker is at most one core
    assert threads.choose_threads(None, 8, environ=env, cpus=(4, "a"), rows_per_second=1e9)[0] == 1
    assert threads.choose_threads(None, 1, processes_per_node=2, environ=env, cpus=(8, "a"))[0] == 4


def test_an_override_is_taken_as_given():
    assert threads.choose_threads(3, 1, cpus=(2, "a"), environ={}) == (3, "accelerator.threads=3")
    env = {"OMP_NUM_THREADS": "5"}
    assert threads.choose_threads(None, 1, cpus=(2, "a"), environ=env)[0] == 5
    assert threads.choose_threads(2, 0, cpus=(8, "a"), environ=env)[0] == 2  # the config wins
    with pytest.raises(AcceleratorError, match=r"accelerator\.threads=0 must be a positive"):
        CPUPlugin(threads=0)
    with pytest.raises(AcceleratorError, match=r"accelerator\.omp_wait_policy='spin'"):
        CPUPlugin(omp_wait_policy="spin")


def test_the_wait_policy_goes_into_the_environment_unless_the_user_set_one():
    env: dict[str, str] = {}
    said = threads.set_wait_policy_env("passive", env)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["KMP_BLOCKTIME"] == "0"
    assert "no effect in this process" in said  # torch is imported in the test process
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert threads.set_wait_policy_env("passive", env).endswith("from the environment")
    assert env == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert "default" in threads.set_wait_policy_env(None, {})


SMOKE = ("experiment=smoke", "phase.max_steps=1", "val_every_n_steps=null")


def test_the_app_sets_the_chosen_threads_and_prints_why(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: (3, "affinity 3 CPUs"))
    before = torch.get_num_threads()
    try:
        cfg = compose("pretrain", [*SMOKE, f"paths.output_root={tmp_path}", "data.num_workers=1"])
        run_or_exit(cfg, tmp_path / "out")
        assert torch.get_num_threads() == 3
        plan = json.loads((tmp_path / "out" / "plan.json").read_text())
        assert plan["threads"].startswith(
            "3 intra-op (auto: affinity 3 CPUs (1 loader worker not subtracted: they need 0.0"
        )
        assert "CPU threads" in capsys.readouterr().out
        cfg = compose(
            "pretrain", [*SMOKE, f"paths.output_root={tmp_path}/b", "accelerator.threads=1"]
        )
        run_or_exit(cfg, tmp_path / "out-b")
        assert torch.get_num_threads() == 1
        plan = json.loads((tmp_path / "out-b" / "plan.json").read_text())
        assert plan["threads"].startswith("1 intra-op (accelerator.threads=1)")
    finally:
        torch.set_num_threads(before)


def test_the_cli_sets_the_wait_policy_before_torch_loads(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "OMNIBERT_"))}
    env["PYTHONWARNINGS"] = "ignore"
    result = subprocess.run(
        [sys.executable, "-m", "omnibert.apps.train", *SMOKE, f"paths.output_root={tmp_path}",
         "accelerator.threads=1", f"hydra.run.dir={tmp_path}/hydra"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    plan = json.loads((tmp_path / "hydra" / "plan.json").read_text())
    assert plan["threads"].endswith("OMP_WAIT_POLICY=PASSIVE (accelerator.omp_wait_policy)")


# ---------------------------------------------------------------------------- bf16 (point 11)
def _avx2(monkeypatch) -> None:
    monkeypatch.setattr(cpu_bf16, "cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(
        cpu_bf16, "native_bf16_flags", lambda: {"avx512_bf16": False, "amx_bf16": False}
    )


def test_bf16_on_a_cpu_without_native_bf16_is_refused_with_the_fix(tmp_path, monkeypatch, capsys):
    _avx2(monkeypatch)
    cfg = compose("pretrain", [*SMOKE, f"paths.output_root={tmp_path}", "trainer=bf16"])
    with pytest.raises(SystemExit) as info:
        run_or_exit(cfg, tmp_path / "out")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "trainer.precision=bf16-mixed" in err[0] and "capability AVX2" in err[0]
    assert "ms in fp32" in err[0]  # the measured probe
    assert "trainer=default" in err[0] and "accelerator.allow_slow_bf16=true" in err[0]
    assert not (tmp_path / "out").exists()
    CPUPlugin(allow_slow_bf16=True).check_precision("bf16-mixed")  # the override
    CPUPlugin().check_precision("32-true")  # fp32 is never probed or refused


def test_native_bf16_by_flags_else_by_the_probe(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(
        cpu_bf16, "native_bf16_flags", lambda: {"avx512_bf16": True, "amx_bf16": False}
    )
    assert cpu_bf16.cpu_bf16_support().native
    CPUPlugin().check_precision("bf16-mixed")
    monkeypatch.setattr(cpu_bf16, "cpu_capability", lambda: "SVE256")
    monkeypatch.setattr(cpu_bf16, "native_bf16_flags", lambda: {})
    monkeypatch.setattr(cpu_bf16, "probe_matmul_ms", lambda: (40.0, 1.0))
    support = cpu_bf16.cpu_bf16_support()
    assert not support.native and "40.0x" in support.reason
    monkeypatch.setattr(cpu_bf16, "probe_matmul_ms", lambda: (1.1, 1.0))
    assert cpu_bf16.cpu_bf16_support().native


@pytest.mark.parametrize(
    ("override", "sentence"),
    [
        ("phase.global_batch_size=-1", "phase.global_batch_size=-1 must be at least 1"),
        ("data.train_path=no/such/dir", "data.train_path=no/such/dir does not exist"),
    ],
)
def test_config_errors_stop_before_torch_is_imported(tmp_path, override, sentence):
    """Issue 16, point 9: config errors took 9-12 s because the app imported everything first."""
    code = (
        "import atexit, sys; "
        "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules)); "
        "from omnibert.apps.train import main; main()"
    )
    argv = ["experiment=demo", f"paths.output_root={tmp_path}", override]
    result = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [f"omnibert-train: error: {sentence}; fix "
                                                  f"{override.split('=')[0]}."]  # fmt: skip
    assert result.stdout.strip() == "torch imported: False"


def test_benchmarks_pick_the_precision_the_cpu_runs(monkeypatch):
    _avx2(monkeypatch)
    precision, why = cpu_bf16.bench_precision("auto")
    assert precision == "fp32" and "no native bf16" in why and "AVX2" in why
    assert cpu_bf16.bench_precision("bf16")[0] == "bf16"  # asked for: run, with a note
    assert "very slow" in cpu_bf16.bench_precision("bf16")[1]
    monkeypatch.setattr(
        cpu_bf16, "native_bf16_flags", lambda: {"avx512_bf16": False, "amx_bf16": True}
    )
    assert cpu_bf16.bench_precision("auto")[0] == "bf16"
    assert cpu_bf16.bench_precision("fp32") == ("fp32", "as requested")
