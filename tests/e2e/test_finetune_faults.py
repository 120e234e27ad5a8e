"""omnibert-finetune and the tools guarded as pretraining is (docs/faults.md): fine-tuning's plan
counts its checkpoints against the free space (a checkpoint of the task, head included, within
10 % of the real file; refused before compute when not one fits); a disk that fills while a
checkpoint is written stops fine-tuning in one line and loses nothing written before; a stop
inside a step of several micro-batches drops the partial step, keeps the last completed one
and resumes from its data position to the weights of an uninterrupted run, bitwise."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from finetune_data import mrpc_file

from omnibert.apps.compose import compose
from omnibert.errors import UserError

FAST = ["task.epochs=1", "task.batch_size=8", "task.max_seq_length=32", "logger=none",
        "trainer.enable_progress_bar=false"]  # fmt: skip


@pytest.fixture(scope="module")
def mrpc_train(tmp_path_factory) -> Path:
    return mrpc_file(tmp_path_factory.mktemp("mrpc") / "train.tsv", 16, seed=1)


def _finetune(tmp_path: Path, tiny_hf: Path, train: Path, *extra: str):
    return compose("finetune", [
        "task=mrpc", f"data.train_file={train}", f"model.init_from={tiny_hf}",
        f"paths.output_root={tmp_path / 'runs'}", *FAST, *extra,
    ])  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_hf) -> tuple[Path, dict[str, Any], str]:
    """A whole run of 6 steps of 4 micro-batches (48 rows, task.batch_size=8,
    micro_batch_size=2): its training file, summary and printed lines."""
    from omnibert.apps import finetune

    tmp = tmp_path_factory.mktemp("uninterrupted")
    train = mrpc_file(tmp / "train.tsv", 48, seed=1)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        summary = finetune.run_or_exit(_finetune(tmp, tiny_hf, train, "micro_batch_size=2"))
    assert summary["steps"] == 6
    return train, summary, out.getvalue()


def test_the_plan_counts_a_checkpoint_within_ten_percent(uninterrupted):
    _, summary, out = uninterrupted
    space = summary["plan"]["checkpoint_space"]
    line = next(
        line for line in out.splitlines()
        if line.startswith("omnibert-finetune: checkpoint space: about ")
    )  # fmt: skip
    assert space["description"] in line
    real = Path(summary["checkpoint"]).stat().st_size
    assert abs(space["bytes_each"] / real - 1) < 0.10, (space["bytes_each"], real)


def test_the_plan_refuses_a_disk_without_room_for_one_checkpoint(
    tmp_path, tiny_hf, mrpc_train, monkeypatch
):
    from omnibert.checkpoints import space
    from omnibert.config import FinetuneConfig
    from omnibert.finetune.tokenizer import FineTuneInputError
    from omnibert.run.finetuning.job import prepare

    cfg = FinetuneConfig.of(_finetune(tmp_path, tiny_hf, mrpc_train), FineTuneInputError)
    monkeypatch.setattr(space, "free_bytes", lambda path: 1000)
    with pytest.raises(UserError, match=r"paths\.checkpoint_dir=.* has 1000 bytes free on its file "
                       r"system, less than one checkpoint of this run \(about .*\); free space "
                       "there or set paths.checkpoint_dir to a file system with room."):  # fmt: skip
        prepare(cfg)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("*.ckpt"))


def test_a_disk_that_fills_stops_fine_tuning_in_one_line_and_it_resumes(
    tmp_path, tiny_hf, monkeypatch, capsys
):
    """A checkpoint every 2 of 6 steps (``last.ckpt``: ``final.ckpt`` is the end's alone); the
    disk fills while ``last.ckpt`` of step 4 is written: exit code 74, one line naming the
    file, the error and what is intact; step 2's ``last.ckpt`` is untouched, no
    ``final.ckpt`` claims the unfinished run, and ``ckpt_path=last`` finishes it."""
    from faults import FailingCheckpointWrites

    from omnibert.apps import finetune

    train = mrpc_file(tmp_path / "train.tsv", 48, seed=1)
    saving = ["callbacks.checkpoint.every_n_train_steps=2"]  # last.ckpt follows from it
    failing = FailingCheckpointWrites(("last",), spare=1).install(monkeypatch)
    with pytest.raises(SystemExit) as stopped:
        finetune.run_or_exit(_finetune(tmp_path, tiny_hf, train, *saving))
    assert stopped.value.code == 74 and failing.failures == 1
    lines = capsys.readouterr().err.strip().splitlines()
    folder = tmp_path / "runs" / "mrpc-seed42" / "checkpoints"
    assert lines[-1].startswith(
        f"omnibert-finetune: error: could not write the checkpoint {folder}/last.ckpt: No space "
        "left on device (ENOSPC); it needs about "
    ), lines[-1]
    assert lines[-1].endswith(
        f" at step 4, so the run stops; {folder}/last.ckpt (step 2) is intact: free space there "
        "(or set paths.checkpoint_dir to a file system with room), and resume with "
        "ckpt_path=last"
    ), lines[-1]
    assert not any("Traceback" in line for line in lines)
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 2
    monkeypatch.undo()
    summary = finetune.run_or_exit(_finetune(tmp_path, tiny_hf, train, *saving, "ckpt_path=last"))
    assert summary["steps"] == 6
    assert sorted(p.name for p in folder.iterdir()) == ["final.ckpt", "last.ckpt"]
    for name in ("final.ckpt", "last.ckpt"):  # the end, in both
        assert torch.load(folder / name, weights_only=True)["global_step"] == 6, name


def test_a_stop_inside_a_step_keeps_the_last_completed_step_and_resumes_bitwise(
    tmp_path, tiny_hf, uninterrupted, capsys
):
    """SIGTERM at micro-batch 2 of 4 of step 3 (task.batch_size=8, micro_batch_size=2): one
    line, exit code 143, the partial step dropped and ``last.ckpt`` of step 2 written, no
    traceback; a resume with another micro batch is refused in one sentence (the position
    counts micro-batches); ``ckpt_path=last`` goes on from step 2's data position, with
    dropout, to the weights of an uninterrupted run, bit for bit. The interrupted and resumed runs read with
    a loader worker, the uninterrupted one without: the order is the sampler's alone."""
    from omnibert.apps import finetune

    train, whole, _ = uninterrupted  # 6 steps of 4 micro-batches
    micro = ["micro_batch_size=2", "data.num_workers=1"]
    term = ["+callbacks.term._target_=faults.SignalAtMicroBatch", "+callbacks.term.step=3",
            "+callbacks.term.micro_batch=2"]  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        finetune.run_or_exit(_finetune(tmp_path, tiny_hf, train, *micro, *term))
    assert stopped.value.code == 143
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).strip().splitlines()
    assert lines[-1] == (
        "omnibert-finetune: stopped by SIGTERM in step 3 (micro-batch 2 of 4; the partial step "
        "is dropped; the checkpoint is of step 2); resume with ckpt_path=last"
    ), lines
    assert not any("Traceback" in line for line in lines)
    folder = tmp_path / "runs" / "mrpc-seed42" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 2
    with pytest.raises(SystemExit) as refused:  # its data position counts micro-batches of 2
        finetune.run_or_exit(
            _finetune(tmp_path, tiny_hf, train, "micro_batch_size=4", "ckpt_path=last")
        )
    assert refused.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "omnibert-finetune: error: the checkpoint's data sampler was saved with batch_size=2 "
        "(now 4), so its position means nothing here; resume with the same data, "
        "micro_batch_size (task.batch_size / devices when null), accelerator.devices and seed, "
        "or start a fresh run."
    )
    summary = finetune.run_or_exit(_finetune(tmp_path, tiny_hf, train, *micro, "ckpt_path=last"))
    assert summary["steps"] == 6 and summary["plan"]["ckpt_path"] == str(folder / "last.ckpt")
    want = torch.load(whole["checkpoint"], weights_only=True)["state_dict"]
    got = torch.load(summary["checkpoint"], weights_only=True)["state_dict"]
    assert want.keys() == got.keys()
    assert [name for name, value in want.items() if not torch.equal(got[name], value)] == []


def test_limit_train_batches_cuts_each_epoch_and_the_plan_counts_its_steps(
    tmp_path, tiny_hf, capsys
):
    """``trainer.limit_train_batches`` is Lightning's: each epoch stops after that many micro
    batches, and the plan (steps, schedule, step count printed) counts what runs, so the
    learning rate ends its decay at the last step that runs."""
    from omnibert.apps import finetune

    train = mrpc_file(tmp_path / "train.tsv", 48, seed=1)  # 6 micro batches of 8 an epoch
    summary = finetune.run(_finetune(tmp_path, tiny_hf, train, "task.epochs=2",
                                     "+trainer.limit_train_batches=2"))  # fmt: skip
    assert summary["steps"] == 4  # 2 epochs x 2 micro batches (no accumulation)
    assert "2 steps/epoch x 2 epochs = 4 steps" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("limit", "words"),
    [
        ("0", "trainer.limit_train_batches=0 leaves no training batch of the 2 an epoch holds"),
        ("1.5", "trainer.limit_train_batches=1.5 must be a count of micro batches (an integer) "
                "or a share of each epoch in [0, 1]"),
    ],
)  # fmt: skip
def test_a_limit_that_trains_nothing_is_refused_before_compute(
    tmp_path, tiny_hf, mrpc_train, limit, words
):
    from omnibert.config import FinetuneConfig
    from omnibert.finetune.tokenizer import FineTuneInputError
    from omnibert.run.finetuning.job import prepare

    cfg = _finetune(tmp_path, tiny_hf, mrpc_train, f"+trainer.limit_train_batches={limit}")
    with pytest.raises(FineTuneInputError) as refused:
        prepare(FinetuneConfig.of(cfg, FineTuneInputError))
    assert str(refused.value).startswith(words)
