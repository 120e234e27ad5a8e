"""A stop that comes in time (``trainer.stop_within_s``): SIGTERM or SIGINT inside an
optimiser step of many micro-batches stops at the next micro-batch boundary, drops the partial
step and checkpoints the last completed one, which resumes bitwise; a micro-batch or a
checkpoint write that outlasts the deadline ends the process without a new checkpoint, the
previous one intact.

Real processes in their own sessions (tests/e2e/test_signals.py's :class:`Run`); every wait is on
a line the run prints (a test callback announces the micro-batch it waits at), never on time.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
import torch
from test_signals import _checkpoints, _no_traceback, _train, started
from training_state import assert_same_training_state, load_state

from omnibert.apps.compose import compose

#: 16 micro-batches of 2 in each of 3 optimiser steps (no validation, as in _train's runs)
MANY = ["phase.global_batch_size=32", "micro_batch_size=2", "phase.max_steps=3",
        "val_every_n_steps=null"]  # fmt: skip


def _pause(step: int, micro_batch: int, *extra: str) -> list[str]:
    """A test callback that waits at ``micro_batch`` of ``step`` until the signal comes."""
    return [
        "+callbacks.pause._target_=faults.PauseAtMicroBatch", f"+callbacks.pause.step={step}",
        f"+callbacks.pause.micro_batch={micro_batch}", *extra,
    ]  # fmt: skip


#: what the last completed step's checkpoint holds, for a stop and a periodic save alike
SAME_KEYS = ("global_step", "epoch", "state_dict", "optimizer_states", "lr_schedulers", "loops",
             "omnibert_rng_states")  # fmt: skip


def _assert_equal(want: object, got: object, where: str) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(want, got), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and want.keys() == got.keys(), where
        for key in want:
            _assert_equal(want[key], got[key], f"{where}.{key}")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(want) == len(got), where
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            _assert_equal(a, b, f"{where}[{i}]")
    else:
        assert want == got, f"{where}: {want!r} != {got!r}"


@pytest.mark.parametrize(
    ("signum", "group", "workers"),
    [(signal.SIGTERM, False, 0), (signal.SIGINT, True, 2)],
    ids=["TERM-process", "INT-group-2-workers"],
)
def test_a_stop_inside_a_step_keeps_the_last_step_and_resumes_bitwise(
    tmp_path: Path, signum: int, group: bool, workers: int
) -> None:
    """Stopped at micro-batch 7 of 16 of step 2 (no periodic checkpoint yet): the checkpoint
    written is step 1's, equal to the periodic checkpoint of step 1 of an uninterrupted run
    in everything that resumes (weights, optimiser, schedule, loop counters with the loader's
    position, RNG states), and resuming it ends bitwise where the uninterrupted run ends."""
    from omnibert.apps.train import run_or_exit

    steps = [*MANY, f"data.num_workers={workers}"]
    only_the_stop_saves = "callbacks.checkpoint.every_n_train_steps=100"
    command = [*_train(tmp_path, *steps, only_the_stop_saves), *_pause(2, 7)]
    with started(command, tmp_path, "train") as run:
        run.wait_for(r"PauseAtMicroBatch: waiting at micro-batch 7 of step 2")
        run.signal(signum, group)
        code, lines = run.finish()
    name = signal.Signals(signum).name
    assert code == 128 + signum, "\n".join(lines)
    assert lines[-1] == (
        f"omnibert-train: stopped by {name} in step 2 (micro-batch 7 of 16; the partial step is "
        "dropped; the checkpoint is of step 1); resume with ckpt_path=last"
    ), "\n".join(lines)
    _no_traceback(lines)
    stopped = load_state(_checkpoints(tmp_path) / "last.ckpt")
    assert stopped["global_step"] == 1
    assert (_checkpoints(tmp_path) / "step-00000001.ckpt").is_file()

    fresh_root = tmp_path / "fresh"
    fresh = ["experiment=smoke", *steps, f"paths.output_root={fresh_root}",
             "callbacks.checkpoint.every_n_train_steps=1"]  # fmt: skip
    run_or_exit(compose("pretrain", fresh), None)
    fresh_dir = fresh_root / "smoke" / "checkpoints"
    periodic = load_state(fresh_dir / "step-00000001.ckpt")
    for key in SAME_KEYS:
        _assert_equal(periodic[key], stopped[key], key)

    resume = ["experiment=smoke", *steps, f"paths.output_root={tmp_path / 'runs'}",
              only_the_stop_saves, "ckpt_path=last"]  # fmt: skip
    run_or_exit(compose("pretrain", resume), None)
    resumed = load_state(_checkpoints(tmp_path) / "last.ckpt")
    assert_same_training_state(load_state(fresh_dir / "last.ckpt"), resumed, 3)


def test_a_long_first_step_stops_without_finishing_it(tmp_path: Path) -> None:
    """The issue's reproduction, small: a first step of 1,024 micro-batches (each made slow)
    gets SIGTERM, sent to the process group once progress lines count micro-batch 3; the run
    ends at a micro-batch of that step instead of at its end, keeps nothing (no step was
    completed) and says so."""
    command = _train(
        tmp_path, "phase.global_batch_size=2048", "micro_batch_size=2", "phase.max_steps=2",
        "data.num_train_samples=4096", "callbacks.progress_log.first_seconds=0",
        "callbacks.progress_log.every_seconds=0", "+callbacks.slow._target_=faults.SlowUntilResumed",
        "+callbacks.slow.seconds=0.1",
    )  # fmt: skip
    with started(command, tmp_path, "train") as run:
        run.wait_for(r"omnibert-train: step 0/2: micro-batch 3/1024 of step 1")
        run.signal(signal.SIGTERM, group=True)
        code, lines = run.finish()
    assert code == 128 + signal.SIGTERM, "\n".join(lines)
    found = re.fullmatch(
        r"omnibert-train: stopped by SIGTERM in step 1 \(micro-batch (\d+) of 1024; the partial "
        r"step is dropped\); nothing to resume",
        lines[-1],
    )
    assert found and 3 <= int(found.group(1)) < 1024, "\n".join(lines[-5:])
    _no_traceback(lines)
    assert not list(_checkpoints(tmp_path).glob("*.ckpt"))


@pytest.mark.parametrize("in_write", [False, True], ids=["in-a-micro-batch", "in-the-write"])
def test_a_stop_past_its_deadline_keeps_the_previous_checkpoint(
    tmp_path: Path, in_write: bool
) -> None:
    """A micro-batch (or the stop's checkpoint write) held far longer than
    ``trainer.stop_within_s=0.5``: the deadline ends the process with exit code 143 and one
    line naming the checkpoint to resume from; ``last.ckpt`` is still step 2's (the periodic
    one), whole; a write it cut short left only its temporary file, which the resumed run
    removes before it finishes."""
    from omnibert.apps.train import run_or_exit

    pause = _pause(4, 1, "+callbacks.pause.hold_s=300", f"+callbacks.pause.in_write={in_write}")
    command = [*_train(tmp_path, "trainer.stop_within_s=0.5", "phase.max_steps=6"), *pause]
    with started(command, tmp_path, "train") as run:
        run.wait_for(r"PauseAtMicroBatch: waiting at micro-batch 1 of step 4")
        run.signal(signal.SIGTERM, group=False)
        run.wait_for(r"PauseAtMicroBatch: holding the " + ("checkpoint write" if in_write else
                                                           "micro-batch"))  # fmt: skip
        code, lines = run.finish()
    folder = _checkpoints(tmp_path)
    assert code == 128 + signal.SIGTERM, "\n".join(lines)
    what = (
        "finish writing the checkpoint within trainer.stop_within_s=0.5 s; stopping without it"
        if in_write
        else "reach a micro-batch boundary within trainer.stop_within_s=0.5 s; stopping without "
        "a checkpoint"
    )
    assert lines[-1] == (
        f"omnibert-train: did not {what}; resume from {folder / 'last.ckpt'} with ckpt_path=last"
    ), "\n".join(lines)
    _no_traceback(lines)
    assert load_state(folder / "last.ckpt")["global_step"] == 2
    assert not (folder / "step-00000003.ckpt").exists()
    left = sorted(p.name for p in folder.glob(".*.tmp-*"))
    assert left == ([f".step-00000003.ckpt.tmp-{run.proc.pid}"] if in_write else []), left

    resume = ["phase.max_steps=6", f"paths.output_root={tmp_path / 'runs'}", "ckpt_path=last"]
    run_or_exit(compose("pretrain", ["experiment=smoke", *resume]), None)
    assert load_state(folder / "last.ckpt")["global_step"] == 6
    assert not list(folder.glob(".*.tmp-*"))


def test_a_stop_during_a_validation_keeps_the_step_it_followed(tmp_path: Path) -> None:
    """SIGTERM while the validation after step 3 runs: that validation is dropped, step 3 (no
    periodic checkpoint: they come every 2 steps) is checkpointed as at its end, and the
    resumed run ends bitwise where an uninterrupted one ends."""
    from omnibert.apps.train import run_or_exit

    steps = ["phase.max_steps=6", "val_every_n_steps=3"]
    pause = ["+callbacks.pause._target_=faults.PauseInValidation", "+callbacks.pause.step=3"]
    with started([*_train(tmp_path, *steps), *pause], tmp_path, "train") as run:
        run.wait_for(r"PauseInValidation: waiting at validation batch 1 after step 3")
        run.signal(signal.SIGTERM, group=True)
        code, lines = run.finish()
    assert code == 128 + signal.SIGTERM, "\n".join(lines)
    assert lines[-1] == (
        "omnibert-train: stopped by SIGTERM at step 3 (the validation under way is dropped; the "
        "checkpoint is of step 3); resume with ckpt_path=last"
    ), "\n".join(lines)
    _no_traceback(lines)
    assert load_state(_checkpoints(tmp_path) / "last.ckpt")["global_step"] == 3

    run_or_exit(compose("pretrain", ["experiment=smoke", *steps, f"paths.output_root={tmp_path / 'runs'}",
                                     "ckpt_path=last"]), None)  # fmt: skip
    run_or_exit(compose("pretrain", ["experiment=smoke", *steps,
                                     f"paths.output_root={tmp_path / 'fresh'}"]), None)  # fmt: skip
    fresh = load_state(tmp_path / "fresh" / "smoke" / "checkpoints" / "last.ckpt")
    assert_same_training_state(fresh, load_state(_checkpoints(tmp_path) / "last.ckpt"), 6)
