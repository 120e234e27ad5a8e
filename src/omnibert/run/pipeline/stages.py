"""The run pipeline both jobs share: ``omnibert-train`` (:mod:`omnibert.run.pretraining.job`)
and ``omnibert-finetune`` (:mod:`omnibert.run.finetuning.job`) each *prepare* a
:class:`Prepared` (the typed config, the accelerator plugin, the plan, the data module and the
initial weights, all checked, no compute yet), *build* a :class:`Run` with the builders of
:mod:`omnibert.run.pipeline.builders` (callbacks, loggers, the Trainer) and *fit* it with
:func:`fit_safely`; they differ only where their jobs do (data, heads, metrics, what the
summary holds).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omnibert import stopping
from omnibert.accelerators.ddp import lost_rank
from omnibert.callbacks.stop import StopAtSafePoint
from omnibert.checkpoints.resuming import finished, resume_hint
from omnibert.data.loader_workers import LoaderWorkerDied, worker_death
from omnibert.errors import UserError
from omnibert.run.pipeline.builders import finish_loggers

__all__ = ["Prepared", "Run", "fit_safely", "timeout_s"]


@dataclass
class Prepared:
    """Everything a run derived and checked before compute."""

    #: the typed config (:class:`~omnibert.config.TrainConfig` or ``FinetuneConfig``)
    config: Any
    plugin: Any
    environment: dict[str, Any]
    #: what the run derived (``TrainPlan`` / ``FinetunePlan``: ``to_dict()``, printed)
    plan: Any
    datamodule: Any
    #: the initial weights, checked (``PretrainingInit`` / ``EncoderSource``; None: random)
    init: Any = None
    #: ``profile=true``'s settings (pretraining)
    profile: Any = None
    #: what one job alone needs (fine-tuning: its task data, splits and tokenizer)
    job: Any = None


@dataclass
class Run:
    """A built run: the prepared plan plus the task, callbacks and the Trainer."""

    prepared: Prepared
    task: Any
    trainer: Any
    callbacks: list[Any] = field(default_factory=list)
    #: what the initial weights were, in one line (None: random init or a resume)
    initialised_from: str | None = None
    #: parameters left freshly initialised (fine-tuning's new head)
    new_keys: list[str] = field(default_factory=list)


def timeout_s(run: Run) -> float | None:
    """The run's ``accelerator.timeout_s`` (None for a plugin without one)."""
    return getattr(run.prepared.plugin, "timeout_s", None)


def fit_safely(
    run: Run, finished_context: Callable[[int], str], after: Callable[[], None] | None = None
) -> float:
    """``trainer.fit`` from the plan's checkpoint, stopping at the next micro-batch boundary
    on a signal, within ``trainer.stop_within_s`` (:mod:`omnibert.callbacks.stop`); then
    (``after``: e.g. a final validation) the loggers are finished. The requeue file of a
    finished run goes. A loader worker that dies ends the run with one sentence
    (:class:`~omnibert.data.loader_workers.LoaderWorkerDied`, exit code 71) naming the
    checkpoint to resume from; a collective that fails because another rank was lost becomes
    :class:`~omnibert.errors.LostRank` (one line, no traceback). Returns the seconds ``fit``
    took."""
    prepared, trainer = run.prepared, run.trainer
    checkpoint_dir = prepared.config.paths.checkpoint_dir
    stop = next((cb for cb in run.callbacks if isinstance(cb, StopAtSafePoint)), None)
    within_s = prepared.config.trainer.stop_within_s
    start = time.perf_counter()
    try:
        late = None if stop is None else stop.late_line
        with stopping.at_safe_points(within_s=within_s, late=late):
            trainer.fit(run.task, datamodule=prepared.datamodule, ckpt_path=prepared.plan.ckpt_path)
        seconds = time.perf_counter() - start
        stopping.set_context(finished_context(trainer.global_step))
        stopping.check()  # a signal during the last validation inside fit
        if trainer.is_global_zero:  # finished: nothing left to resume after a time limit
            finished(checkpoint_dir)
        if after is not None:
            after()
    except RuntimeError as err:
        # Lightning's teardown can fail while a user error from restoring the loader
        # propagates ("Please call iter(combined_loader) first"): the user's sentence wins
        if isinstance(err.__context__, UserError):
            raise err.__context__ from None
        death = worker_death(err)  # a loader worker killed (the OOM killer): one sentence
        if death is not None:
            raise LoaderWorkerDied(f"{death}; {resume_hint(checkpoint_dir)}") from None
        with stopping.at_safe_points():  # the launcher's SIGTERM to the survivors waits
            lost = lost_rank(err, trainer.global_rank, trainer.world_size, timeout_s(run))
        if lost is not None:  # a collective failed because another rank is gone
            raise lost from None
        raise
    finally:
        finish_loggers(trainer.loggers)
    return seconds
