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

``last.ckpt`` is always the newest checkpoint, whatever changed between runs: Lightning's
version counter (``last-v1.ckpt``, ``step-00000020-v1.ckpt``: a name taken by a file its
bookkeeping does not know, e.g. after ``every_n_train_steps`` changed, which changes the
callback's state key so its state is not restored) is off, so a name is always the same
file, replaced atomically. At the start of training the bookkeeping is rebuilt from the
directory itself (:meth:`PretrainingCheckpoint.on_train_start`): ``keep_last`` counts every
step checkpoint there, earlier runs' included; files of steps after the one resumed (a
continuation the resume abandons) are the first pruned. A run resumed from another file
than ``last.ckpt`` copies it to ``last.ckpt`` first (so ``ckpt_path=last`` resumes the
state this run started from, never the abandoned continuation), and never saves the
resumed step again (Lightning would, at the first micro-batch, mid-step).
:meth:`~PretrainingCheckpoint.hold` keeps one file from being pruned while the run decides
whether it is needed (the non-finite guard's pre-divergence checkpoint).

A write that fails (:class:`~omnibert.checkpoints.writing.CheckpointWriteError`: a full
disk, a quota, a read-only remount, an I/O error) leaves the files already there untouched, and
Lightning's bookkeeping (``best_k_models``, ``last_model_path``, the step last saved) as it was
before the write, so it never names a file that does not exist and the next save prunes the
right one. ``on_write_error=stop`` (the default) ends the run with one sentence and exit code
74; ``skip`` warns (once per failed step) and tries again at the next interval. The save at the
end of training, and the one of a stop by SIGTERM (:meth:`save_final`), end the run on a
failure either way: that state would be lost.

:func:`save_now` writes a checkpoint of the state the run is in now, like the periodic ones:
what a run that has to stop in the middle of training (a signal, non-finite gradients)
leaves behind.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from omnibert.checkpoints.files import saved_step
from omnibert.checkpoints.writing import CheckpointWriteError, atomic_copy
from omnibert.config.sections import Checkpointing

__all__ = ["PretrainingCheckpoint", "save_now"]

log = logging.getLogger("omnibert.checkpoint")

_UNSET: Any = object()

#: a name of the default template, ``step-{step:08d}`` (and an older version's ``-vN``)
_NAMED_STEP = re.compile(r"step-(\d+)(?:-v\d+)?\.ckpt")

#: subtracted from the score of a step checkpoint past the step a run resumed: a continuation
#: the resume abandoned, ranked below every file of the run's own history (pruned first)
_ABANDONED = float(2**40)

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
        kwargs["enable_version_counter"] = False  # one name, one file: last.ckpt is the newest
        if _fixed_name(kwargs.get("filename")) and kwargs.get("every_n_train_steps"):
            kwargs["save_last"] = True  # the file of the end: periodic saves go to last.ckpt
        super().__init__(*args, **kwargs)
        self.keep_last = settings.keep_last
        self.on_write_error = settings.on_write_error
        self._final = False  # inside save_final: a failure always ends the run
        self._at_end = False  # inside save_final at the end of training
        self._failed_step = -1  # the step whose write failed (skip: not tried twice)
        #: this step's step-*.ckpt, written, and the bookkeeping before it (step, path, state)
        self._this_step: tuple[int, str, dict[str, Any]] | None = None
        self._held: str | None = None  # a step checkpoint kept from pruning (hold())

    @property
    def state_key(self) -> str:
        """Without the cadence (Lightning's has it): a run resumed with another
        ``every_n_train_steps`` restores this callback's state all the same."""
        return self._generate_state_key(monitor=self.monitor, mode=self.mode)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._adopt_directory(trainer)
        resumed = trainer.ckpt_path
        if resumed is None:
            return
        self._last_global_step_saved = trainer.global_step  # that state is on disk already
        last = self._last_path()
        if self.save_last and last is not None and Path(resumed).resolve() != last.resolve():
            if trainer.is_global_zero:  # ckpt_path=last: where this run started
                try:
                    atomic_copy(resumed, last)
                except CheckpointWriteError as err:
                    raise err.explain(
                        f" (a copy of {resumed}, the checkpoint this run resumes): "
                        f"{err.fix(self.keeps_fewer_possible)}, and run it again"
                    ) from None
                log.info("copied %s to %s, the state this run resumes", resumed, last)
            trainer.strategy.barrier("omnibert resumed checkpoint copied")
            self.last_model_path = str(last)

    @property
    def written_at_end_only(self) -> bool:
        """The callback's file has a fixed name (fine-tuning's ``final.ckpt``, no ``{step}``
        in ``filename``): the model of the end of training, written only then. Periodic saves
        and a stop's save write ``last.ckpt`` (turned on with ``every_n_train_steps``), the
        state to resume from, so a run that ended early never leaves a ``final.ckpt`` that
        ``omnibert-predict`` would take for the finished model."""
        return _fixed_name(self.filename)

    @property
    def keeps_fewer_possible(self) -> bool:
        """A lower ``keep_last`` would leave fewer files: the files are named by step
        (pretraining's ``step-*.ckpt``, not fine-tuning's one ``final.ckpt``) and it keeps
        some besides ``last.ckpt``, or more than one without it."""
        by_step = "{step" in str(self.filename or "")
        keeps = self.keep_last is None or self.keep_last > (0 if self.save_last else 1)
        return by_step and keeps

    def step_checkpoints(self) -> dict[str, int]:
        """The step checkpoints this run's history holds (path -> step), files of an
        abandoned continuation left out."""
        return {
            path: int(score)
            for path, score in self.best_k_models.items()
            if float(score) >= 0 and self._fs.exists(path)
        }

    def hold(self, path: str | None) -> None:
        """Keep ``path`` from being pruned (None: release the file held; it is pruned again
        as ``keep_last`` says, at the next save)."""
        previous, self._held = self._held, path
        if previous and previous != path and self._fs.exists(previous):
            step = saved_step(previous)
            if step is not None and previous not in self.best_k_models:
                self.best_k_models[previous] = torch.tensor(step)
                self._rank_again()

    def _should_remove_checkpoint(self, trainer: pl.Trainer, previous: str, current: str) -> bool:
        """Lightning's rule without its exception for the file the run resumed from: that
        state is in ``last.ckpt`` (:meth:`on_train_start`), and ``keep_last`` counts every
        step checkpoint in the directory."""
        if super()._should_remove_checkpoint(trainer, previous, current):
            return True
        if previous == current or not self.dirpath or trainer.ckpt_path is None:
            return False
        resumed = Path(previous).absolute() == Path(trainer.ckpt_path).absolute()
        return resumed and Path(str(self.dirpath)).absolute() in Path(previous).absolute().parents

    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if self._held is not None and Path(filepath) == Path(self._held):
            return  # held (hold()): forgotten by the bookkeeping, kept on disk
        super()._remove_checkpoint(trainer, filepath)

    def _last_path(self) -> Path | None:
        if not self.dirpath:
            return None
        return Path(str(self.dirpath)) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"

    def _adopt_directory(self, trainer: pl.Trainer) -> None:
        """The bookkeeping of the newest-N step checkpoints rebuilt from the directory (rank
        0 reads it): every ``step-*.ckpt`` there, scored by its step, those after the step
        this run starts from below all others (module docstring)."""
        if self.monitor != "step" or self.mode != "max" or not self.dirpath:
            return
        found: dict[str, int] = {}
        if trainer.is_global_zero:
            prefix = str(self.filename or "").split("{", 1)[0]
            fast = self.filename == "step-{step:08d}"  # the step is in the name (no file read)
            folder = Path(str(self.dirpath))
            for path in sorted(folder.glob(f"{prefix}*{self.FILE_EXTENSION}")):
                if path.name.startswith(self.CHECKPOINT_NAME_LAST):
                    continue
                named = _NAMED_STEP.fullmatch(path.name)
                step = int(named.group(1)) if named and fast else saved_step(path)
                if step is not None:  # unreadable: not ours to count or remove
                    found[str(path)] = step
        found = trainer.strategy.broadcast(found)
        now = trainer.global_step
        self.best_k_models = {
            path: torch.tensor(float(step) if step <= now else step - _ABANDONED)
            for path, step in found.items()
        }
        self._rank_again()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step == 0:
            return
        saved = self._last_global_step_saved == trainer.global_step
        if self._should_skip_saving_checkpoint(trainer) and not (
            saved and self.written_at_end_only  # the step's last.ckpt is there, not the file
        ):
            return
        self.save_final(trainer, at_end=True)

    def save_final(self, trainer: pl.Trainer, at_end: bool = False) -> None:
        """The step's ``step-*.ckpt`` and ``last.ckpt`` (what the end of training,
        ``at_end``, and a stop by a signal keep; a file of a fixed name only at the end:
        :attr:`written_at_end_only`); a failed write raises whatever ``on_write_error``
        says."""
        self._final, self._at_end = True, at_end
        try:
            candidates = self._monitor_candidates(trainer)
            last_saved = self._last_global_step_saved == trainer.global_step
            self._save_topk_checkpoint(trainer, candidates)
            if not last_saved:
                self._save_last_checkpoint(trainer, candidates)
        finally:
            self._final, self._at_end = False, False

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._reconcile()  # files removed since (a failed save, by hand) are not named
        self._rank_again()  # the k-th best under this run's keep_last (Lightning keeps none
        # until it has k files: with a lower keep_last than the saved run, a KeyError)

    def _save_topk_checkpoint(
        self, trainer: pl.Trainer, monitor_candidates: dict[str, Any]
    ) -> None:
        if self.written_at_end_only and not self._at_end:
            return  # final.ckpt is the end's; this save's state goes to last.ckpt
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
            f" at step {step}{undone}, so {what}; {kept}: "
            f"{error.fix(self.keeps_fewer_possible)}, and {resume}"
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


def save_now(trainer: pl.Trainer) -> str | None:
    """Save the current step through the run's checkpoint callback: its ``step-*.ckpt`` and
    ``last.ckpt`` (unless it saved this step already); a callback that keeps no
    ``last.ckpt`` of its own (fine-tuning's ``final.ckpt``) gets a ``last.ckpt`` beside.
    Returns the path of ``last.ckpt`` (None: the run has no checkpoint callback). A write that
    fails raises :class:`~omnibert.checkpoints.writing.CheckpointWriteError` whatever
    ``callbacks.checkpoint.on_write_error`` says: this state would be lost. Call it at
    the end of an optimiser step, where the periodic checkpoints are written, so the result
    resumes exactly like them."""
    checkpointing: Any = trainer.checkpoint_callback
    if checkpointing is None:
        return None
    if getattr(checkpointing, "save_last", False):
        if getattr(checkpointing, "_last_global_step_saved", -1) != trainer.global_step:
            if hasattr(checkpointing, "save_final"):  # a failed write ends the run (exit 74)
                checkpointing.save_final(trainer)
            else:
                candidates = checkpointing._monitor_candidates(trainer)
                checkpointing._save_topk_checkpoint(trainer, candidates)
                checkpointing._save_last_checkpoint(trainer, candidates)
        return checkpointing.last_model_path or None
    dirpath = getattr(checkpointing, "dirpath", None) or trainer.default_root_dir
    path = Path(str(dirpath)) / "last.ckpt"
    try:
        trainer.save_checkpoint(path)
    except CheckpointWriteError as err:
        step = trainer.global_step
        raise err.explain(
            f" at step {step}: {err.fix(getattr(checkpointing, 'keeps_fewer_possible', True))}, "
            "and run it again"
        ) from None
    checkpointing.last_model_path = str(path)
    return str(path)


def _fixed_name(filename: Any) -> bool:
    """A checkpoint ``filename`` without a ``{...}`` field: one file, written at the end
    (:attr:`PretrainingCheckpoint.written_at_end_only`)."""
    return filename is not None and "{" not in str(filename)
