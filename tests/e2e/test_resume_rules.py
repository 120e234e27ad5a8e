"""What a resume may change (docs/faults.md, "Resume rules"), in-process runs of the smoke
experiment (a 1-layer BERT on generated data): a longer ``phase.max_steps`` re-plans the
schedule and every later step's LR is the re-planned schedule's; a new ``optimizer.lr`` (and
another optimiser setting) reaches the optimiser and the schedule; what cannot be honoured is
refused in one sentence before compute; ``last.ckpt`` is always the newest checkpoint and
``keep_last`` counts every step checkpoint, whatever changed between runs; the non-finite
stop's advice, followed literally, trains on with a finite loss."""

from __future__ import annotations

import csv
import math
import re
import shlex
import shutil
import signal
from pathlib import Path

import pytest
import torch
from training_state import load_state

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.config import TrainConfig
from omnibert.errors import UserError
from omnibert.run.pretraining.job import prepare

#: experiment=smoke: seq 32, global batch 8 = 2 micro-batches of 4, LAMB at the phase's LR
#: 6e-3 with a 28.43 % warm-up and poly decay (power 0.5); one CPU thread, no loader worker
SMOKE = (
    "experiment=smoke",
    "accelerator.threads=1",
    "data.num_workers=0",
    "val_every_n_steps=null",
)
PEAK = 6.0e-3


def _run(root: Path, compose_config, *overrides: str) -> dict:
    return run_or_exit(compose_config(*SMOKE, *overrides, root=root), None)


def _checkpoints(root: Path, run_name: str = "smoke") -> Path:
    return root / run_name / "checkpoints"


def _poly(step: int, total: int, peak: float = PEAK) -> float:
    """conf/schedule/poly_warmup.yaml at phase1's warm-up: linear to the peak over 28.43 % of
    the run, then (1 - step/total)^0.5 (the definition, written out)."""
    warmup = 0.2843 * total
    if step < warmup:
        return peak * step / warmup
    return peak * (1.0 - min(step, total) / total) ** 0.5


def test_three_runs_with_another_cadence_lose_no_step_and_replan_the_schedule(
    tmp_path, compose_config
):
    """Issue 43's sequence: 20 steps with a checkpoint every 10, then phase.max_steps=30 and
    then 40 with ckpt_path=last (the smoke cadence, every 2): each run goes on where the one
    before ended, last.ckpt is at step 40, no -vN file, at most keep_last=3 step files; every
    step after a resume trains at the LR of the schedule re-planned over the new length."""
    _run(tmp_path, compose_config, "phase.max_steps=20",
         "callbacks.checkpoint.every_n_train_steps=10")  # fmt: skip
    second = _run(tmp_path, compose_config, "phase.max_steps=30", "ckpt_path=last")
    assert second["steps"] == 30
    changes = second["plan"]["resume_changes"]
    assert changes[0].startswith("phase.max_steps: 20 -> 30 steps; the schedule is re-planned")
    assert "schedule: poly decay ends at step 30 (was 20)" in changes[1]
    assert "callbacks.checkpoint.every_n_train_steps: 10 -> 2" in changes
    third = _run(tmp_path, compose_config, "phase.max_steps=40", "ckpt_path=last", "logger=csv")
    assert third["steps"] == 40
    folder = _checkpoints(tmp_path)
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["last.ckpt", "step-00000036.ckpt", "step-00000038.ckpt",
                     "step-00000040.ckpt"], names  # fmt: skip
    last = load_state(folder / "last.ckpt")
    assert last["global_step"] == 40
    (schedule,) = last["lr_schedulers"]
    assert schedule["total_steps"] == 40 and schedule["last_epoch"] == 40
    (metrics,) = (tmp_path / "smoke" / "logs").glob("**/metrics.csv")
    logged = {
        int(row["step"]): float(row["train/lr"])
        for row in csv.DictReader(metrics.open())
        if row.get("train/lr")
    }
    assert sorted(logged) == list(range(30, 40))  # this run's steps, each once
    for step, lr in logged.items():  # the LR of the update after `step` steps
        assert lr == pytest.approx(_poly(step, 40), rel=1e-6), step


def test_a_new_lr_and_weight_decay_apply_on_resume(tmp_path, compose_config):
    """optimizer.lr, optimizer.weight_decay and the warm-up changed on resume: the plan shows
    each by the key typed, the moved warm-up and the LR the resumed step now trains at, and
    the checkpoint written after the resume holds them in the optimiser's groups, the
    schedule and the hyper-parameters."""
    run = ("phase.max_steps=6", "callbacks.checkpoint.every_n_train_steps=2")
    _run(tmp_path, compose_config, *run, "+callbacks.end={_target_:faults.EndFitAtStep,step:4}")
    summary = _run(tmp_path, compose_config, *run, "ckpt_path=last", "optimizer.lr=2e-3",
                   "optimizer.weight_decay=0.05", "phase.warmup_proportion=0.1")  # fmt: skip
    assert summary["plan"]["resume_changes"] == [
        "optimizer.lr: 0.006 -> 0.002 (the optimiser's groups and the schedule's peak take it)",
        "optimizer.weight_decay: 0.01 -> 0.05",
        "phase.warmup_proportion: 0.2843 -> 0.1",  # the key typed (schedule's by interpolation)
        "schedule: its warm-up ends at step 0.6 (was 1.7058)",
        f"the LR at step 4, where this run resumes: {_poly(4, 6, 2e-3):.6g} "
        f"(was {_poly(4, 6):.6g})",
    ]
    after = load_state(_checkpoints(tmp_path) / "last.ckpt")
    assert after["global_step"] == 6
    assert after["hyper_parameters"]["optimizer"]["lr"] == 2e-3
    (schedule,) = after["lr_schedulers"]
    assert schedule["base_lrs"] == [2e-3, 2e-3]
    decay, no_decay = after["optimizer_states"][0]["param_groups"]
    assert decay["initial_lr"] == no_decay["initial_lr"] == 2e-3
    assert decay["lr"] == pytest.approx(_poly(6, 6, 2e-3), abs=1e-15)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.05, 0.0)
    assert schedule["warmup"] == pytest.approx(0.6)


def test_a_run_stopped_by_sigterm_resumes_without_saving_its_step_again(
    tmp_path, compose_config, capsys
):
    """Stopped by SIGTERM after step 1 (a checkpoint every step), resumed: the stop's
    step-00000001.ckpt is not written again (Lightning would, at the first micro-batch of the
    resumed run, mid-step: issue 43's stray step-00000001-v1.ckpt), no -vN file appears and
    the resumed run ends at step 3 with keep_last=3 step files and last.ckpt the newest."""
    run = ("phase.max_steps=3", "callbacks.checkpoint.every_n_train_steps=1")
    with pytest.raises(SystemExit) as stopped:
        _run(
            tmp_path, compose_config, *run, "+callbacks.term={_target_:faults.SigtermAtStep,step:1}"
        )
    assert stopped.value.code == 128 + signal.SIGTERM
    assert "stopped by SIGTERM at step 1" in capsys.readouterr().err
    folder = _checkpoints(tmp_path)
    written = (folder / "step-00000001.ckpt").stat().st_mtime_ns
    assert _run(tmp_path, compose_config, *run, "ckpt_path=last")["steps"] == 3
    assert (folder / "step-00000001.ckpt").stat().st_mtime_ns == written
    assert sorted(p.name for p in folder.iterdir()) == [
        "last.ckpt",
        "step-00000001.ckpt",
        "step-00000002.ckpt",
        "step-00000003.ckpt",
    ]
    assert load_state(folder / "last.ckpt")["global_step"] == 3


def test_last_resumes_the_newest_of_an_older_versions_last_v_files(tmp_path, compose_config):
    """A run directory written before issue 43's fix: last.ckpt at step 2 and last-v1.ckpt
    (Lightning's versioned name) at step 4, the newest. ckpt_path=last resumes step 4."""
    _run(tmp_path, compose_config, "phase.max_steps=4",
         "callbacks.checkpoint.every_n_train_steps=2")  # fmt: skip
    folder = _checkpoints(tmp_path)
    shutil.copyfile(folder / "last.ckpt", folder / "last-v1.ckpt")
    shutil.copyfile(folder / "step-00000002.ckpt", folder / "last.ckpt")
    summary = _run(tmp_path, compose_config, "phase.max_steps=6", "ckpt_path=last")
    assert summary["plan"]["ckpt_path"] == str(folder / "last-v1.ckpt")
    assert summary["plan"]["resume_changes"][0].startswith("phase.max_steps: 4 -> 6 steps")
    assert load_state(folder / "last.ckpt")["global_step"] == 6


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, compose_config) -> Path:
    """A finished 2-step run (fp32, a checkpoint every step) to resume."""
    root = tmp_path_factory.mktemp("two_steps")
    _run(root, compose_config, "phase.max_steps=2", "callbacks.checkpoint.every_n_train_steps=1")
    return root


#: the way out of every refusal: a new run from the checkpoint's weights, in its own directory
FRESH = ("start a new run from its weights (a fresh optimiser and schedule): "
         "phase.init_from={ckpt} run_name=smoke-from-step2, without ckpt_path.")  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "sentence"),
    [
        (["phase.max_steps=1"],
         "phase.max_steps=1 ends before step 2, where ckpt_path={ckpt} stopped; set a longer "
         "run, or resume an earlier step-*.ckpt."),
        (["phase.global_batch_size=16"],
         "phase.global_batch_size=16 but ckpt_path={ckpt} was trained with 8: its data position "
         "and gradient accumulation are counted in steps of 8 sequences, so another batch "
         "cannot go on exactly from there; resume with phase.global_batch_size=8, or " + FRESH),
        (["optimizer=adamw", "optimizer.lr=1e-3"],
         "optimizer._target_=omnibert.optim.AdamW but ckpt_path={ckpt} was trained with "
         "omnibert.optim.Lamb: its saved state belongs to that optimiser; resume with the "
         "optimizer group whose _target_ is omnibert.optim.Lamb, or " + FRESH),
        (["optimizer.no_weight_decay=[bias]"],
         "optimizer.no_weight_decay=['bias'] but ckpt_path={ckpt} was trained with ['bias', "
         "'LayerNorm', 'layer_norm', '_norm']: it decides the parameter groups the saved state "
         "is kept in; resume with optimizer.no_weight_decay=['bias', 'LayerNorm', 'layer_norm', "
         "'_norm'], or " + FRESH),
        (["~schedule"],
         "schedule=null but ckpt_path={ckpt} was trained with the schedule "
         "omnibert.optim.schedules.PolyWarmupLR, whose position a resume continues; resume "
         "with its schedule, or " + FRESH),
        (["trainer.precision=bf16-true", "accelerator.allow_slow_bf16=true"],
         "trainer.precision=bf16-true but ckpt_path={ckpt} was trained in 32-true: the dtype "
         "the weights themselves are kept in would change; resume with "
         "trainer.precision=32-true, or " + FRESH),
    ],
    ids=["shorter", "global-batch", "optimizer", "groups", "no-schedule", "half-weights"],
)  # fmt: skip
def test_what_cannot_be_honoured_is_refused_in_one_sentence(
    two_steps, compose_config, overrides, sentence
):
    ckpt = _checkpoints(two_steps) / "last.ckpt"
    before = {p.name: p.stat().st_mtime_ns for p in ckpt.parent.iterdir()}
    config = compose_config(*SMOKE, "ckpt_path=last", *overrides, root=two_steps)
    with pytest.raises(UserError) as refused:
        prepare(TrainConfig.of(config))
    assert str(refused.value) == sentence.format(ckpt=ckpt)
    assert {p.name: p.stat().st_mtime_ns for p in ckpt.parent.iterdir()} == before


def test_the_way_out_of_a_refusal_followed_literally_trains(two_steps, compose_config):
    """The global batch refused on resume: its way out, typed as printed (ckpt_path dropped),
    starts a new run from the checkpoint's weights in a directory of its own."""
    ckpt = _checkpoints(two_steps) / "last.ckpt"
    keys = shlex.split(FRESH.format(ckpt=ckpt).split(": ", 1)[1].split(", without")[0])
    summary = _run(two_steps, compose_config, "phase.global_batch_size=16", "phase.max_steps=2",
                   *keys)  # fmt: skip
    assert summary["steps"] == 2 and summary["run_name"] == "smoke-from-step2"
    assert summary["plan"]["init_from"] == str(ckpt)


def test_the_plan_names_no_change_when_nothing_changed(two_steps, compose_config):
    plan = prepare(TrainConfig.of(compose_config(*SMOKE, "ckpt_path=last", "phase.max_steps=2",
                                  "callbacks.checkpoint.every_n_train_steps=1",
                                  root=two_steps))).plan  # fmt: skip
    assert plan.resume_changes == []
    assert "resume changes      none: the checkpoint's settings" in plan.table()


#: the advice's command: the keys it says to set (ckpt_path=<file>, run_name=..., the LR)
ADVICE = re.compile(r": ((?:run_name|ckpt_path)=\S+ optimizer\.lr=\S+)")


@pytest.mark.parametrize(
    ("policy", "every", "fresh"),
    [("skip", 1, False), ("stop", 1, False), ("stop", 100, True)],
    ids=["skip-exhausted", "stop", "nothing-kept"],
)
def test_the_nonfinite_advice_followed_literally_trains_on(
    tmp_path, compose_config, capsys, policy, every, fresh
):
    """optimizer.lr=1e30 makes step 2's update huge (finite weights of ~1e29) and every loss
    after it NaN. The stop (after 2 skipped steps, or at the first with nonfinite=stop) names
    a checkpoint from before that update whose weights are finite, or (no such file kept)
    a fresh run; its keys, typed as printed, give a run whose loss is finite."""
    run = (*SMOKE, "phase.max_steps=6", f"callbacks.checkpoint.every_n_train_steps={every}",
           f"trainer.nonfinite={policy}", "trainer.nonfinite_max_consecutive=2")  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        run_or_exit(compose_config(*run, "optimizer.lr=1e30", root=tmp_path), None)
    assert stopped.value.code == 65
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the loss itself was not finite" in line, line
    found = ADVICE.search(line)
    assert found, line
    keys = shlex.split(found.group(1))
    assert keys[-1] == "optimizer.lr=0.006"  # a tenth of 1e30, at most the recipe's LR
    if fresh:
        assert keys[0] == "run_name=smoke-lr0.006" and "start afresh" in line
    else:
        assert keys[0] == f"ckpt_path={_checkpoints(tmp_path) / 'step-00000001.ckpt'}"
        weights = load_state(Path(keys[0].partition("=")[2]))["state_dict"].values()
        assert all(torch.isfinite(t).all() for t in weights if t.is_floating_point())
    summary = run_or_exit(compose_config(*run, "optimizer.lr=1e30", *keys, root=tmp_path), None)
    assert summary["steps"] == 6
    assert summary["nonfinite_skipped_steps"] == 0
    assert math.isfinite(summary["validation"]["val/loss"])
    name = keys[0].partition("=")[2] if fresh else "smoke"
    folder = _checkpoints(tmp_path, name)
    assert load_state(folder / "last.ckpt")["global_step"] == 6


def test_in_a_run_of_phases_the_advice_names_the_phase_keys(tmp_path, compose_config, capsys):
    """The same divergence in phase 1 of a two-phase run: the advice's keys are that phase's
    (++phases.phase1.ckpt_path, ++phases.phase1.optimizer.lr), and the same command with them
    finishes both phases with a finite loss."""
    run = ("experiment=smoke_two_phase", "accelerator.threads=1", "data.num_workers=0",
           "callbacks.checkpoint.every_n_train_steps=1", "trainer.nonfinite=stop",
           "+phases.phase1.optimizer.lr=1e30")  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        run_or_exit(compose_config(*run, root=tmp_path), None)
    assert stopped.value.code == 65
    line = capsys.readouterr().err.strip().splitlines()[-1]
    found = re.search(r": (\+\+phases\.phase1\.ckpt_path=\S+ \S+)", line)
    assert found, line
    keys = shlex.split(found.group(1))
    assert keys[-1] == "++phases.phase1.optimizer.lr=0.006"
    summary = run_or_exit(compose_config(*run, *keys, root=tmp_path), None)["phases"]
    assert (summary["phase1"]["steps"], summary["phase2"]["steps"]) == (4, 2)
    assert summary["phase1"]["nonfinite_skipped_steps"] == 0
    assert math.isfinite(summary["phase2"]["validation"]["val/loss"])


def test_a_fine_tuning_resume_applies_task_lr_and_task_epochs(tmp_path, tiny_hf, capsys):
    """omnibert-finetune stopped by SIGTERM after step 2 of 4 and resumed with another task.lr
    and one more epoch: the plan names the keys fine-tuning takes (task.lr, task.epochs), and
    the final checkpoint holds the new LR in the optimiser's groups and the schedule."""
    from finetune_data import mrpc_file

    from omnibert.apps import finetune

    train = mrpc_file(tmp_path / "train.tsv", 16, seed=1)  # 2 steps of 8 per epoch
    run = ["task=mrpc", f"data.train_file={train}", f"model.init_from={tiny_hf}",
           f"paths.output_root={tmp_path / 'runs'}", "task.batch_size=8",
           "task.max_seq_length=32", "logger=none", "trainer.enable_progress_bar=false",
           "task.lr=1e-4", "task.epochs=2"]  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        finetune.run_or_exit(
            compose("finetune", [*run, "+callbacks.term={_target_:faults.SigtermAtStep,step:2}"])
        )
    assert stopped.value.code == 128 + signal.SIGTERM
    assert "stopped by SIGTERM at step 2" in capsys.readouterr().err
    summary = finetune.run_or_exit(
        compose("finetune", [*run, "ckpt_path=last", "task.lr=3e-4", "task.epochs=3"])
    )
    assert summary["steps"] == 6
    changes = summary["plan"]["resume_changes"]
    assert changes[0].startswith("steps (task.epochs × steps per epoch): 4 -> 6; the schedule")
    assert (
        "task.lr: 0.0001 -> 0.0003 (the optimiser's groups and the schedule's peak take it)"
        in changes
    )
    final = load_state(Path(summary["checkpoint"]))
    assert final["hyper_parameters"]["optimizer"]["lr"] == 3e-4
    assert [g["initial_lr"] for g in final["optimizer_states"][0]["param_groups"]] == [3e-4, 3e-4]
    assert final["lr_schedulers"][0]["base_lrs"] == [3e-4, 3e-4]


def test_auto_resumes_this_run_starts_fresh_or_refuses_another_run(
    two_steps, compose_config, tmp_path, monkeypatch
):
    """``ckpt_path=auto`` (and a launcher's restart without ckpt_path, which means it): this
    run's last.ckpt is resumed with a plan line saying why; none yet starts fresh; a
    checkpoint of another run (another recipe or model) is refused in one sentence."""
    ckpt = _checkpoints(two_steps) / "last.ckpt"
    same = ("phase.max_steps=2", "callbacks.checkpoint.every_n_train_steps=1")
    plan = prepare(
        TrainConfig.of(compose_config(*SMOKE, "ckpt_path=auto", *same, root=two_steps))
    ).plan
    assert plan.ckpt_path == str(ckpt) and plan.resume_changes == []
    assert f"resume from         {ckpt} (ckpt_path=auto: this run's last checkpoint)" in (
        plan.table()
    )
    with pytest.raises(UserError) as refused:
        prepare(TrainConfig.of(compose_config(*SMOKE, "ckpt_path=auto", *same, "optimizer.lr=1e-3",
                               root=two_steps)))  # fmt: skip
    assert str(refused.value) == (
        f"ckpt_path=auto found {ckpt}, a checkpoint of another run (optimizer.lr: 0.006 -> "
        "0.001 (the optimiser's groups and the schedule's peak take it)); to go on from it "
        "with these changes "
        "resume it with ckpt_path=last, or start a new run under another run_name."
    )
    with pytest.raises(UserError, match="was written for another model"):
        prepare(TrainConfig.of(compose_config(*SMOKE, "ckpt_path=auto", *same, "model.config.hidden_size=64",
                               "model.config.intermediate_size=64", root=two_steps)))  # fmt: skip
    fresh = prepare(TrainConfig.of(compose_config(*SMOKE, "ckpt_path=auto", root=tmp_path))).plan
    assert fresh.ckpt_path is None
    assert "resume from         fresh run (ckpt_path=auto: no last.ckpt yet)" in fresh.table()
    # a launcher's restart: the same command, no ckpt_path, goes on from last.ckpt
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    plan = prepare(TrainConfig.of(compose_config(*SMOKE, *same, root=two_steps))).plan
    assert plan.ckpt_path == str(ckpt)
    assert plan.resume_reason == "SLURM requeued the job (SLURM_RESTART_COUNT=1), so ckpt_path=auto"
    # not a restart: the fresh run's refusal over an earlier run's checkpoints stays
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    with pytest.raises(UserError, match="resume it with ckpt_path=last"):
        prepare(TrainConfig.of(compose_config(*SMOKE, *same, root=two_steps)))
