"""Launching at scale: sweeps whose jobs never collide (and resume their own checkpoints), a
job requeued at its time limit that resumes to the uninterrupted result bit for bit, a default
micro batch that fits and a refused one that cannot, the sweep report, the Optuna sweeper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.config import TrainConfig
from omnibert.run.pretraining.job import prepare
from omnibert.run.sizing import memory

TESTS = Path(__file__).parents[1]
SWEEP = ("model=bert_tiny", "data=generated", "phase.max_steps=2", "phase.global_batch_size=8",
         "micro_batch_size=8", "optimizer.lr=1e-4,2e-4", "hydra/launcher=submitit_local",
         "data.num_train_samples=64", "data.num_eval_samples=8", "data.num_workers=0",
         "data.vocab_size=512", "logger=none", "callbacks=minimal")  # fmt: skip


def _train(cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "omnibert.apps.train", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def test_sweep_jobs_live_in_their_own_directories_and_resume_their_own_checkpoints(tmp_path):
    sweep = tmp_path / "sweep"
    done = _train(tmp_path, "-m", *SWEEP, f"hydra.sweep.dir={sweep}")
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    lrs_by_job = [
        [o for o in (j / ".hydra" / "overrides.yaml").read_text().split() if "lr=" in o]
        for j in jobs
    ]
    assert lrs_by_job == [["optimizer.lr=0.0001"], ["optimizer.lr=0.0002"]]
    for job in jobs:  # checkpoints, logs, plan and summary per job; none collide
        assert sorted(c.name for c in (job / "checkpoints").iterdir()) == [
            "last.ckpt", "step-00000002.ckpt"]  # fmt: skip
        assert (job / "plan.json").is_file() and (job / "summary.json").is_file()
    assert not (tmp_path / "outputs").exists()  # nothing in the single-run directory
    report = json.loads((sweep / "sweep_report.json").read_text())
    assert [r["job"] for r in report["jobs"]] == [j.name for j in jobs]
    lrs = [_weights(j / "checkpoints" / "last.ckpt") for j in jobs]
    assert any(not torch.equal(lrs[0][k], lrs[1][k]) for k in lrs[0])  # two different runs
    # the same sweep again with ckpt_path=last: each job resumes its own checkpoint
    resumed = _train(tmp_path, "-m", *SWEEP, f"hydra.sweep.dir={sweep}", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for job in jobs:
        plan = json.loads((job / "plan.json").read_text())
        assert plan["ckpt_path"] == str(job.resolve() / "checkpoints" / "last.ckpt")


def test_a_job_requeued_at_its_time_limit_resumes_to_the_uninterrupted_result(tmp_path):
    """submitit's local executor signals the job 30 s into a one-minute limit; the training
    writes last.ckpt and resume.json at the end of that step; submitit reruns the job, which
    resumes from there."""
    common = ("experiment=smoke", "phase.max_steps=160", "val_every_n_steps=80",
              "data.num_train_samples=4096", "callbacks.checkpoint.every_n_train_steps=80")  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the job (OMP_NUM_THREADS=1): the same sums, bit for bit
    try:
        straight = run_or_exit(compose("pretrain", [*common, f"paths.output_root={tmp_path}",
                                                    "run_name=straight", "accelerator.threads=1"]),
                               None)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    sweep = tmp_path / "sweep"
    done = _train(tmp_path, "-m", *common, "hydra/launcher=local", f"hydra.sweep.dir={sweep}",
                  "hydra.launcher.timeout_min=1",
                  "+callbacks.slow={_target_:faults.SlowUntilResumed,seconds:0.5}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (job,) = [p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")]
    logs = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.*"))
    assert "this job is timed-out" in logs  # the time limit was met ...
    assert "Restored all states from the checkpoint" in logs  # ... and the rerun resumed
    resumed = json.loads((job / "plan.json").read_text())["ckpt_path"]
    assert resumed == str((job / "checkpoints" / "last.ckpt").resolve())
    assert not (job / "checkpoints" / "resume.json").exists()  # gone once the run finished
    assert not list((job / "checkpoints").glob("last-v*.ckpt"))  # one last.ckpt, overwritten
    ours = _weights(job / "checkpoints" / "last.ckpt")
    theirs = _weights(Path(straight["last_checkpoint"]))
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


def test_the_natural_first_command_gets_a_micro_batch_that_fits(tmp_path):
    """omnibert-train model=bert_tiny data=generated used to take micro batch 65536 (global /
    devices) and be killed for memory; now the largest size within the budget is chosen."""
    prepared = prepare(TrainConfig.of(compose("pretrain", ["model=bert_tiny", "data=generated",
                                            "phase.max_steps=3", f"paths.output_root={tmp_path}"])))  # fmt: skip
    batch = prepared.plan.batch
    assert batch.micro_batch_size < 65536 and 65536 % batch.micro_batch_size == 0
    assert batch.micro_batch_size * batch.accumulate_grad_batches == 65536
    assert "largest that fits" in prepared.plan.micro_batch_choice
    available, _ = memory.available_memory_of(prepared.plugin.device)
    choice = prepared.plan.micro_batch_choice
    estimate = float(choice.split("estimate ")[1].split(" GiB")[0]) * 2**30
    assert estimate <= 0.8 * available


def test_the_choice_is_the_largest_divisor_within_the_budget(monkeypatch):
    from omnibert.models import BertConfig

    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64)  # fmt: skip
    shapes = {"input_ids": [1, 32], "masked_lm_positions": [1, 5], "nsp_labels": [1, 1]}
    common = dict(precision="32-true", clip=None, device=torch.device("cpu"), per_device=96,
                  max_rows=10_000, packed=False, memory_fraction=1.0)  # fmt: skip
    probe = memory.choose_micro_batch(config, shapes, requested=1, **common)
    fixed, per_row = probe.bytes_fixed, probe.bytes_per_row
    assert fixed is not None and per_row is not None and per_row > 0
    budget = fixed + 40 * per_row + per_row // 2  # 40 rows fit, 41 do not
    monkeypatch.setattr(memory, "available_memory_of", lambda device: (budget, "test"))
    choice = memory.choose_micro_batch(config, shapes, requested=None, **common)
    assert choice.size == 32  # the largest divisor of 96 not above 40
    packed = memory.choose_micro_batch(config, shapes, requested=None,
                                       **{**common, "packed": True})  # fmt: skip
    assert packed.size == 40
    capped = memory.choose_micro_batch(config, shapes, requested=None,
                                       **{**common, "max_rows": 7})  # fmt: skip
    assert capped.size == 6  # never more rows than a device gets
    with pytest.raises(memory.TrainConfigError) as info:
        memory.choose_micro_batch(config, shapes, requested=48, **common)
    message = str(info.value)
    assert "micro_batch_size=48 needs an estimated" in message
    assert "set micro_batch_size=32 or less" in message and "\n" not in message


def test_a_micro_batch_that_cannot_fit_is_refused_before_compute(tmp_path, capsys):
    cfg = compose("pretrain", ["model=bert_base", "data=generated", "micro_batch_size=65536",
                               f"paths.output_root={tmp_path}"])  # fmt: skip
    with pytest.raises(SystemExit) as info:
        run_or_exit(cfg, tmp_path / "out")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "micro_batch_size=65536 needs an estimated" in err[0], err
    assert "the largest that fits" not in err[0] and "set micro_batch_size=" in err[0]
    assert not (tmp_path / "out").exists()


# optuna's storage module, imported by the sweeper, uses a SQLAlchemy 1.x name
@pytest.mark.filterwarnings("ignore:The ``declarative_base\\(\\)`` function:DeprecationWarning")
def test_the_optuna_sweeper_maximises_the_final_masked_lm_accuracy(tmp_path, monkeypatch):
    """omnibert-train's entry point in-process, as its console script calls it (the basic
    launcher runs the trials in this process)."""
    from in_process import train_main_sweep

    sweep = tmp_path / "optuna"
    train_main_sweep(monkeypatch, tmp_path, ["experiment=smoke", "hydra/sweeper=optuna_mlm",
                                             "hydra.sweeper.n_trials=2",
                                             f"hydra.sweep.dir={sweep}"])  # fmt: skip
    result = (sweep / "optimization_results.yaml").read_text()
    assert "best_params" in result and "optimizer.lr" in result and "best_value" in result
    values = [json.loads((j / "summary.json").read_text())["validation"]["val/mlm_acc"]
              for j in sweep.iterdir() if (j / "summary.json").is_file()]  # fmt: skip
    assert len(values) == 2
    assert f"best_value: {max(values)}" in result
