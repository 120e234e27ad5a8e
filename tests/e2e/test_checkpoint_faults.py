"""A checkpoint that cannot be written (a full disk, a quota, the file size limit, a read-only
remount, an I/O error), in one process: the file it was to replace stays as it was and loads,
no temporary file is left, the message names the path, the error, the bytes needed and free;
``on_write_error=stop`` ends the run (exit code 74), ``skip`` warns and tries again, and
Lightning's bookkeeping never names a file that is not there. ``keep_last`` bounds the files
kept, and the plan's estimate of a checkpoint's size is within 10 % of a real one. Real
processes whose writes really fail: tests/e2e/test_disk_full.py."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest
import torch
from faults import FailingCheckpointWrites

from omnibert.apps.train import run_or_exit
from omnibert.checkpoints.saving import PretrainingCheckpoint
from omnibert.checkpoints.writing import TMP_MARKER, AtomicCheckpointIO, CheckpointWriteError
from omnibert.config import TrainConfig
from omnibert.errors import UserError

#: experiment=smoke with a checkpoint every 2 steps, no validation during training
SMOKE = ("experiment=smoke", "val_every_n_steps=null", "callbacks.checkpoint.every_n_train_steps=2")


def _state(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((20000,), value)}


@pytest.mark.parametrize(
    ("stage", "code"),
    [("write", errno.ENOSPC), ("fsync", errno.EIO), ("rename", errno.EROFS),
     ("write", errno.EDQUOT), ("write", errno.EFBIG)],
)  # fmt: skip
def test_a_failed_write_keeps_the_file_it_was_to_replace(tmp_path, monkeypatch, stage, code):
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(_state(1.0), target)
    failing = FailingCheckpointWrites(("last.ckpt",), stage, code).install(monkeypatch)
    with pytest.raises(CheckpointWriteError) as raised:
        AtomicCheckpointIO().save_checkpoint(_state(2.0), target)
    assert failing.failures >= 1
    error = raised.value
    assert error.exit_code == 74 and error.errno == code
    text = str(error)
    assert text.startswith(f"could not write the checkpoint {target}: {os.strerror(code)} "
                           f"({errno.errorcode[code]}); it needs about 80.5 KiB and ")  # fmt: skip
    assert text.endswith(" are free on that file system"), text
    assert torch.equal(torch.load(target, weights_only=True)["w"], _state(1.0)["w"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temporary file


def test_the_kernel_refusing_a_write_is_handled_the_same(tmp_path):
    """A real ENOSPC from the kernel: the temporary file the write goes to is /dev/full."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    target = tmp_path / "step-00000004.ckpt"
    (tmp_path / f".{target.name}{TMP_MARKER}{os.getpid()}").symlink_to("/dev/full")
    with pytest.raises(CheckpointWriteError) as raised:
        AtomicCheckpointIO().save_checkpoint(_state(1.0), target)
    assert raised.value.errno == errno.ENOSPC
    assert "No space left on device (ENOSPC)" in str(raised.value)
    assert list(tmp_path.iterdir()) == []  # the temporary (here: the link) is gone


def _run(compose_config, root: Path, *overrides: str) -> dict:
    return run_or_exit(compose_config(*SMOKE, *overrides, root=root), None)


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "smoke" / "checkpoints").iterdir())


def _step(path: Path) -> int:
    return int(torch.load(path, weights_only=True, mmap=True)["global_step"])


def _bookkeeping_names_only_files(path: Path) -> None:
    """The checkpoint callback's state saved in ``path`` names files that exist."""
    saved = torch.load(path, weights_only=True, mmap=True)["callbacks"]
    (state,) = [v for k, v in saved.items() if k.startswith("PretrainingCheckpoint")]
    for name in [*state["best_k_models"], state["last_model_path"], state["best_model_path"]]:
        assert Path(name).is_file(), name


def test_stop_ends_the_run_in_one_line_and_it_resumes(
    tmp_path, monkeypatch, capsys, compose_config
):
    """The write of step 4 fails: exit code 74, one line naming the path, the error, the bytes
    and what is intact; ``last.ckpt`` of step 2 loads and resumes to the end; with keep_last=1
    the resumed run's first save prunes step 2 (the bookkeeping was put back)."""
    failing = FailingCheckpointWrites(("step-00000004",)).install(monkeypatch)
    with pytest.raises(SystemExit) as stopped:
        _run(compose_config, tmp_path, "callbacks.checkpoint.keep_last=1")
    assert stopped.value.code == 74 and failing.failures == 1
    lines = capsys.readouterr().err.strip().splitlines()
    folder = tmp_path / "smoke" / "checkpoints"
    assert lines[-1].startswith(
        f"omnibert-train: error: could not write the checkpoint {folder}/step-00000004.ckpt: "
        "No space left on device (ENOSPC); it needs about "
    ), lines[-1]
    assert lines[-1].endswith(
        f" at step 4, so the run stops; {folder}/last.ckpt (step 2) is intact: free space there "
        "(or lower callbacks.checkpoint.keep_last, or set paths.checkpoint_dir to a file system "
        "with room), and resume with ckpt_path=last"
    ), lines[-1]
    assert not any("Traceback" in line for line in lines)
    assert _files(tmp_path) == ["last.ckpt", "step-00000002.ckpt"]
    assert _step(folder / "last.ckpt") == 2
    monkeypatch.undo()
    _run(compose_config, tmp_path, "callbacks.checkpoint.keep_last=1", "ckpt_path=last")
    assert _files(tmp_path) == ["last.ckpt", "step-00000006.ckpt"]
    assert _step(folder / "last.ckpt") == 6
    _bookkeeping_names_only_files(folder / "last.ckpt")


def test_skip_warns_once_and_writes_at_the_next_interval(
    tmp_path, monkeypatch, caplog, compose_config
):
    failing = FailingCheckpointWrites(("step-00000004",), "fsync").install(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="omnibert.checkpoint"):
        summary = _run(
            compose_config, tmp_path, "callbacks.checkpoint.keep_last=1",
            "callbacks.checkpoint.on_write_error=skip",
        )  # fmt: skip
    assert summary["steps"] == 6 and failing.failures == 1
    warnings = [r.getMessage() for r in caplog.records if "could not write" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "No space left on device (ENOSPC)" in warnings[0]
    assert "at step 4; training goes on and tries again at step 6" in warnings[0]
    assert "last.ckpt (step 2) is intact" in warnings[0]
    # keep_last=1: step 6's save removed step 2, which the failed save of step 4 had not
    assert _files(tmp_path) == ["last.ckpt", "step-00000006.ckpt"]
    last = tmp_path / "smoke" / "checkpoints" / "last.ckpt"
    assert _step(last) == 6
    _bookkeeping_names_only_files(last)


def test_skip_still_fails_when_the_final_state_cannot_be_written(
    tmp_path, monkeypatch, capsys, compose_config
):
    """last.ckpt of the last step fails (after its step-*.ckpt was written): the step file is
    removed again, and the end of training, which must keep that state, ends the run."""
    FailingCheckpointWrites(("last.ckpt",), "rename", errno.EROFS).install(monkeypatch)
    with pytest.raises(SystemExit) as stopped:
        _run(
            compose_config, tmp_path, "callbacks.checkpoint.on_write_error=skip",
            "callbacks.checkpoint.every_n_train_steps=3",
        )  # fmt: skip
    assert stopped.value.code == 74
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "could not write the checkpoint" in line and "last.ckpt: Read-only file system" in line
    assert (
        "at step 6 (step-00000006.ckpt, written just before, is removed again), so the "
        "state of this step is not saved; no checkpoint of this run was written before" in line
    )
    assert _files(tmp_path) == []


def test_the_final_save_failing_after_skipped_ones_ends_the_run(
    tmp_path, monkeypatch, capsys, compose_config
):
    FailingCheckpointWrites(("step-00000006",)).install(monkeypatch)
    with pytest.raises(SystemExit) as stopped:
        _run(compose_config, tmp_path, "callbacks.checkpoint.on_write_error=skip")
    assert stopped.value.code == 74
    line = capsys.readouterr().err.strip().splitlines()[-1]
    folder = tmp_path / "smoke" / "checkpoints"
    assert line.endswith(
        f"at step 6, so the state of this step is not saved; {folder}/last.ckpt (step 4) is "
        "intact: free space there (or lower callbacks.checkpoint.keep_last, or set "
        "paths.checkpoint_dir to a file system with room), and resume with ckpt_path=last"
    ), line
    assert _files(tmp_path) == ["last.ckpt", "step-00000002.ckpt", "step-00000004.ckpt"]


def test_a_run_of_phases_says_to_run_the_same_command(
    tmp_path, monkeypatch, capsys, compose_config
):
    """A run of several phases refuses ckpt_path (each phase resumes by itself): the line
    says so."""
    FailingCheckpointWrites(("step-00000004",)).install(monkeypatch)
    with pytest.raises(SystemExit) as stopped:
        run_or_exit(compose_config("experiment=smoke_two_phase", root=tmp_path), None)
    assert stopped.value.code == 74
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.endswith("and resume with the same command (no ckpt_path)"), line
    assert "smoke-phase1/checkpoints/last.ckpt (step 2) is intact" in line, line


def test_a_lower_keep_last_on_resume_prunes_down_to_it(tmp_path, compose_config):
    every_step = "callbacks.checkpoint.every_n_train_steps=1"
    _run(compose_config, tmp_path, every_step, "phase.max_steps=4")
    assert _files(tmp_path) == ["last.ckpt", *(f"step-0000000{s}.ckpt" for s in (2, 3, 4))]
    _run(compose_config, tmp_path, every_step, "callbacks.checkpoint.keep_last=1", "ckpt_path=last")
    assert _files(tmp_path) == ["last.ckpt", "step-00000006.ckpt"]
    _bookkeeping_names_only_files(tmp_path / "smoke" / "checkpoints" / "last.ckpt")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["callbacks.checkpoint.keep_last=-1"],
         "callbacks.checkpoint.keep_last=-1 must be a whole number of at least 0 (or null to keep "
         "every step checkpoint); fix callbacks.checkpoint.keep_last."),
        (["callbacks.checkpoint.on_write_error=retry"],
         "callbacks.checkpoint.on_write_error='retry' must be stop (end the run, exit code 74) or "
         "skip (warn and try again at the next interval); fix callbacks.checkpoint.on_write_error."),
        (["callbacks.checkpoint.keep_last=2", "callbacks.checkpoint.save_top_k=5"],
         "callbacks.checkpoint.save_top_k=5 disagrees with callbacks.checkpoint.keep_last=2; "
         "save_top_k is an older name of keep_last: drop it and set "
         "callbacks.checkpoint.keep_last=5 (null keeps every step checkpoint)."),
    ],
)  # fmt: skip
def test_checkpoint_keys_are_checked(compose_config, overrides, message):
    with pytest.raises(UserError) as refused:
        TrainConfig.of(compose_config("experiment=smoke", *overrides))
    assert str(refused.value) == message


def test_keep_last_sets_save_top_k_and_save_top_k_is_an_alias(compose_config):
    def keep(*overrides: str) -> int | None:
        config = TrainConfig.of(compose_config("experiment=smoke", *overrides))
        assert config.checkpointing is not None
        return config.checkpointing.keep_last

    assert keep() == 3
    assert keep("callbacks.checkpoint.keep_last=null") is None
    assert keep("callbacks.checkpoint.save_top_k=-1") is None  # older command lines
    assert keep("callbacks.checkpoint.save_top_k=5", "callbacks.checkpoint.keep_last=5") == 5
    assert PretrainingCheckpoint(keep_last=None).save_top_k == -1
    assert PretrainingCheckpoint(keep_last=0).save_top_k == 0
    assert PretrainingCheckpoint(save_top_k=-1).keep_last is None
    assert PretrainingCheckpoint().save_top_k == 3


#: bert_tiny's architecture (L2-H128, the uncased vocab's 30522 tokens) on the smoke data
BERT_TINY = ("model.config.hidden_size=128", "model.config.num_hidden_layers=2",
             "model.config.intermediate_size=512", "model.config.max_position_embeddings=512",
             "data.vocab_size=30522")  # fmt: skip


@pytest.mark.parametrize("model", [(), BERT_TINY], ids=["smoke", "bert_tiny"])
def test_the_plan_estimates_a_checkpoint_within_ten_percent(tmp_path, compose_config, model):
    from omnibert.run.pretraining.job import prepare

    overrides = (*model, "phase.max_steps=1", "callbacks.checkpoint.keep_last=0")
    plan = prepare(TrainConfig.of(compose_config(*SMOKE, *overrides, root=tmp_path))).plan
    space = plan.checkpoint_space
    assert space["at_most"] == 2  # last.ckpt and one being written
    assert dict(plan.rows())["checkpoint space"].startswith("about ")
    _run(compose_config, tmp_path, *overrides)
    real = (tmp_path / "smoke" / "checkpoints" / "last.ckpt").stat().st_size
    assert abs(space["bytes_each"] / real - 1) < 0.10, (space["bytes_each"], real)


def test_the_plan_refuses_a_disk_without_room_for_one_checkpoint(
    tmp_path, monkeypatch, compose_config
):
    from omnibert.checkpoints import space
    from omnibert.run.pretraining.job import prepare

    monkeypatch.setattr(space, "free_bytes", lambda path: 100_000)
    with pytest.raises(UserError) as refused:
        prepare(TrainConfig.of(compose_config(*SMOKE, root=tmp_path)))
    folder = tmp_path / "smoke" / "checkpoints"
    assert str(refused.value) == (
        f"paths.checkpoint_dir={folder} has 97.7 KiB free on its file system, less than one "
        "checkpoint of this run (about 250.6 KiB); free space there or set paths.checkpoint_dir "
        "to a file system with room."
    )
    monkeypatch.setattr(space, "free_bytes", lambda path: 800_000)  # 3 of 5 fit
    space = prepare(TrainConfig.of(compose_config(*SMOKE, root=tmp_path))).plan.checkpoint_space
    assert space["at_most"] == 5 and space["warning"] == (
        "the checkpoints of this run need up to 1.2 MiB (5 of about 250.6 KiB: keep_last=3, "
        f"last.ckpt and one being written) but 781.2 KiB are free for them under "
        f"paths.checkpoint_dir={folder}; a write will fail when the disk fills; set "
        "callbacks.checkpoint.keep_last=1 or free space."
    )
