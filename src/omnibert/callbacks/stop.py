"""Stop a fit at the end of the optimiser step during which SIGTERM or SIGINT arrived.

:mod:`omnibert.stopping` only notes the signal while Lightning fits
(:func:`omnibert.stopping.at_safe_points`). :class:`StopAtSafePoint` looks at it once per
optimiser step, in ``on_train_batch_end`` of the step's last micro-batch: where a periodic
``every_n_train_steps`` checkpoint is written, so a checkpoint written here resumes exactly
like those (bitwise on CPU, with the next batch). With a checkpoint callback it saves the
step's ``step-*.ckpt`` and ``last.ckpt`` through it (unless it saved this step already; one
that keeps no ``last.ckpt``, as fine-tuning's ``final.ckpt``, gets a ``last.ckpt`` beside), then
raises :class:`~omnibert.stopping.Stopped`, which ends ``fit`` at once (Lightning's
``Trainer.should_stop`` would first run a whole validation, and its end-of-training saves
would overwrite the checkpoint with one that resumes a new epoch) and reaches the app's
:func:`~omnibert.errors.exit_on`. Several processes learn of the signal at the same step (one
all-reduce per step, only when there are several).

While Lightning fits, its own SIGTERM handler (which ends the run with exit code 0 and no
checkpoint) is replaced by omnibert's for the duration of training, where omnibert handles
SIGTERM at all (not under submitit, whose own handler stays).
"""

from __future__ import annotations

import signal
from typing import Any

import lightning.pytorch as pl
import torch

from omnibert import stopping
from omnibert.callbacks.saving import save_now

__all__ = ["SignalAtStepEnd", "StopAtSafePoint"]


class SignalAtStepEnd(pl.Callback):
    """What both signal callbacks share: a handler of their own on one signal while Lightning
    fits (the one it replaced is put back when training ends or fails), and a look after each
    optimiser step (:meth:`stepped`) whose answer every rank shares (:meth:`any_rank`)."""

    def __init__(self) -> None:
        super().__init__()
        self._step = -1
        self._replaced: tuple[int, Any] | None = None  # (signal, the handler it had)

    def install(self, trainer: pl.Trainer) -> tuple[int, Any] | None:
        """The (signal, handler) to take over while fitting, or None."""
        raise NotImplementedError

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._step = trainer.global_step
        self._replaced = self.install(trainer)

    def stepped(self, trainer: pl.Trainer) -> bool:
        """Whether an optimiser step ended with this micro-batch (not inside an accumulation
        group)."""
        if trainer.global_step == self._step:
            return False
        self._step = trainer.global_step
        return True

    @staticmethod
    def any_rank(trainer: pl.Trainer, pl_module: pl.LightningModule, value: int) -> int:
        """The largest ``value`` of any process (one all-reduce, only when there are several)."""
        if trainer.world_size <= 1:
            return value
        flag = torch.tensor(float(value), device=pl_module.device)
        return int(trainer.strategy.reduce(flag, reduce_op="max").item())

    def restore(self) -> None:
        if self._replaced is not None:
            signum, handler = self._replaced
            self._replaced = None
            if handler is not None:  # None: one not set from Python, which cannot be put back
                signal.signal(signum, handler)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.restore()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.restore()


class StopAtSafePoint(SignalAtStepEnd):
    """See the module docstring. ``hint`` ends the stop line (``None``: ``resume with
    ckpt_path=last`` when a checkpoint was written, else nothing)."""

    def __init__(self, hint: str | None = None) -> None:
        super().__init__()
        self.hint = hint
        self.checkpoint: str | None = None

    def install(self, trainer: pl.Trainer) -> tuple[int, Any] | None:
        if not stopping.handles(signal.SIGTERM):
            return None
        return signal.SIGTERM, stopping.install(signal.SIGTERM)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        if not self.stepped(trainer):
            return
        signum = self.any_rank(trainer, pl_module, stopping.pending() or 0)
        if not signum:
            return
        self.checkpoint = save_now(trainer)
        hint = self.hint
        if hint is None:
            hint = "resume with ckpt_path=last" if self.checkpoint else ""
        raise stopping.Stopped(signum, f" at step {trainer.global_step}", hint)
