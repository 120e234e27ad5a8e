"""The run pipeline both jobs share: ``omnibert-train`` (:mod:`omnibert.run.pretraining`) and
``omnibert-finetune`` (:mod:`omnibert.run.finetuning`) each *prepare* a :class:`Prepared`
(the typed config, the accelerator plugin, the plan, the data module and the initial weights,
all checked, no compute yet), *build* a :class:`Run` with the builders here (callbacks,
loggers, the Trainer) and *fit* it with :func:`fit_safely`; they differ only where their
jobs do (data, heads, metrics, what the summary holds).
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning.pytorch.callbacks import ProgressBar

from omnibert import stopping
from omnibert.accelerators.ddp import lost_rank
from omnibert.callbacks.nonfinite import NonFiniteAdvice, NonFiniteSteps
from omnibert.callbacks.progress import select_progress
from omnibert.callbacks.requeue import CheckpointOnSignal, submitit_signal
from omnibert.callbacks.stop import StopAtSafePoint
from omnibert.checkpoints.resuming import CompletedBatchProgress, finished, resume_hint
from omnibert.checkpoints.writing import AtomicCheckpointIO
from omnibert.config.node import Node
from omnibert.data.loader_workers import LoaderWorkerDied, worker_death
from omnibert.errors import UserError
from omnibert.logs import single_lightning_output

__all__ = [
    "Prepared",
    "Run",
    "build_callbacks",
    "build_loggers",
    "build_trainer",
    "finish_loggers",
    "fit_safely",
    "quiet_third_party_deprecations",
]


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


def quiet_third_party_deprecations() -> None:
    """Silence two deprecation warnings every run printed that come from third-party code
    calling torch's deprecated APIs, not from omnibert (matched by message and by the
    module the warning is attributed to, nothing else): torchdata's ``StatefulDataLoader``
    calls ``torch.set_vital`` (torchdata 0.11), Lightning's ``_pytree`` builds a
    ``LeafSpec`` (Lightning 2.5 with torch >= 2.10). And each Lightning log line once
    (:func:`omnibert.logs.single_lightning_output`)."""
    single_lightning_output()
    warnings.filterwarnings(
        "ignore", message=r"'set_vital' is deprecated", category=UserWarning,
        module=r"torchdata\.stateful_dataloader",
    )  # fmt: skip
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning, module=r"lightning\.pytorch\.utilities\._pytree",
    )  # fmt: skip


def build_callbacks(
    config: Any,
    sequences_per_step: float,
    extra: Iterable[Any] = (),
    advice: NonFiniteAdvice | None = None,
) -> list[Any]:
    """The configured callbacks, then what every run has: the batch counter, the safe stop
    (SIGTERM / SIGINT: checkpoint the last completed step, then stop), the non-finite step
    policy (``advice``: the keys its stop names), ``extra``, and under a submitit job the
    checkpoint at its time limit (then a requeue). One way of showing progress: the bar on a
    terminal, step-counting lines in a log file (:mod:`omnibert.callbacks.progress`)."""
    callbacks = [node.build() for node in config.callbacks]
    trainer = config.trainer
    callbacks += [
        CompletedBatchProgress(),
        StopAtSafePoint(within_s=trainer.stop_within_s),
        NonFiniteSteps(trainer.nonfinite, trainer.nonfinite_max_consecutive, advice),
        *extra,
    ]
    if submitit_signal() is not None:
        callbacks.append(CheckpointOnSignal())
    if not config.trainer.enable_progress_bar:
        callbacks = [cb for cb in callbacks if not isinstance(cb, ProgressBar)]
    return select_progress(callbacks, sys.stdout.isatty(), sequences_per_step)


def build_loggers(loggers: Iterable[Node], facts: Mapping[str, Any]) -> list[Any]:
    """The configured loggers (``logger=csv``, ``[csv,wandb]``, ...), each given ``facts``
    (the resolved config, the plan, ...) as its hyper-parameters."""
    built = [node.build() for node in loggers]
    for logger in built:
        logger.log_hyperparams(dict(facts))
    return built


def finish_loggers(loggers: Iterable[Any]) -> None:
    """End the experiment-tracker runs a run started (W&B: ``Run.finish``), so the next run
    in this process (a sequential multirun, a test) starts its own instead of reusing it;
    Lightning's ``finalize`` leaves them open."""
    for logger in loggers:
        experiment = getattr(logger, "_experiment", None)
        if experiment is not None and callable(getattr(experiment, "finish", None)):
            experiment.finish()


def build_trainer(
    config: Any,
    plugin: Any,
    precision: str,
    callbacks: list[Any],
    loggers: list[Any],
    **settings: Any,
) -> Any:
    """Lightning's Trainer from ``trainer``'s node: the plugin's arguments (accelerator,
    strategy, precision, plugins) and ``settings`` (the run's loop counts) override the
    node's; checkpoints are written atomically."""
    hardware = plugin.trainer_kwargs(precision)
    plugins = hardware.pop("plugins")
    return config.trainer.node.build(
        _convert_="partial",  # plain lists: Lightning < 2.5 takes no ListConfig of plugins
        **{**hardware, **settings},
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[*plugins, AtomicCheckpointIO()],
    )


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
