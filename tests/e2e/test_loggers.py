"""Loggers: W&B offline (read back from its run file: metrics, config, environment, the run id
of the run directory, the sweep as group, one run per job), TensorBoard and CSV at once, and
compile-only runs logging their numbers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from wandb_records import offline_runs

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.run.launching.sweeps import run_id

TESTS = Path(__file__).parents[1]
SMOKE = ("experiment=smoke", "callbacks=default", "trainer.enable_progress_bar=false")


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    for key in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)


def test_wandb_offline_holds_the_metrics_config_and_environment(tmp_path):
    cfg = compose("pretrain", [*SMOKE, f"paths.output_root={tmp_path}", "logger=wandb_offline",
                               "logger.wandb.tags=[smoke,test]"])  # fmt: skip
    run_or_exit(cfg, tmp_path / "out")
    (run,) = offline_runs(tmp_path / "smoke" / "logs")
    assert run["run"]["id"] == run_id(str(tmp_path / "smoke"))
    assert run["run"]["name"] == "smoke" and run["run"]["tags"] == ["smoke", "test"]
    assert run["run"]["group"] == ""  # not a sweep
    config = run["config"]
    assert config["config"]["phase"]["max_steps"] == 6 and config["plan"]["max_steps"] == 6
    assert config["environment"]["versions"]["torch"]
    keys = {k for row in run["history"] for k in row}
    for key in ("train/loss", "train/mlm_acc", "train/lr", "train/grad_norm", "val/mlm_acc",
                "throughput/samples_per_sec", "throughput/sequences_per_step"):  # fmt: skip
        assert key in keys, key
    last = [row["val/mlm_acc"] for row in run["history"] if "val/mlm_acc" in row][-1]
    summary = (tmp_path / "out" / "summary.json").read_text()
    assert f'"val/mlm_acc": {last}' in summary


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path):
    base = [*SMOKE, f"paths.output_root={tmp_path}", "logger=wandb_offline"]
    run_or_exit(compose("pretrain", [*base, "phase.max_steps=2"]), None)
    run_or_exit(compose("pretrain", [*base, "phase.max_steps=4", "ckpt_path=last"]), None)
    first, second = offline_runs(tmp_path / "smoke" / "logs")
    assert first["run"]["id"] == second["run"]["id"] == run_id(str(tmp_path / "smoke"))


def test_sweep_jobs_are_separate_runs_in_the_sweeps_group(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "WANDB_SILENT": "true"}
    sweep = tmp_path / "sweep"
    done = subprocess.run(
        [sys.executable, "-m", "omnibert.apps.train", "-m", *SMOKE, "logger=wandb_offline",
         "phase.max_steps=2", "seed=1,2", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    runs = [offline_runs(job / "logs")[0] for job in jobs]
    assert len(runs) == 2 and runs[0]["run"]["id"] != runs[1]["run"]["id"]
    assert {r["run"]["group"] for r in runs} == {"sweep"}
    # the second job's metrics are its own (the first run was finished, not reused)
    assert [r["config"]["config"]["seed"] for r in runs] == [1, 2]


def test_csv_and_tensorboard_at_once(tmp_path):
    cfg = compose("pretrain", [*SMOKE, f"paths.output_root={tmp_path}",
                               "logger=[csv,tensorboard]"])  # fmt: skip
    run_or_exit(cfg, None)
    logs = tmp_path / "smoke" / "logs"
    assert "train/loss" in (logs / "csv" / "version_0" / "metrics.csv").read_text()
    (events,) = (logs / "tensorboard" / "version_0").glob("events.out.tfevents.*")
    assert b"train/loss" in events.read_bytes()


def test_compile_only_logs_its_report(tmp_path):
    cfg = compose("pretrain", [*SMOKE, f"paths.output_root={tmp_path}", "compile_only=true",
                               "logger=wandb_offline", "data.num_workers=0"])  # fmt: skip
    report = run_or_exit(cfg, tmp_path / "out")
    (run,) = offline_runs(tmp_path / "smoke" / "logs")
    logged = {k: v for row in run["history"] for k, v in row.items()}
    assert logged["compile_only/fits"] == 1
    assert logged["compile_only/memory_estimate_bytes"] == report["memory_estimate_bytes"]["total"]
    assert logged["compile_only/step_seconds"] == report["measured"]["step_seconds"]
