"""Progress as plain log lines, for runs whose stdout is not a terminal.

A progress bar written to a file (``omnibert-train ... > train.log``, a SLURM job) shows
nothing until its buffer is flushed and counts Lightning's epochs (``Epoch 1/-2`` with
``max_epochs=-1``). :class:`ProgressLog` prints one line every ``every_n_steps`` optimiser
steps or ``every_seconds`` seconds, whichever comes first, and after each validation:

    step 120/600 (20%)  loss 6.8123  lr 9.87e-03  210.4 seq/s  elapsed 0:00:19  ETA 0:01:16

``omnibert-train`` keeps it when stdout is not a TTY and keeps the progress bar otherwise
(:func:`select_progress`). It is a ``ProgressBar`` so that Lightning adds no bar of its own.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ProgressBar

__all__ = ["ProgressLog", "select_progress"]


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=int(max(0.0, seconds))))


class ProgressLog(ProgressBar):
    """Step-counting progress lines on stdout (module docstring); rank 0 only.

    Args:
        every_n_steps: a line every this many optimiser steps ...
        every_seconds: ... or when this many seconds passed since the last line.
        sequences_per_step: sequences in one optimiser step (the plan's global batch) for
            the seq/s column; set by the app (``omnibert-train``, ``omnibert-finetune``).
        app: the name the lines start with.
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        every_seconds: float = 30.0,
        sequences_per_step: float | None = None,
        app: str = "omnibert-train",
    ) -> None:
        super().__init__()
        self.app = app
        self.every_n_steps = max(1, int(every_n_steps))
        self.every_seconds = float(every_seconds)
        self.sequences_per_step = sequences_per_step
        self._enabled = True
        self._start: tuple[float, int] | None = None
        self._last: tuple[float, int] = (0.0, 0)

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _print(self, trainer: pl.Trainer, text: str) -> None:
        if self._enabled and trainer.is_global_zero:
            print(f"{self.app}: {text}", file=sys.stdout, flush=True)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        now = time.perf_counter()
        self._start = self._last = (now, trainer.global_step)
        self._print(trainer, f"training from step {trainer.global_step} to {trainer.max_steps}")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        step, now = trainer.global_step, time.perf_counter()
        if self._start is None or step == self._last[1]:
            return  # a micro-batch inside an accumulation: no new step
        due = step % self.every_n_steps == 0 or now - self._last[0] >= self.every_seconds
        if due or step >= trainer.max_steps:
            self._print(trainer, self.line(trainer, pl_module, step, now))
            self._last = (now, step)

    def line(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int, now: float
    ) -> str:
        assert self._start is not None
        total = max(1, int(trainer.max_steps))
        parts = [f"step {step}/{total} ({step / total:.0%})"]
        metrics = self.get_metrics(trainer, pl_module)
        loss = metrics.get("train/loss")
        if isinstance(loss, (int, float)):
            parts.append(f"loss {loss:.4f}")
        elapsed, done = now - self._start[0], step - self._start[1]
        rate = done / elapsed if elapsed > 0 else 0.0
        if self.sequences_per_step and rate:
            parts.append(f"{rate * self.sequences_per_step:.1f} seq/s")
        parts.append(f"elapsed {_clock(elapsed)}")
        if rate:
            parts.append(f"ETA {_clock((total - step) / rate)}")
        return "  ".join(parts)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        shown = [
            f"{name.removeprefix('val/')} {float(metrics[name]):.4f}"
            for name in ("val/mlm_acc", "val/nsp_acc", "val/loss")
            if name in metrics
        ]
        if shown:
            self._print(trainer, f"validation at step {trainer.global_step}: {'  '.join(shown)}")


def select_progress(
    callbacks: Sequence[Any], is_tty: bool, sequences_per_step: float | None = None
) -> list[Any]:
    """The callbacks with one way of showing progress: the progress bar on a terminal,
    :class:`ProgressLog` otherwise (each only where configured)."""
    logs = [cb for cb in callbacks if isinstance(cb, ProgressLog)]
    bars = [cb for cb in callbacks if isinstance(cb, ProgressBar) and cb not in logs]
    drop = logs if (is_tty and bars) or not logs else bars
    for log in logs:
        log.sequences_per_step = log.sequences_per_step or sequences_per_step
    return [cb for cb in callbacks if cb not in drop]
