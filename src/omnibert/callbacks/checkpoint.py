"""Checkpoints that end where training ended, keep a bounded number of files, survive a
disk that refuses a write, and resume where they stopped.

``ModelCheckpoint`` that also saves the final step, so ``last.ckpt`` is always the end:
Lightning's ``ModelCheckpoint`` (2.5) writes ``last.ckpt`` at the end of training only when it
has written nothing else in the run; when ``max_steps`` is not a multiple of
``every_n_train_steps`` the last steps would be lost and phase 2 (``init_from`` phase 1's
``last.ckpt``) would start from an older model. :class:`PretrainingCheckpoint` saves the top-k
step checkpoint and ``last.ckpt`` at the end of training unless that step is already saved.

``keep_last=N`` keeps the newest N ``step-*.ckpt`` besides ``last.ckpt`` (Lightning's
``save_top_k`` with the step monitored; :class:`omnibert.config.sections.Checkpointing`).

A write that fails (:class:`~omnibert.callbacks.checkpoint_io.CheckpointWriteError`: a full
disk, a quota, a read-only remount, an I/O error) leaves the files already there untouched, and
Lightning's bookkeeping (``best_k_models``, ``last_model_path``, the step last saved) as it was
before the write, so it never names a file that does not exist and the next save prunes the
right one. ``on_write_error=stop`` (the default) ends the run with one sentence and exit code
74; ``skip`` warns (once per failed step) and tries again at the next interval. The save at the
end of training, and the one of a stop by SIGTERM (:meth:`save_final`), end the run on a
failure either way: that state would be lost.

:class:`CompletedBatchProgress` makes checkpoints written by Lightning < 2.5 (the IPU
environment's 2.3) inside ``on_train_batch_end`` resume with the next batch, as 2.5 does.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from omnibert.callbacks.checkpoint_io import CheckpointWriteError
from omnibert.ckpt_files import saved_step
from omnibert.compat import lightning_resumes_after_batch_end
from omnibert.config.sections import Checkpointing

log = logging.getLogger("omnibert.checkpoint")

_UNSET: Any = object()

#: the bookkeeping of ModelCheckpoint a failed write puts back
_BOOKKEEPING = (
    "best_k_models", "kth_best_model_path", "kth_value", "best_model_path", "best_model_score",
    "current_score", "last_model_path", "_last_global_step_saved", "_last_checkpoint_saved",
)  # fmt: skip


class PretrainingCheckpoint(ModelCheckpoint):
    """:class:`ModelCheckpoint` plus a save of the final training step, ``keep_last`` and
    ``on_write_error`` (module docstring). ``save_top_k``, Lightning's name, is an alias of
    ``keep_last`` (:class:`~omnibert.config.sections.Checkpointing`); without it the step is
    monitored (``monitor="step"``, ``mode="max"``) unless ``monitor`` says otherwise."""

    def __init__(
        self, *args: Any, keep_last: Any = _UNSET, on_write_error: str = "stop", **kwargs: Any
    ) -> None:
        given = dict(on_write_error=on_write_error, save_top_k=kwargs.get("save_top_k"))
        if keep_last is not _UNSET:
            given["keep_last"] = keep_last
        settings = Checkpointing.of(given)
        assert settings is not None
        if kwargs.get("save_top_k") is None:  # keep_last: the newest N by step
            kwargs.setdefault("monitor", "step")
            kwargs.setdefault("mode", "max")
        kwargs["save_top_k"] = settings.save_top_k
        super().__init__(*args, **kwargs)
        self.keep_last = settings.keep_last
        self.on_write_error = settings.on_write_error
        self._final = False  # inside save_final: a failure always ends the run
        self._failed_step = -1  # the step whose write failed (skip: not tried twice)
        #: this step's step-*.ckpt, written, and the bookkeeping before it (step, path, state)
        self._this_step: tuple[int, str, dict[str, Any]] | None = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._should_skip_saving_checkpoint(trainer) or trainer.global_step == 0:
            return
        self.save_final(trainer)

    def save_final(self, trainer: pl.Trainer) -> None:
        """The step's ``step-*.ckpt`` and ``last.ckpt`` (what the end of training and a stop
        by a signal keep); a failed write raises whatever ``on_write_error`` says."""
        self._final = True
        try:
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
        finally:
            self._final = False

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._reconcile()  # files removed since (a failed save, by hand) are not named
        self._rank_again()  # the k-th best under this run's keep_last (Lightning keeps none
        # until it has k files: with a lower keep_last than the saved run, a KeyError)

    def _save_topk_checkpoint(
        self, trainer: pl.Trainer, monitor_candidates: dict[str, Any]
    ) -> None:
        before = self._bookkeeping()
        self._this_step = None
        if not self._guarded(trainer, super()._save_topk_checkpoint, monitor_candidates, before):
            return
        if self.save_last and self._last_global_step_saved == trainer.global_step:
            # written: undone should this step's last.ckpt fail
            self._this_step = (trainer.global_step, str(self._last_checkpoint_saved), before)
        elif not self.save_last:
            self._prune_beyond_keep_last(trainer)

    def _save_last_checkpoint(
        self, trainer: pl.Trainer, monitor_candidates: dict[str, Any]
    ) -> None:
        before = self._bookkeeping()
        if self._guarded(trainer, super()._save_last_checkpoint, monitor_candidates, before):
            self._this_step = None
            self._prune_beyond_keep_last(trainer)

    def _bookkeeping(self) -> dict[str, Any]:
        return {name: copy.copy(getattr(self, name, None)) for name in _BOOKKEEPING}

    def _restore(self, before: dict[str, Any]) -> None:
        for name, value in before.items():
            setattr(self, name, value)

    def _guarded(
        self, trainer: pl.Trainer, save: Callable[[pl.Trainer, dict[str, Any]], None],
        candidates: dict[str, Any], before: dict[str, Any],
    ) -> bool:  # fmt: skip
        """``save``; True when it wrote what it had to. A failed write puts the bookkeeping
        back as ``before`` (and removes this step's ``step-*.ckpt`` when ``last.ckpt`` failed
        after it, so the disk holds what ``last.ckpt`` knows), then applies
        ``on_write_error``. Every rank learns of a failure on rank 0 (only it writes)."""
        step = trainer.global_step
        if self._failed_step == step and not self._final:
            return False  # skip: this step failed already (top-k, then last.ckpt, validation)
        error: CheckpointWriteError | None = None
        try:
            save(trainer, candidates)
        except CheckpointWriteError as err:
            error = err
            if trainer.world_size > 1:  # the others wait in Trainer.save_checkpoint's barrier
                trainer.strategy.barrier("omnibert checkpoint write failed")
        if trainer.world_size > 1:
            failed = trainer.strategy.reduce_boolean_decision(error is not None, all=False)
            if failed and error is None:
                error = CheckpointWriteError(
                    f"{self.dirpath} (on rank 0)", OSError("rank 0 could not write it"), None, None
                )
        if error is None:
            return True
        self._restore(before)
        undone = ""
        if self._this_step is not None and self._this_step[0] == step:
            _, path, before_step = self._this_step
            trainer.strategy.remove_checkpoint(path)
            self._restore(before_step)
            undone = f" ({Path(path).name}, written just before, is removed again)"
        self._this_step = None
        self._reconcile()
        self._failed_step = step
        kept = self._intact(error.path)
        if self.on_write_error == "skip" and not self._final:
            every = self._every_n_train_steps
            when = f"step {step + every}" if every else "the next checkpoint"
            log.warning(
                "%s at step %d%s; training goes on and tries again at %s "
                "(callbacks.checkpoint.on_write_error=skip); %s",
                error.message, step, undone, when, kept,
            )  # fmt: skip
            return False
        what = "the state of this step is not saved" if self._final else "the run stops"
        resume = "resume with ckpt_path=last" if "intact" in kept else "run it again"
        raise error.explain(
            f" at step {step}{undone}, so {what}; {kept}: {error.fix}, and {resume}"
        )

    def _prune_beyond_keep_last(self, trainer: pl.Trainer) -> None:
        """Remove the oldest ``step-*.ckpt`` beyond ``keep_last`` (a run resumed with a lower
        ``keep_last`` than it had: Lightning prunes one file per save, only at exactly k)."""
        k = self.save_top_k
        if k < 0 or len(self.best_k_models) <= k:
            return
        newest_first = sorted(
            self.best_k_models,
            key=lambda p: float(self.best_k_models[p]),
            reverse=self.mode == "max",
        )
        for path in newest_first[k:]:
            del self.best_k_models[path]
            if self._should_remove_checkpoint(trainer, path, self.last_model_path):
                self._remove_checkpoint(trainer, path)
        self._rank_again()

    def _reconcile(self) -> None:
        """Forget files that are not there (Lightning removes the oldest ``step-*.ckpt`` right
        after a new one is written, before ``last.ckpt``; a failure then leaves it named)."""
        fs = self._fs
        gone = [path for path in self.best_k_models if not fs.exists(path)]
        for path in gone:
            del self.best_k_models[path]
        if gone:
            self._rank_again()
        if self.last_model_path and not fs.exists(self.last_model_path):
            self.last_model_path = ""

    def _rank_again(self) -> None:
        """The best and the k-th best as ``best_k_models`` now says."""
        if not self.best_k_models:
            self.best_model_path = self.kth_best_model_path = ""
            self.best_model_score = None
            self.kth_value = torch.tensor(torch.inf if self.mode == "min" else -torch.inf)
            return
        best, worst = (min, max) if self.mode == "min" else (max, min)
        score = self.best_k_models.__getitem__
        self.best_model_path = best(self.best_k_models, key=score)
        self.best_model_score = self.best_k_models[self.best_model_path]
        self.kth_best_model_path = worst(self.best_k_models, key=score)
        self.kth_value = self.best_k_models[self.kth_best_model_path]

    def _intact(self, failed: str) -> str:
        """Which checkpoint a resume would start from, in words."""
        folder = Path(str(self.dirpath or Path(failed).parent))
        last = folder / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"
        if not last.is_file():
            return "no checkpoint of this run was written before"
        step = saved_step(last)
        return f"{last} (step {'?' if step is None else step}) is intact"


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
