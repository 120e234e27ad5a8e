"""omnibert-train end to end: a run killed with SIGKILL and resumed with ``ckpt_path=last``
ends bitwise equal to an uninterrupted run; bad input stops with one sentence, exit code 2,
before anything is written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from training_state import assert_same_training_state, load_state

from omnibert.apps.train import run_or_exit
from omnibert.compat import lightning_resumes_after_batch_end
from omnibert.data.loaders import stateful_dataloader_class
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare

TESTS = Path(__file__).parents[1]  # faults.KillAtStep for the killed runs
REFERENCE = TESTS / "fixtures" / "reference"
# experiment=smoke (1-layer 32-wide BERT with dropout 0.1, generated data, global batch 8 =
# 2 micro-batches of 4) on 28 rows: 3 optimiser steps per pass over the data (the 7th
# micro-batch of each pass is left out so every step sees a whole global batch), a
# checkpoint every step, validation every 3 steps, 8 steps in all.
SMOKE = (
    "experiment=smoke",
    "data.num_train_samples=28",
    "phase.max_steps=8",
    "callbacks.checkpoint.every_n_train_steps=1",
)


# `python -m omnibert.apps.train` in a process where torchdata cannot be imported (as in the
# IPU environment, whose torch 2.0.1 has no StatefulDataLoader)
WITHOUT_TORCHDATA = (
    "import runpy, sys; sys.modules['torchdata.stateful_dataloader'] = None; "
    "runpy.run_module('omnibert.apps.train', run_name='__main__', alter_sys=True)"
)


def _train(root: Path, *overrides: str, torchdata: bool = True) -> subprocess.CompletedProcess[str]:
    """``python -m omnibert.apps.train`` in a fresh process (one CPU thread)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    app = ["-m", "omnibert.apps.train"] if torchdata else ["-c", WITHOUT_TORCHDATA]
    return subprocess.run(
        [
            sys.executable,
            *app,
            *SMOKE,
            f"paths.output_root={root}",
            *overrides,
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _kill_at(step: int) -> str:
    return f"+callbacks.kill={{_target_:faults.KillAtStep,step:{step}}}"


def _in_process(compose_config, root: Path, *overrides: str) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # one intra-op thread whatever data.num_workers (the automatic choice subtracts the
        # loader workers, and another thread count sums in another order: not bitwise)
        overrides = ("accelerator.threads=1", *overrides)
        return run_or_exit(compose_config(*SMOKE, *overrides, root=root), root / "out")
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, compose_config) -> dict:
    """Uninterrupted runs (in this process), without and with a loader worker process,
    keeping every step's checkpoint."""
    runs = {}
    for workers in (0, 1):
        root = tmp_path_factory.mktemp(f"straight{workers}")
        summary = _in_process(
            compose_config,
            root,
            "run_name=straight",
            f"data.num_workers={workers}",
            "callbacks.checkpoint.keep_last=null",
        )
        ckpts = root / "straight" / "checkpoints"
        runs[workers] = {
            "summary": summary,
            "ckpts": ckpts,
            "last": load_state(ckpts / "last.ckpt"),
        }
    return runs


def test_the_loader_worker_count_does_not_change_the_run(straight):
    assert_same_training_state(straight[0]["last"], straight[1]["last"], 8)


@pytest.mark.parametrize("torchdata", [True, False], ids=["torchdata", "without-torchdata"])
def test_a_run_killed_with_sigkill_resumes_bitwise(tmp_path, straight, torchdata):
    """A real kill (no cleanup) mid-pass, after the run crossed a pass boundary, with a
    loader worker process; resumed with ckpt_path=last in a new process. Without torchdata
    (the IPU environment's loader, omnibert.data.loaders) it ends the same as with it."""
    ckpts = tmp_path / "killed" / "checkpoints"
    common = ("run_name=killed", "data.num_workers=1")
    killed = _train(tmp_path, *common, _kill_at(5), torchdata=torchdata)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "SIGKILL at global step 5" in killed.stderr
    saved = load_state(ckpts / "last.ckpt")
    assert saved["global_step"] == 5
    (loader_state,) = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    # torchdata's state has its own keys besides the sampler's; the fallback's only that one
    fallback = not (
        torchdata and stateful_dataloader_class() and lightning_resumes_after_batch_end()
    )
    assert (list(loader_state) == ["_index_sampler_state"]) is fallback
    resumed = _train(tmp_path, *common, "ckpt_path=last", torchdata=torchdata)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume from" in resumed.stdout and str(ckpts / "last.ckpt") in resumed.stdout
    assert not list(ckpts.glob(".*tmp*"))  # no half-written temporaries left behind

    assert_same_training_state(straight[1]["last"], load_state(ckpts / "last.ckpt"), 8)
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("killed/hydra/*/summary.json")]
    assert len(summaries) == 1  # the killed invocation wrote none
    assert summaries[0]["validation"] == straight[1]["summary"]["validation"]
    assert summaries[0]["steps"] == 8
    assert summaries[0]["last_checkpoint"] == str((ckpts / "last.ckpt").resolve())


def _resume_from_step(
    compose_config, tmp_path: Path, straight: dict, workers: int, step: int
) -> None:
    ckpt = straight[workers]["ckpts"] / f"step-{step:08d}.ckpt"
    _in_process(
        compose_config,
        tmp_path,
        "run_name=resumed",
        f"data.num_workers={workers}",
        f"ckpt_path={ckpt}",
    )
    got = load_state(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert_same_training_state(straight[workers]["last"], got, 8)


def test_resuming_at_the_end_of_a_pass_is_bitwise(tmp_path, straight, compose_config):
    # step 3 ends the first pass (28 rows: 3 global batches, one micro-batch left out)
    _resume_from_step(compose_config, tmp_path, straight, workers=0, step=3)


def test_resuming_at_the_end_of_a_pass_with_a_loader_worker_is_bitwise(
    tmp_path, straight, compose_config
):
    _resume_from_step(compose_config, tmp_path, straight, workers=1, step=3)


# ------------------------------------------------------------------------------ bad input


def _refused(compose_config, root: Path, capsys, *overrides: str) -> str:
    """Run the app in-process (the smoke experiment unless ``overrides`` choose the data); it
    must exit 2 with one line and write nothing."""
    if not any(o.startswith("data=") for o in overrides):
        overrides = ("experiment=smoke", *overrides)
    out = root / "run-output"
    with pytest.raises(SystemExit) as info:
        run_or_exit(compose_config(*overrides, root=root), out)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnibert-train: error: "), err
    assert not (root / "smoke" / "checkpoints").exists()
    assert not out.exists()  # no plan.json, no summary.json
    return err[0]


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory, bert_vocab_file) -> Path:
    """A real omnibert-prepare output: seq 64, 10 masks (train only)."""
    out = tmp_path_factory.mktemp("shards") / "train"
    settings = InstanceSettings(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1)
    prepare([str(REFERENCE / "wiki_like.txt")], bert_vocab_file, out, settings, progress=False)
    return out


def _arrow(path: Path) -> list[str]:
    """A tiny model on Arrow shards (the smoke experiment's settings, without its data)."""
    return [
        "data=arrow",
        f"data.train_path={path}",
        "data.eval_path=null",
        "data.num_workers=0",
        "model=bert_tiny",
        "run_name=smoke",
        "phase.global_batch_size=8",
        "micro_batch_size=4",
        "logger=none",
        "callbacks=minimal",
    ]


def test_missing_shards_are_refused(tmp_path, capsys, compose_config):
    message = _refused(compose_config, tmp_path, capsys, *_arrow(tmp_path / "no-such-dir"))
    assert "data.train_path" in message and "no-such-dir" in message


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("phase.max_seq_length=128", "max_seq_length"),
        ("phase.max_predictions_per_seq=20", "max_predictions_per_seq"),
    ],
)
def test_settings_that_disagree_with_the_data_are_refused(
    tmp_path, capsys, tiny_shards, override, key, compose_config
):
    good = ["phase.max_seq_length=64", "phase.max_predictions_per_seq=10"]
    overrides = [*_arrow(tiny_shards), *good, override]
    message = _refused(compose_config, tmp_path, capsys, *overrides)
    assert key in message


def test_impossible_batch_arithmetic_is_refused(tmp_path, capsys, compose_config):
    message = _refused(
        compose_config,
        tmp_path,
        capsys,
        "phase.global_batch_size=10",
        "micro_batch_size=4",
    )
    assert "phase.global_batch_size=10" in message and "micro_batch_size=4" in message


def test_initial_weights_of_another_architecture_are_refused(
    tmp_path, capsys, straight, compose_config
):
    phase1 = straight[0]["ckpts"] / "last.ckpt"
    message = _refused(
        compose_config,
        tmp_path,
        capsys,
        f"phase.init_from={phase1}",
        "model.config.hidden_size=64",
    )
    assert "hidden_size=32 (this model: 64)" in message
    message = _refused(
        compose_config,
        tmp_path,
        capsys,
        f"phase.init_from={tmp_path / 'phase1.ckpt'}",
    )
    assert "does not exist" in message


def test_resume_without_a_checkpoint_is_refused_by_the_cli(tmp_path):
    result = _train(tmp_path, "ckpt_path=last")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("omnibert-train: error: ckpt_path=last")
    assert str(tmp_path / "smoke" / "checkpoints") in lines[-1]
    assert sum("error" in line for line in lines) == 1
    assert not (tmp_path / "smoke" / "checkpoints").exists()
    assert not list(tmp_path.glob("smoke/hydra/*/plan.json"))


def test_a_fresh_run_does_not_overwrite_an_earlier_runs_checkpoints(
    tmp_path, capsys, compose_config
):
    ckpts = tmp_path / "smoke" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "last.ckpt").write_bytes(b"earlier run")
    out = tmp_path / "run-output"
    with pytest.raises(SystemExit):
        run_or_exit(compose_config("experiment=smoke", root=tmp_path), out)
    assert "ckpt_path=last" in capsys.readouterr().err
    assert (ckpts / "last.ckpt").read_bytes() == b"earlier run"
    assert not out.exists()


# ------------------------------------------------------------------------------ atomic save


def test_a_checkpoint_write_that_dies_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    from omnibert.checkpoints import writing
    from omnibert.checkpoints.writing import AtomicCheckpointIO, CheckpointWriteError

    target = tmp_path / "checkpoints" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 1, "w": torch.ones(3)}, target)
    assert load_state(target)["global_step"] == 1

    def dies_halfway(obj, handle):
        handle.write(b"PK\x03\x04 half a zip file")
        raise OSError("disk full")

    monkeypatch.setattr(writing.torch, "save", dies_halfway)
    with pytest.raises(CheckpointWriteError, match="disk full"):  # the OSError, explained
        io.save_checkpoint({"global_step": 2, "w": torch.zeros(3)}, target)
    assert load_state(target)["global_step"] == 1  # the old checkpoint, whole
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]  # no temporary

    monkeypatch.undo()
    io.save_checkpoint({"global_step": 2, "w": torch.zeros(3)}, target)
    assert load_state(target)["global_step"] == 2


def test_temporaries_of_killed_writers_are_removed_and_checkpoints_kept(tmp_path):
    from omnibert.checkpoints.resuming import remove_stale_temporaries

    (tmp_path / "last.ckpt").write_bytes(b"real")
    (tmp_path / ".last.ckpt.tmp-4242").write_bytes(b"half")
    assert remove_stale_temporaries(tmp_path) == [".last.ckpt.tmp-4242"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert remove_stale_temporaries(tmp_path / "absent") == []


@pytest.mark.parametrize("workers", [0, 1])
def test_resuming_with_another_micro_batch_is_refused_before_training(
    tmp_path, workers, compose_config
):
    """The sampler's own sentence, exit 2, not Lightning's teardown error (issue 16, point 5);
    with a loader worker the position is in torchdata's worker snapshot format."""
    _in_process(compose_config, tmp_path, "phase.max_steps=2", f"data.num_workers={workers}")
    ckpts = tmp_path / "smoke" / "checkpoints"
    before = {p.name: p.stat().st_mtime_ns for p in ckpts.iterdir()}
    result = _train(tmp_path, "ckpt_path=last", "micro_batch_size=2", f"data.num_workers={workers}")
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("omnibert-train: error: the checkpoint's data sampler"), lines
    assert "batch_size=4 (now 2)" in lines[-1] and "micro_batch_size" in lines[-1]
    assert "Traceback" not in result.stderr and "combined_loader" not in result.stderr
    assert "omnibert-train: environment" not in result.stdout  # before the plan is printed
    assert {p.name: p.stat().st_mtime_ns for p in ckpts.iterdir()} == before
