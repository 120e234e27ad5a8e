"""The builders both jobs use once a run is prepared (:mod:`omnibert.run.pipeline.stages`):
the callbacks every run has, the configured loggers and Lightning's Trainer; and the
third-party deprecation warnings every run would print, silenced by message.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from lightning.pytorch.callbacks import ProgressBar

from omnibert.accelerators.elastic import MarkJoined
from omnibert.callbacks.nonfinite import NonFiniteAdvice, NonFiniteSteps
from omnibert.callbacks.progress import select_progress
from omnibert.callbacks.requeue import CheckpointOnSignal, submitit_signal
from omnibert.callbacks.stop import StopAtSafePoint
from omnibert.checkpoints.resuming import CompletedBatchProgress
from omnibert.checkpoints.writing import AtomicCheckpointIO
from omnibert.config.node import Node
from omnibert.logs import single_lightning_output

__all__ = [
    "build_callbacks",
    "build_loggers",
    "build_trainer",
    "finish_loggers",
    "quiet_third_party_deprecations",
]


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
    policy (``advice``: the keys its stop names), the mark a torchrun group leaves once joined
    (its restarts resume by it: :mod:`omnibert.accelerators.elastic`), ``extra``, and under a
    submitit job the checkpoint at its time limit (then a requeue). One way of showing
    progress: the bar on a terminal, step-counting lines in a log file
    (:mod:`omnibert.callbacks.progress`)."""
    callbacks = [node.build() for node in config.callbacks]
    trainer = config.trainer
    callbacks += [
        CompletedBatchProgress(),
        StopAtSafePoint(within_s=trainer.stop_within_s),
        NonFiniteSteps(trainer.nonfinite, trainer.nonfinite_max_consecutive, advice),
        MarkJoined(),
        *extra,
    ]
    if submitit_signal() is not None:
        callbacks.append(CheckpointOnSignal())
    if not config.trainer.enable_progress_bar:
        callbacks = [cb for cb in callbacks if not isinstance(cb, ProgressBar)]
    return select_progress(callbacks, sys.stdout.isatty(), sequences_per_step)


def build_loggers(loggers: Iterable[Node], hyperparameters: Mapping[str, Any]) -> list[Any]:
    """The configured loggers (``logger=csv``, ``[csv,wandb]``, ...), each given
    ``hyperparameters`` (the resolved config, the plan, ...) to record."""
    built = [node.build() for node in loggers]
    for logger in built:
        logger.log_hyperparams(dict(hyperparameters))
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
