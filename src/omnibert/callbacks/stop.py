"""Stop a fit at the first micro-batch boundary after SIGTERM or SIGINT, within a bound.

:mod:`omnibert.stopping` only notes the signal while Lightning fits
(:func:`omnibert.stopping.at_safe_points`). :class:`StopAtSafePoint` looks at it after every
micro-batch (``on_train_batch_end``) and after every validation batch of the fit:

* **At the end of an optimiser step** (the step's last micro-batch, where a periodic
  ``every_n_train_steps`` checkpoint is written, so a checkpoint written here resumes exactly
  like those: bitwise on CPU, with the next batch): with a checkpoint callback it saves the
  step's ``step-*.ckpt`` and ``last.ckpt`` through it (unless it saved this step already; one
  that keeps no ``last.ckpt``, as fine-tuning's ``final.ckpt``, gets a ``last.ckpt`` beside).
* **Inside an accumulation group** (micro-batch k of N, the optimiser not stepped yet), or
  **during a validation**: the model and the optimiser are still those of the last
  completed step S, so the partial step is dropped (the accumulated ``.grad`` cleared) and
  step S is checkpointed the same way, a checkpoint of exactly the format of a periodic one
  whose loop counters, data-loader position and RNG states are those of S's boundary: at
  every step boundary the callback keeps a copy of those small things (the loops'
  ``state_dict`` with the loader's, the global RNG states; not the weights), puts the RNG
  states back before the save (the task's ``on_save_checkpoint`` records them) and the
  counters into the checkpoint (:meth:`on_save_checkpoint`). ``ckpt_path=last`` then replays
  the dropped micro-batches exactly (bitwise on CPU). Nothing is written when S is already on
  disk (a periodic save of S, or the checkpoint the run resumed from). A validation dropped so
  is not repeated by the resumed run (Lightning skips a validation due at the step it resumes
  from, as after any checkpoint of that step).

Then it raises :class:`~omnibert.stopping.Stopped`, which ends ``fit`` at once (Lightning's
``Trainer.should_stop`` would first run a whole validation, and its end-of-training saves
would overwrite the checkpoint with one that resumes a new epoch) and reaches the app's
:func:`~omnibert.errors.exit_on`. Several processes learn of the signal at the same
micro-batch: one all-reduce of a flag per micro-batch and per validation batch, only when
there are several. :meth:`StopAtSafePoint.late_line` is what the deadline of
``trainer.stop_within_s`` prints when a micro-batch or the checkpoint write outlasts it
(:func:`omnibert.stopping.at_safe_points`).

While Lightning fits, its own SIGTERM handler (which ends the run with exit code 0 and no
checkpoint) is replaced by omnibert's for the duration of training, where omnibert handles
SIGTERM at all (not under submitit, whose own handler stays).
"""

from __future__ import annotations

import copy
import os
import signal
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch

from omnibert import stopping
from omnibert.checkpoints.resuming import CompletedBatchProgress
from omnibert.checkpoints.saving import save_now
from omnibert.tasks.rng_states import collect_rng_states, restore_rng_states

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


@dataclass
class _Boundary:
    """What the micro-batches of a step change besides ``.grad``, as at the end of step
    ``step``: the loops' state (batch counters, the training loader's position) and the
    global RNG states."""

    step: int
    epoch: int
    loops: dict[str, Any]
    rng: dict[str, Any]


class StopAtSafePoint(SignalAtStepEnd):
    """See the module docstring. ``hint`` ends the stop line (``None``: ``resume with
    ckpt_path=last`` when a checkpoint is on disk, else nothing); ``within_s`` is
    ``trainer.stop_within_s``, named by :meth:`late_line`."""

    def __init__(self, hint: str | None = None, within_s: float = 20.0) -> None:
        super().__init__()
        self.hint = hint
        self.within_s = float(within_s)
        self.checkpoint: str | None = None
        self._trainer: pl.Trainer | None = None
        self._boundary: _Boundary | None = None
        self._patch: _Boundary | None = None  # the boundary the checkpoint being written is of
        self._writing = False
        self._stop: stopping.Stopped | None = None

    def install(self, trainer: pl.Trainer) -> tuple[int, Any] | None:
        if not stopping.handles(signal.SIGTERM):
            return None
        return signal.SIGTERM, stopping.install(signal.SIGTERM)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._trainer, self._boundary, self._stop = trainer, None, None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        stepped = self.stepped(trainer)
        signum = self._signalled(trainer, pl_module)
        if stepped and not signum:
            self._boundary = self._take_boundary(trainer, pl_module)
            return
        if not signum:
            return
        if stepped:
            checkpoint = self._save(trainer)
            self._raise(signum, f" at step {trainer.global_step}", checkpoint, trainer)
        accumulate = max(1, int(trainer.accumulate_grad_batches))
        done = batch_idx % accumulate + 1
        where = f" in step {trainer.global_step + 1} (micro-batch {done} of {accumulate}; "
        self._stop_between_steps(trainer, signum, where + "the partial step")

    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        if trainer.state.fn != "fit":
            return
        signum = self._signalled(trainer, pl_module)
        if signum:
            where = f" at step {trainer.global_step} (the validation under way"
            self._stop_between_steps(trainer, signum, where)

    def _signalled(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
        """The signal any rank received (0: none); starts this rank's deadline when it
        learned of it from another rank."""
        signum = self.any_rank(trainer, pl_module, stopping.pending() or 0)
        if signum and not stopping.pending():
            stopping.deadline(signum)
        return signum

    @staticmethod
    def _take_boundary(trainer: pl.Trainer, pl_module: pl.LightningModule) -> _Boundary:
        """The loop counters and RNG states a checkpoint written now would hold."""
        checkpoint = {"loops": trainer._checkpoint_connector._get_loops_state_dict()}
        callbacks: list[Any] = getattr(trainer, "callbacks", [])
        for callback in callbacks:  # Lightning < 2.5: its counter correction
            if isinstance(callback, CompletedBatchProgress):
                callback.on_save_checkpoint(trainer, pl_module, checkpoint)
        return _Boundary(
            trainer.global_step,
            trainer.current_epoch,
            copy.deepcopy(checkpoint["loops"]),
            collect_rng_states(),
        )

    def _stop_between_steps(self, trainer: pl.Trainer, signum: int, where: str) -> None:
        """Drop what was done since the last step boundary, checkpoint that boundary (where
        this process crossed one and nothing holds it yet) and stop."""
        for optimizer in trainer.optimizers:
            optimizer.zero_grad(set_to_none=True)
        boundary, checkpoint = self._boundary, None
        if boundary is not None and boundary.step == trainer.global_step:
            restore_rng_states(boundary.rng)  # what the task's on_save_checkpoint records
            self._patch = boundary
            try:
                checkpoint = self._save(trainer)
            finally:
                self._patch = None
        else:  # no step completed here: the checkpoint this run resumed from holds the state
            checkpoint = self._on_disk(trainer.ckpt_path)
        if checkpoint:
            where += f" is dropped; the checkpoint is of step {trainer.global_step})"
        else:
            where += " is dropped)"
        self._raise(signum, where, checkpoint, trainer)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._patch is not None:  # after CompletedBatchProgress's, which runs earlier
            checkpoint["loops"] = copy.deepcopy(self._patch.loops)
            checkpoint["epoch"] = self._patch.epoch

    def _save(self, trainer: pl.Trainer) -> str | None:
        """The checkpoint of this step through the checkpoint callback (none written when it
        saved this step already); its path, or None without a checkpoint callback."""
        self._writing = True
        try:
            self.checkpoint = save_now(trainer)
        finally:
            self._writing = False
        return self.checkpoint

    def _raise(self, signum: int, where: str, checkpoint: str | None, trainer: pl.Trainer) -> None:
        hint = self.hint
        if hint is None:
            if checkpoint:
                hint = "resume with ckpt_path=last"
            else:
                hint = "nothing to resume" if trainer.global_step == 0 else ""
        self._stop = stopping.Stopped(signum, where, hint)
        raise self._stop

    @staticmethod
    def _on_disk(path: Any) -> str | None:
        return str(path) if path and os.path.isfile(str(path)) else None

    def late_line(self) -> str:
        """What the deadline prints (from its own thread) when the stop outlasts
        ``trainer.stop_within_s``: the stop line when the checkpoint is written (the
        teardown took the time), else where the run was and the checkpoint left intact."""
        if self._stop is not None:
            return self._stop.message
        what = "finish writing the checkpoint" if self._writing else "reach a micro-batch boundary"
        line = f"did not {what} within trainer.stop_within_s={self.within_s:g} s; stopping "
        line += "without it" if self._writing else "without a checkpoint"
        trainer = self._trainer
        previous = None
        if trainer is not None:
            checkpointing = trainer.checkpoint_callback
            for path in (getattr(checkpointing, "last_model_path", None), trainer.ckpt_path):
                previous = previous or self._on_disk(path)
        if previous is None:
            return f"{line}; nothing to resume"
        return f"{line}; resume from {previous} with ckpt_path=last"
