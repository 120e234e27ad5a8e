"""``trainer.nonfinite``: what a run does with optimiser steps whose gradients are not finite.

Every optimiser of the run is guarded (:mod:`omnibert.optim.nonfinite`): a step whose global
gradient norm is NaN or inf changes nothing (weights, optimiser state, LR schedule). This
callback looks after each optimiser step at the host-side verdict the guard already has (no
read of the device), counts the skipped steps (``train/nonfinite_steps`` in the logs,
``nonfinite_skipped_steps`` in ``summary.json``) and warns once per skipped step, naming the
first parameter whose gradient is not finite. Policy ``skip`` goes on until more than
``max_consecutive`` steps in a row were skipped; ``stop`` stops at the first. A stop writes a
checkpoint of the current step (its weights are the last good step's: nothing was applied
since) and ends the run with :class:`NonFiniteStop`: one line naming the step, the loss, the
gradient and what to try, exit code 65. Every rank sees the same all-reduced gradients, so
every rank decides the same at the same step.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning.pytorch as pl

from omnibert.callbacks.saving import save_now
from omnibert.errors import RunFailed
from omnibert.optim.nonfinite import first_nonfinite_gradient, guard, mark_pending, skipped

__all__ = ["NonFiniteSteps", "NonFiniteStop"]

log = logging.getLogger(__name__)


class NonFiniteStop(RunFailed):
    """Training stopped because its gradients were not finite (module docstring)."""

    exit_code = 65  # sysexits' EX_DATAERR: the numbers went wrong


class NonFiniteSteps(pl.Callback):
    """See the module docstring. ``policy``: ``skip`` or ``stop``."""

    def __init__(self, policy: str = "skip", max_consecutive: int = 10) -> None:
        super().__init__()
        if policy not in ("skip", "stop"):
            raise ValueError(f"NonFiniteSteps policy must be skip or stop, got {policy!r}.")
        self.policy = policy
        self.max_consecutive = int(max_consecutive)
        self.skipped_steps = 0
        self.consecutive = 0
        self.steps: list[int] = []  # the steps skipped (the first 100)
        self._step = -1
        self._scaled = False  # fp16's dynamic loss scaler may skip the optimiser's call

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._step = trainer.global_step
        self._scaled = getattr(trainer.precision_plugin, "scaler", None) is not None
        for optimizer in trainer.optimizers:  # (an IPU's optimiser runs on the device: its
            guard(optimizer)  # step is never called on the host and never skipped here)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        if self._scaled:
            mark_pending(optimizer)  # stays set where the loss scaler skips the call

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        step = trainer.global_step
        if step == self._step:  # inside an accumulation
            return
        self._step = step
        if not any(skipped(o) for o in trainer.optimizers):
            self.consecutive = 0
        else:
            self._skipped(trainer, pl_module, step)
        every = int(getattr(trainer, "log_every_n_steps", 0) or 0)
        if trainer.loggers and every > 0 and step % every == 0:  # (log() costs ~0.3 ms)
            pl_module.log("train/nonfinite_steps", float(self.skipped_steps), on_step=True)

    def _skipped(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int) -> None:
        self.skipped_steps += 1
        self.consecutive += 1
        if len(self.steps) < 100:
            self.steps.append(step)
        loss = getattr(pl_module, "last_step_loss", lambda: None)()
        name = first_nonfinite_gradient(pl_module.named_parameters())
        what = f"loss {_number(loss)}, first non-finite gradient {name or '(none found)'}"
        if self.policy == "skip" and self.consecutive <= self.max_consecutive:
            if trainer.is_global_zero:
                log.warning(
                    "step %d skipped: its gradients are not finite (%s); weights, optimiser "
                    "and LR schedule are as after step %d (%d in a row, at most "
                    "trainer.nonfinite_max_consecutive=%d)",
                    *(step, what, step - self.consecutive, self.consecutive, self.max_consecutive),
                )
            return
        good = step - self.consecutive
        checkpoint = save_now(trainer)
        row = (
            f"steps {good + 1} to {step} ({self.consecutive} in a row, more than "
            f"trainer.nonfinite_max_consecutive={self.max_consecutive})"
            if self.policy == "skip"
            else f"step {step} (trainer.nonfinite=stop)"
        )
        kept = (
            f"{checkpoint} holds the weights of step {good}, the last good one; "
            if checkpoint
            else ""
        )
        raise NonFiniteStop(
            f"the gradients were not finite in {row}; at step {step}: {what}; {kept}"
            "try a lower optimizer.lr or a longer warm-up, trainer=bf16 instead of fp16 (or a "
            "lower initial loss scale), or check the data of those steps"
            + (", then resume with ckpt_path=last" if checkpoint else "")
        )

    def summary(self) -> dict[str, Any]:
        return {"nonfinite_skipped_steps": self.skipped_steps, "nonfinite_steps": self.steps}


def _number(value: float | None) -> str:
    if value is None:
        return "unknown"
    return str(value) if not math.isfinite(value) else f"{value:.4f}"
