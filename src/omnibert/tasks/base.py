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
    #: every trainable parameter keeps a gradient tensor of its own: one is made before a
    #: backward that finds none, and gradients are zeroed in place between optimiser steps, so
    #: backward always adds into ``.grad`` and never adopts its output tensor; set by the CUDA
    #: graphs callback (omnibert.accelerators.cuda_graphs: a replayed graph rewrites its
    #: outputs, and an adopted one would lose the micro-batches accumulated so far)
    keep_gradient_buffers: bool = False
    _trainable: list[torch.nn.Parameter] | None = None

    def on_before_backward(self, loss: torch.Tensor) -> None:
        if self.keep_gradient_buffers:
            self.own_gradients()

    def own_gradients(self) -> None:
        """A zero ``.grad`` for every trainable parameter that has none (see
        :attr:`keep_gradient_buffers`)."""
        if self._trainable is None:
            self._trainable = [p for p in self.parameters() if p.requires_grad]
        for param in self._trainable:
            if param.grad is None:
                param.grad = torch.zeros_like(param)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        """Lightning's ``optimizer.zero_grad()``; in place with :attr:`keep_gradient_buffers`."""
        if self.keep_gradient_buffers:
            optimizer.zero_grad(set_to_none=False)
        else:
            optimizer.zero_grad()

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
