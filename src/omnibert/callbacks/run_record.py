"""The run's settings that its task's ``hparams`` do not hold, written into every checkpoint:
the global batch and its split (micro batch, devices, accumulation), the precision and the
checkpoint cadence. A run that resumes the checkpoint compares them with its own before
compute (:mod:`omnibert.run.resume`): what changed is applied and shown, or refused."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl

__all__ = ["RUN_RECORD_KEY", "RunRecord"]

#: where a checkpoint keeps the record
RUN_RECORD_KEY = "omnibert_run"


class RunRecord(pl.Callback):
    """Puts ``record`` (plain values) into every checkpoint under :data:`RUN_RECORD_KEY`."""

    def __init__(self, record: Mapping[str, Any]) -> None:
        super().__init__()
        self.record = copy.deepcopy(dict(record))

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[RUN_RECORD_KEY] = copy.deepcopy(self.record)
