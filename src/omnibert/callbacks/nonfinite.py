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
gradient and what to do, exit code 65. Every rank sees the same all-reduced gradients, so
every rank decides the same at the same step.

The advice holds when followed literally (docs/faults.md). A resume replays the same batches,
so it helps only from weights whose loss was finite:

* the loss was finite (only the gradients were not: an fp16 loss scale, a transient fault):
  ``last.ckpt`` holds the last good step's weights; resume it with ``ckpt_path=last`` and a
  lower learning rate (the key and a value: a tenth of the run's, at most the recipe's);
* the loss itself was not finite: the last good step's weights already give a non-finite
  loss (a diverged update left them finite but huge), so the advice names the newest kept
  checkpoint from before that update, whose weights are finite (checked) and gave finite
  gradients: ``ckpt_path=<that file> <lr key>=<value>``; the checkpoint callback holds that
  file back from pruning while steps are skipped (:meth:`PretrainingCheckpoint.hold`). When
  no such file is kept the advice is to start afresh under a new ``run_name``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from omnibert.checkpoints.saving import save_now
from omnibert.errors import RunFailed
from omnibert.optim.nonfinite import first_nonfinite_gradient, guard, mark_pending, skipped

__all__ = ["NonFiniteAdvice", "NonFiniteSteps", "NonFiniteStop"]

log = logging.getLogger(__name__)


class NonFiniteStop(RunFailed):
    """Training stopped because its gradients were not finite (module docstring)."""

    exit_code = 65  # sysexits' EX_DATAERR: the numbers went wrong


@dataclass(frozen=True)
class NonFiniteAdvice:
    """What the stop's advice names: the learning-rate key the user types (``optimizer.lr``;
    fine-tuning: ``task.lr``), the run's peak LR, the recipe's (the suggestion's ceiling;
    None: none known) and the run's name (a fresh start takes another)."""

    lr_key: str = "optimizer.lr"
    lr: float | None = None
    recipe_lr: float | None = None
    run_name: str | None = None

    def lower_lr(self) -> str:
        """``<lr key>=<a tenth of the run's LR, at most the recipe's>``."""
        if self.lr is None or not math.isfinite(self.lr) or self.lr <= 0:
            return f"a lower {self.lr_key}"
        value = self.lr / 10
        if self.recipe_lr is not None and 0 < self.recipe_lr < value:
            value = self.recipe_lr
        return f"{self.lr_key}={value:.3g}"


class NonFiniteSteps(pl.Callback):
    """See the module docstring. ``policy``: ``skip`` or ``stop``."""

    def __init__(
        self, policy: str = "skip", max_consecutive: int = 10, advice: NonFiniteAdvice | None = None
    ) -> None:
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
        self.advice = advice or NonFiniteAdvice()
        self._held: tuple[str, int] | None = None  # the checkpoint from before the streak

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
            if self.consecutive:
                self._hold(trainer, None)  # the streak ended: that file may be pruned again
            self.consecutive = 0
        else:
            self._skipped(trainer, pl_module, step)
        every = int(getattr(trainer, "log_every_n_steps", 0) or 0)
        if trainer.loggers and every > 0 and step % every == 0:  # log() is not free
            pl_module.log("train/nonfinite_steps", float(self.skipped_steps), on_step=True)

    def _skipped(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int) -> None:
        self.skipped_steps += 1
        self.consecutive += 1
        if len(self.steps) < 100:
            self.steps.append(step)
        loss = getattr(pl_module, "last_step_loss", lambda: None)()
        name = first_nonfinite_gradient(pl_module.named_parameters())
        what = f"loss {_number(loss)}, first non-finite gradient {name or '(none found)'}"
        good = step - self.consecutive
        if self.consecutive == 1:  # a streak starts: keep what came before its last update
            self._hold(trainer, good - 1)
        if self.policy == "skip" and self.consecutive <= self.max_consecutive:
            if trainer.is_global_zero:
                log.warning(
                    "step %d skipped: its gradients are not finite (%s); weights, optimiser "
                    "and LR schedule are as after step %d (%d in a row, at most "
                    "trainer.nonfinite_max_consecutive=%d)",
                    *(step, what, good, self.consecutive, self.max_consecutive),
                )
            return
        checkpoint = save_now(trainer)
        row = (
            f"steps {good + 1} to {step} ({self.consecutive} in a row, more than "
            f"trainer.nonfinite_max_consecutive={self.max_consecutive})"
            if self.policy == "skip"
            else f"step {step} (trainer.nonfinite=stop)"
        )
        finite_loss = loss is None or math.isfinite(loss)
        raise NonFiniteStop(
            f"the gradients were not finite in {row}; at step {step}: {what}; "
            + (
                self._resume_last(checkpoint, good)
                if finite_loss
                else self._resume_before(trainer, good)
            )
        )

    def _resume_last(self, checkpoint: str | None, good: int) -> str:
        """The advice when the loss was finite: the last good step's weights, resumed."""
        kept = (
            f"{checkpoint} holds the weights of step {good}, the last good one; "
            if checkpoint
            else ""
        )
        return (
            f"{kept}try a lower learning rate ({self.advice.lower_lr()}) or a longer warm-up, "
            "trainer=bf16 instead of fp16 (or a lower initial loss scale), or check the data "
            "of those steps" + (", then resume with ckpt_path=last" if checkpoint else "")
        )

    def _resume_before(self, trainer: pl.Trainer, good: int) -> str:
        """The advice when the loss itself was not finite: the weights of step ``good`` give
        it, so the newest kept checkpoint from before step ``good``'s update, or a fresh
        start (module docstring)."""
        found = self._finite_before(trainer, good) if trainer.is_global_zero else None
        found = trainer.strategy.broadcast(found)
        lower = self.advice.lower_lr()
        said = (
            f"the loss itself was not finite: the weights after step {good}, the last step "
            "whose gradients were finite, give a non-finite loss, and a resume replays the "
            "same batches"
        )
        if found is None:
            value = lower.partition("=")[2]
            run = self.advice.run_name
            fresh = f"run_name={run}-lr{value}" if value and run else "run_name=<a new name>"
            return (
                f"{said}; no checkpoint kept holds finite weights from before step {good}, "
                f"so start afresh with a lower learning rate under a new run name: {fresh} "
                f"{lower} (or check the data of those steps)"
            )
        path, step = found
        return (
            f"{said}; {path} holds the finite weights of step {step}, from before that "
            f"update: resume from it with a lower learning rate: ckpt_path={path} {lower} "
            "(or check the data of those steps)"
        )

    def _finite_before(self, trainer: pl.Trainer, good: int) -> tuple[str, int] | None:
        """The newest kept step checkpoint of this run's history at a step before ``good``
        whose weights are all finite, as (path, step)."""
        callback: Any = trainer.checkpoint_callback
        kept = dict(getattr(callback, "step_checkpoints", dict)())
        if self._held is not None:
            kept[self._held[0]] = self._held[1]
        for path, step in sorted(kept.items(), key=lambda item: -item[1]):
            if step < good and _finite_weights(path):
                return path, step
        return None

    def _hold(self, trainer: pl.Trainer, before: int | None) -> None:
        """Keep the newest step checkpoint at a step <= ``before`` from being pruned (None:
        release the one held)."""
        callback: Any = trainer.checkpoint_callback
        if not hasattr(callback, "hold"):
            return
        self._held = None
        if before is not None:
            kept = {p: s for p, s in callback.step_checkpoints().items() if s <= before}
            if kept:
                self._held = max(kept.items(), key=lambda item: item[1])
        callback.hold(None if self._held is None else self._held[0])

    def summary(self) -> dict[str, Any]:
        return {"nonfinite_skipped_steps": self.skipped_steps, "nonfinite_steps": self.steps}


def _number(value: float | None) -> str:
    if value is None:
        return "unknown"
    return str(value) if not math.isfinite(value) else f"{value:.4f}"


def _finite_weights(path: str | Path) -> bool:
    """Every tensor of the checkpoint's ``state_dict`` is finite (read memory-mapped)."""
    from omnibert.compat import load_checkpoint

    try:
        state = load_checkpoint(path, mmap=True).get("state_dict") or {}
    except Exception:
        return False
    return all(
        bool(torch.isfinite(tensor).all())
        for tensor in state.values()
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point()
    )
