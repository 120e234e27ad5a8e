"""Progress as plain log lines, for runs whose stdout is not a terminal.

A progress bar written to a file (``omnibert-train ... > train.log``, a SLURM job) is a
stream of carriage returns that shows nothing until its buffer is flushed, and counts
Lightning's epochs (``Epoch 1/-2`` with ``max_epochs=-1``). :class:`ProgressLog` prints one
line every ``every_n_steps`` optimiser steps or ``every_seconds`` seconds, whichever comes
first, and after each validation:

    step 120/600 (20%)  loss 6.8123  210.4 seq/s  elapsed 0:00:19  ETA 0:01:16

Inside a long optimiser step (phase 1's 65,536-sequence batch is thousands of
micro-batches) it counts micro-batches, the first such line ``first_seconds`` (10 s) after
the start and then every ``every_seconds``:

    step 0/7038: micro-batch 40/2048 of step 1 (1,280 sequences)  elapsed 0:00:10

and a long evaluation counts its batches the same way. ``omnibert-train``,
``omnibert-finetune`` and ``omnibert-eval`` use it when stdout is not a TTY and keep the
progress bar otherwise (:func:`select_progress`, :func:`line_progress`). It is a
``ProgressBar`` so that Lightning adds no bar of its own.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ProgressBar

__all__ = ["ProgressLog", "line_progress", "select_progress"]


def _batches(trainer: pl.Trainer) -> str:
    total = sum(trainer.num_val_batches)
    return f"{int(total):,}" if total != float("inf") else "?"


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=int(max(0.0, seconds))))


class ProgressLog(ProgressBar):
    """Step-counting progress lines on stdout (module docstring); rank 0 only.

    Args:
        every_n_steps: a line every this many optimiser steps ...
        every_seconds: ... or when this many seconds passed since the last line.
        sequences_per_step: sequences in one optimiser step (the plan's global batch) for
            the seq/s column; set by the app (``omnibert-train``, ``omnibert-finetune``).
        first_seconds: the first line inside a step (or an evaluation) comes after at most
            this many seconds; later ones every ``every_seconds``.
        app: the name the lines start with.
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        every_seconds: float = 30.0,
        sequences_per_step: float | None = None,
        first_seconds: float = 10.0,
        app: str = "omnibert-train",
    ) -> None:
        super().__init__()
        self.app = app
        self.every_n_steps = max(1, int(every_n_steps))
        self.every_seconds = float(every_seconds)
        self.first_seconds = float(first_seconds)
        self.sequences_per_step = sequences_per_step
        self._enabled = True
        self._start: tuple[float, int] | None = None
        self._last: tuple[float, int] = (0.0, 0)
        self._lines = 0  # progress lines since the start (the first comes sooner)
        self._eval_start, self._eval_batches = 0.0, 0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _print(self, trainer: pl.Trainer, text: str) -> None:
        if self._enabled and trainer.is_global_zero:
            print(f"{self.app}: {text}", file=sys.stdout, flush=True)

    def _due(self, now: float) -> bool:
        wait = self.first_seconds if self._lines == 0 else self.every_seconds
        return now - self._last[0] >= wait

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        now = time.perf_counter()
        self._start = self._last = (now, trainer.global_step)
        self._lines = 0
        self._print(trainer, f"training from step {trainer.global_step} to {trainer.max_steps}")

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        *args: Any,
    ) -> None:
        step, now = trainer.global_step, time.perf_counter()
        if self._start is None:
            return
        if step == self._last[1]:  # a micro-batch inside an accumulation: no new step
            if self._due(now):
                self._print(trainer, self.micro_batch_line(trainer, step, batch_idx, now))
                self._last, self._lines = (now, step), self._lines + 1
            return
        due = step % self.every_n_steps == 0 or self._due(now)
        if due or step >= trainer.max_steps:
            self._print(trainer, self.line(trainer, pl_module, step, now))
            self._last, self._lines = (now, step), self._lines + 1

    def micro_batch_line(self, trainer: pl.Trainer, step: int, batch_idx: int, now: float) -> str:
        """Where a long optimiser step is: its micro-batches (and sequences) done so far."""
        assert self._start is not None
        accumulate = max(1, int(trainer.accumulate_grad_batches))
        done = batch_idx % accumulate + 1
        text = f"step {step}/{max(1, int(trainer.max_steps))}: micro-batch {done}/{accumulate}"
        text += f" of step {step + 1}"
        if self.sequences_per_step:
            text += f" ({done * self.sequences_per_step / accumulate:,.0f} sequences)"
        return f"{text}  elapsed {_clock(now - self._start[0])}"

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

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._eval_start, self._eval_batches = time.perf_counter(), 0
        if trainer.state.fn == "validate":  # omnibert-eval: the evaluation is the whole run
            self._last, self._lines = (self._eval_start, 0), 0
            self._print(trainer, f"evaluating {_batches(trainer)} batches")

    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        now = time.perf_counter()
        self._eval_batches += 1
        if trainer.sanity_checking or not self._due(now):
            return
        where = f"evaluation batch {self._eval_batches:,}/{_batches(trainer)}"
        if trainer.state.fn != "validate":
            where = f"step {trainer.global_step}: {where}"
        self._print(trainer, f"{where}  elapsed {_clock(now - self._eval_start)}")
        self._last, self._lines = (now, self._last[1]), self._lines + 1

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


def line_progress(app: str, enabled: bool, is_tty: bool) -> list[Any]:
    """The callbacks an app that builds its own Trainer (``omnibert-finetune``,
    ``omnibert-eval``) adds: a :class:`ProgressLog` when its progress bar is on and stdout
    is not a terminal (Lightning's bar otherwise)."""
    return [ProgressLog(app=app)] if enabled and not is_tty else []
