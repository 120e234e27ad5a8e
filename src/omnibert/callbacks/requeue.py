"""Checkpoint at the time limit, then let submitit requeue the job.

Under submitit (``hydra/launcher=slurm|local``), the scheduler sends a signal (``USR2`` by
default, ``signal_delay_s`` before the limit) and submitit's handler requeues the job and exits
at once, wherever training is. :class:`CheckpointOnSignal` takes that signal over for the
duration of ``fit``: it only notes it, lets the current optimiser step finish, writes
``last.ckpt`` (atomically, with the data position, optimiser, schedule and RNG states, like
any checkpoint of the run) with ``resume.json`` beside it, and then hands the signal to
submitit's handler, which requeues the job with its original command. The requeued job finds
``resume.json`` and resumes from that checkpoint with exactly the next batch
(:func:`omnibert.checkpoints.resuming.resolve_ckpt_path`); the file goes when the run finishes.
Under several processes every rank learns of the signal at the same step (one all-reduce per step).
Outside submitit the callback does nothing."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl

from omnibert.callbacks.stop import SignalAtStepEnd
from omnibert.checkpoints.resuming import RESUME_FILE

__all__ = ["CheckpointOnSignal", "submitit_signal"]


def submitit_signal() -> int | None:
    """The signal submitit's job handler listens to, or None outside a submitit job."""
    try:
        import submitit
    except ImportError:  # the slurm extra is not installed: not a submitit job
        return None
    try:
        submitit.JobEnvironment()  # raises outside a submitit job
        return int(submitit.JobEnvironment._usr_sig())
    except Exception:
        return None


class CheckpointOnSignal(SignalAtStepEnd):
    """See the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.signum = submitit_signal()
        self._pending: tuple[int, FrameType | None] | None = None
        self.saved: str | None = None

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self._pending = (signum, frame)

    def install(self, trainer: pl.Trainer) -> tuple[int, Any] | None:
        if self.signum is None:
            return None
        return self.signum, signal.signal(self.signum, self._note)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        if self.signum is None or not self.stepped(trainer):
            return  # outside submitit, or inside an accumulation group
        if not self.any_rank(trainer, pl_module, int(self._pending is not None)):
            return
        checkpointing: Any = trainer.checkpoint_callback
        dirpath = getattr(checkpointing, "dirpath", None) or trainer.default_root_dir
        path = Path(str(dirpath)) / "last.ckpt"
        if checkpointing is not None:  # its own last.ckpt, so the resumed run overwrites it
            checkpointing.last_model_path = str(path)  # (else Lightning writes last-v1.ckpt)
        trainer.save_checkpoint(path)
        if trainer.is_global_zero:
            note = {"checkpoint": path.name, "step": trainer.global_step, "reason": "signal"}
            (path.parent / RESUME_FILE).write_text(json.dumps(note) + "\n")
        self.saved = str(path)
        signum, frame = self._pending or (self.signum, None)
        self.restore()
        handler = signal.getsignal(signum)
        if callable(handler):
            handler(signum, frame)  # submitit: requeue (rank 0) and exit
