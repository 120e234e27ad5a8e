"""Checkpoints written by Lightning < 2.5 inside ``on_train_batch_end`` that resume with the
next batch, as Lightning 2.5's do (:class:`CompletedBatchProgress`)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from omnibert.compat import lightning_resumes_after_batch_end

__all__ = ["CompletedBatchProgress"]


class CompletedBatchProgress(Callback):
    """Lightning < 2.5: a checkpoint written in ``on_train_batch_end`` (``every_n_train_steps``
    saves there) records the batch as processed but not yet completed, and a run resumed
    from it trains that batch index again: one extra micro-batch, accumulation boundaries
    shifted by one, and at the end of an epoch an extra step in the finished epoch (Lightning
    issues #14579 and #19815; Lightning 2.5 corrects the counters on restart, PR #20379).

    On those versions this callback rewrites the loop counters of the checkpoint being
    written to what Lightning 2.5 restores: the batch completed (its optimiser step counted
    for the loggers' step) and, when it was the last of its epoch and no validation is due
    after it, the epoch finished, so that the resumed run continues with the next batch
    (a validation due after the batch still runs first, as it would have). It changes
    nothing on Lightning >= 2.5. ``omnibert-train`` always adds it; the resume tests
    (tests/test_datamodule.py, test_train_resume.py, test_lamb_lightning.py) prove it under
    Lightning 2.3 in the IPU environment (scripts/envs/ipu_env.sh).
    """

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if lightning_resumes_after_batch_end():
            return
        fit = checkpoint.get("loops", {}).get("fit_loop")
        progress = (fit or {}).get("epoch_loop.batch_progress")
        if not progress:
            return
        current = progress["current"]
        if current["processed"] != current["completed"] + 1:  # not inside on_train_batch_end
            return
        for scope in ("total", "current"):
            progress[scope]["completed"] = progress[scope]["processed"]
        loop = trainer.fit_loop.epoch_loop
        if not loop._should_accumulate():  # Lightning counts it after on_train_batch_end
            state = fit.setdefault("epoch_loop.state_dict", {})
            state["_batches_that_stepped"] = int(state.get("_batches_that_stepped", 0)) + 1
        last = progress.get("is_last_batch") or current["completed"] >= trainer.num_training_batches
        fetcher: Any = trainer.fit_loop._data_fetcher  # set while fitting
        if last and not loop._should_check_val_fx(fetcher):
            _finish_epoch(fit)


def _finish_epoch(fit: dict[str, Any]) -> None:
    """The fit loop's counters as after its epoch-end: the epoch processed and completed, the
    per-epoch counters reset as a new epoch resets them (what Lightning 2.5 restores)."""
    for counts in fit["epoch_progress"].values():
        counts["processed"] = counts["completed"] = counts["ready"]
    fit["epoch_loop.batch_progress"]["is_last_batch"] = False
    for key in ("epoch_loop.batch_progress", "epoch_loop.scheduler_progress"):
        _zero(fit.get(key, {}).get("current"))
    optimizer = fit.get("epoch_loop.automatic_optimization.optim_progress", {}).get("optimizer", {})
    for tracker in optimizer.values():
        _zero(tracker.get("current"))
    _zero(fit.get("epoch_loop.val_loop.batch_progress", {}).get("total"))


def _zero(counts: Any) -> None:
    if isinstance(counts, dict):
        for key, value in counts.items():
            if isinstance(value, int):
                counts[key] = 0
