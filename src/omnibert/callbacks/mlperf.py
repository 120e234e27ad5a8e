"""MLPerf mode (``phase=mlperf``): evaluation at MLPerf's cadence, stop at the target, and the
compliance log written with the ``mlperf-logging`` package's ``mllog``.

What MLPerf Training's BERT benchmark asks (rules of ruleset 5.0.0, the last with BERT):

* masked-LM accuracy on the fixed eval set (10,000 samples) every
  ``floor(0.05 * (230.23 * B + 3,000,000) / 25,000) * 25,000`` training samples, B the global
  batch (:func:`eval_interval_samples`); training stops as soon as it reaches the target
  (0.720), and the time from ``run_start`` to ``run_stop`` is the result;
* a log with ``submission_*``, ``cache_clear``, ``init_start/stop``, ``run_start/stop`` (with
  ``status``), ``block_start/stop``, ``eval_start/stop``, ``eval_accuracy`` with
  ``epoch_num``, ``train_samples``, ``eval_samples`` and BERT's hyper-parameters under their
  MLPerf names, from rank 0 only; ``python -m mlperf_logging.compliance_checker --usage
  training --ruleset 5.0.0 <log>`` checks it.

Samples are sequences: with packing, a row holds several and the count is the real ones (the
``nsp_weights`` of the rows), summed over ranks. The evaluation runs inside the training loop
through the task's own validation step and sums (:meth:`PretrainingTask.validation_metrics`),
so its accuracy is the one ``omnibert-eval`` and the periodic validation report.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only

__all__ = ["MLPerfCompliance", "eval_interval_samples", "mlperf_hyperparameters"]


def eval_interval_samples(global_batch_size: int) -> int:
    """MLPerf BERT's evaluation interval in training samples for a global batch."""
    return math.floor(0.05 * (230.23 * global_batch_size + 3_000_000) / 25_000) * 25_000


def mlperf_hyperparameters(config: Any, accumulation: int) -> dict[str, Any]:
    """BERT's required hyper-parameters under their MLPerf names, read from the run's typed
    config (:class:`~omnibert.config.TrainConfig`: the values the run really uses)."""
    phase, optimizer = config.phase, config.optimizer
    schedule = config.schedule if config.schedule is not None else {}
    warmup = phase.warmup
    betas = list(optimizer.get("betas", (0.9, 0.999)))
    return {
        "global_batch_size": phase.global_batch_size,
        "gradient_accumulation_steps": accumulation,
        "opt_base_learning_rate": optimizer["lr"],
        "opt_lamb_epsilon": optimizer.get("eps"),
        "opt_epsilon": optimizer.get("eps"),
        "opt_learning_rate_training_steps": phase.max_steps,
        "opt_learning_rate_warmup_steps": int(warmup),
        "num_warmup_steps": int(warmup),
        "start_warmup_step": int(schedule.get("start_warmup_step", 0)),
        "opt_lamb_beta_1": betas[0],
        "opt_lamb_beta_2": betas[1],
        "opt_lamb_weight_decay_rate": optimizer.get("weight_decay"),
        "max_predictions_per_seq": phase.max_predictions_per_seq,
        "seed": config.seed,
    }


class _OwnedFileHandler(logging.FileHandler):
    """A file handler that ``logging.shutdown`` (run by ``logging.config.dictConfig``) only
    flushes; the callback closes it when the run ends."""

    owner_closes = False

    def close(self) -> None:
        if self.owner_closes:
            super().close()
        else:
            self.flush()


class MLPerfCompliance(pl.Callback):
    """Evaluation cadence, stop at target and the compliance log (module docstring).

    Built by the training wiring from the ``mlperf`` config node; logs ``cache_clear`` and
    ``init_start`` when built (before the model), ``init_stop``/``run_start`` when training
    starts.
    """

    def __init__(
        self,
        log_file: str | Path,
        *,
        target_accuracy: float,
        eval_every_samples: int,
        max_samples: int | None,
        submission: Mapping[str, Any],
        hyperparameters: Mapping[str, Any],
        eval_samples: int,
    ) -> None:
        super().__init__()
        from mlperf_logging import mllog
        from mlperf_logging.mllog.mllog import MLLogger

        self.constants = mllog.constants
        self.target = float(target_accuracy)
        self.every = int(eval_every_samples)
        self.max_samples = max_samples
        self.eval_samples = eval_samples
        self.log_file = Path(log_file)
        self.samples = 0
        self.next_eval = self.every
        self.evaluations: list[dict[str, float | None]] = []
        self.status: str | None = None
        self._local: torch.Tensor | None = None  # this step's sequences so far, on the device
        self._step = 0
        self._run_start: float | None = None
        self._run_seconds: float | None = None
        self._handler: _OwnedFileHandler | None = None
        self.logger: Any = None
        if rank_zero_only.rank == 0:  # type: ignore[attr-defined]
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            # a logger outside logging's registry and a handler only we close: a library that
            # calls logging.config.dictConfig on import (submitit does) disables registered
            # loggers and closes every handler, which would silently end the log
            python_logger = logging.Logger(f"omnibert.mlperf.{id(self)}", logging.INFO)
            python_logger.propagate = False
            self._handler = _OwnedFileHandler(self.log_file, mode="w")
            python_logger.addHandler(self._handler)
            self.logger = MLLogger(logger=python_logger, default_stack_offset=2)
        self._event("cache_clear", True)
        self._interval("start", "init_start")
        for key in ("submission_benchmark", "submission_division", "submission_org",
                    "submission_platform", "submission_status"):  # fmt: skip
            self._event(key, submission[key.removeprefix("submission_")])
        for key, value in hyperparameters.items():
            self._event(key, value)

    # ------------------------------------------------------------------ log helpers
    def _event(self, key: str, value: Any = None, **metadata: Any) -> None:
        if self.logger is not None:
            self.logger.event(key=key, value=value, metadata=metadata or None)

    def _interval(self, kind: str, key: str, value: Any = None, **metadata: Any) -> None:
        if self.logger is not None:
            method = self.logger.start if kind == "start" else self.logger.end
            method(key=key, value=value, metadata=metadata or None)

    # ------------------------------------------------------------------ hooks
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._interval("end", "init_stop")
        self._interval("start", "run_start")
        self._run_start = time.perf_counter()
        self._step = trainer.global_step
        self._interval("start", "block_start", samples_count=self.every, first_epoch_num=0)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        # summed on the device: the host reads the count once per optimiser step, not per
        # micro-batch (a read per micro-batch would wait for its forward and backward)
        counted = batch["nsp_weights"].detach().float().sum()
        self._local = counted if self._local is None else self._local + counted
        if trainer.global_step == self._step or self.status is not None:
            return  # inside an accumulation group
        self._step = trainer.global_step
        local = self._local if self._local is not None else torch.zeros((), device=pl_module.device)
        step_samples = trainer.strategy.reduce(local, reduce_op="sum")
        self.samples += round(float(step_samples))
        self._local = None
        if self.samples >= self.next_eval:
            while self.next_eval <= self.samples:
                self.next_eval += self.every
            self._evaluate(trainer, pl_module)
        if (
            self.status is None
            and self.max_samples is not None
            and self.samples >= self.max_samples
        ):
            self._stop(trainer, "aborted")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.status is None:  # the steps ran out before the target
            self._stop(trainer, "aborted")

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._close()

    # ------------------------------------------------------------------ the work
    def _evaluate(self, trainer: pl.Trainer, pl_module: Any) -> None:
        epoch = self.samples
        self._interval("end", "block_stop", first_epoch_num=epoch - self.every)
        self._interval("start", "eval_start", epoch_num=epoch)
        datamodule: Any = trainer.datamodule  # type: ignore[attr-defined]
        was_training = pl_module.training
        pl_module.eval()
        with torch.no_grad(), trainer.precision_plugin.val_step_context():
            for index, batch in enumerate(datamodule.val_dataloader()):
                moved = {k: v.to(pl_module.device) for k, v in batch.items()}
                pl_module.validation_step(moved, index)
        metrics = {k: float(v) for k, v in pl_module.validation_metrics().items()}
        pl_module.train(was_training)
        accuracy = metrics["val/mlm_acc"]
        self._event("eval_accuracy", accuracy, epoch_num=epoch)
        self._interval("end", "eval_stop", epoch_num=epoch)
        seconds = None if self._run_start is None else time.perf_counter() - self._run_start
        self.evaluations.append(
            {"samples": epoch, "step": trainer.global_step, "seconds": seconds, **metrics}
        )
        pl_module.log("mlperf/eval_accuracy", accuracy, rank_zero_only=True)
        if accuracy >= self.target:
            self._stop(trainer, "success")
        else:
            self._interval("start", "block_start", samples_count=self.every, first_epoch_num=epoch)

    def _stop(self, trainer: pl.Trainer, status: str) -> None:
        self.status = status
        if self._run_start is not None:
            self._run_seconds = time.perf_counter() - self._run_start
        self._event("train_samples", self.samples)
        self._event("eval_samples", self.eval_samples)
        self._interval("end", "run_stop", status=status, epoch_num=self.samples)
        trainer.should_stop = True
        self._close()

    def _close(self) -> None:
        if self._handler is not None:
            self._handler.owner_closes = True
            self._handler.close()
            self._handler = None
            self.logger = None

    def summary(self) -> dict[str, Any]:
        """What MLPerf reports: reached or not, samples and seconds to the target."""
        reached = self.status == "success"
        return {
            "status": self.status,
            "target_accuracy": self.target,
            "reached": reached,
            "samples": self.samples,
            "samples_to_target": self.samples if reached else None,
            "seconds_to_target": round(self._run_seconds, 3)
            if reached and self._run_seconds
            else None,
            "run_seconds": None if self._run_seconds is None else round(self._run_seconds, 3),
            "eval_every_samples": self.every,
            "evaluations": self.evaluations,
            "log_file": str(self.log_file),
        }
