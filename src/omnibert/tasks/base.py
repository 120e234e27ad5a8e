"""What every training task shares: plain data in ``hparams`` (so a checkpoint reloads from
itself and opens with ``weights_only=True``) and the optimiser and schedule built from them
(:mod:`omnibert.optim.build`), stepped every optimiser step."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from omnibert.optim.build import build_optimizer, build_schedule
from omnibert.optim.nonfinite import skipped
from omnibert.optim.sharding import attach_shard_group

__all__ = ["TrainingTask", "plain"]


def plain(value: Any) -> Any:
    """``value`` as plain Python containers (dicts, lists, scalars); OmegaConf nodes resolved."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


class TrainingTask(pl.LightningModule):
    """A LightningModule whose ``self.model`` is trained with the optimiser and schedule of
    its ``hparams`` (``optimizer``, ``schedule``: ``_partial_`` nodes; ``total_steps``: the
    schedule's length, default the Trainer's ``max_steps``)."""

    model: torch.nn.Module
    #: FSDP1's process group when the parameters are shards (LAMB sums its norms over it)
    _shard_group: Any = None

    def configured_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Called with the optimiser once it is built (a task adds its own setup)."""

    def last_step_loss(self) -> float | None:
        """The mean loss of the last optimiser step's micro-batches, where the task keeps it
        (read only when a step went wrong: it costs a host read)."""
        return None

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step the schedule, except after an optimiser step skipped for non-finite
        gradients (:mod:`omnibert.optim.nonfinite`): the schedule stays where it was."""
        if skipped(getattr(scheduler, "optimizer", None)):
            return
        super().lr_scheduler_step(scheduler, metric)

    def configure_optimizers(self) -> Any:
        if self.hparams["optimizer"] is None:
            raise RuntimeError(f"this {type(self).__name__} was built without an optimizer")
        optimizer = build_optimizer(self.hparams["optimizer"], self.model.named_parameters())
        # FSDP1 (accelerator.strategy=fsdp): LAMB sums its norms over the shards' ranks
        self._shard_group = attach_shard_group(
            optimizer, self._trainer.model if self._trainer is not None else None
        )
        self.configured_optimizer(optimizer)
        if self.hparams["schedule"] is None:
            return optimizer
        total = self.hparams.get("total_steps") or int(self.trainer.max_steps)
        scheduler = build_schedule(self.hparams["schedule"], optimizer, total)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }
