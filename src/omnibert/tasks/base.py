"""What every training task shares: plain data in ``hparams`` (so a checkpoint reloads from
itself and opens with ``weights_only=True``) and the optimiser and schedule built from them
(:mod:`omnibert.optim.build`), stepped every optimiser step.

A resume takes the optimiser's and the schedule's *position* from the checkpoint (moments,
step counts, the schedule's step) and their *settings* from this run's config: Lightning
restores both as they were saved, so :meth:`TrainingTask.on_train_start` puts the
configured settings back (a new learning rate, a schedule re-planned over a new
``phase.max_steps``: the same schedule function, built with this run's settings, evaluated
from the resumed step on). What may change on resume, and what is refused before compute:
:mod:`omnibert.checkpoints.resume_rules`.

Every rank's RNG states (torch, CUDA, numpy, Python ``random``) travel in the checkpoint, and
each rank draws dropout from a stream of its own, so that dropout continues identically after
a resume, in pretraining and fine-tuning alike (:mod:`omnibert.tasks.rng_states`).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from omnibert.optim.build import build_optimizer, build_schedule
from omnibert.optim.nonfinite import skipped
from omnibert.optim.sharding import attach_shard_group
from omnibert.tasks.rng_states import (
    RANKS_KEY,
    RNG_KEY,
    collect_rng_states,
    restore_rng_states,
    seed_rank_streams,
    states_for_rank,
    states_of_every_rank,
)

__all__ = ["TrainingTask", "UpdateRule", "plain"]

#: a parameter group's entries that a resume keeps from the checkpoint (the parameters, the
#: step count LAMB keeps there) or derives from the schedule (the LRs); the rest are settings
_GROUP_POSITION = frozenset({"params", "param_names", "step", "lr", "initial_lr"})
#: the schedule's state that is its position; the rest of its state is its plan
_SCHEDULE_POSITION = ("last_epoch", "_step_count", "_is_initial", "_get_lr_called_within_step")


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


@dataclass(frozen=True)
class UpdateRule:
    """How a task's model is trained, as its ``hparams`` record it: the optimiser and the
    schedule (``_partial_`` nodes as plain dicts; None: none) and the schedule's length
    (``total_steps``; None: the Trainer's ``max_steps``)."""

    optimizer: dict[str, Any] | None = None
    schedule: dict[str, Any] | None = None
    total_steps: int | None = None


class TrainingTask(pl.LightningModule):
    """A LightningModule whose ``self.model`` is trained by its :attr:`update_rule` (set by
    the subclass from the same values it saves in ``hparams``)."""

    model: torch.nn.Module
    #: the optimiser, the schedule and its length (:class:`UpdateRule`)
    update_rule: UpdateRule = UpdateRule()
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

    #: the settings of each parameter group and the schedule's state as this run's config
    #: built them (what a resume puts back over the checkpoint's: :meth:`on_train_start`)
    _configured_groups: list[dict[str, Any]] | None = None
    _configured_schedule: dict[str, Any] | None = None

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
        rule = self.update_rule
        if rule.optimizer is None:
            raise RuntimeError(f"this {type(self).__name__} was built without an optimizer")
        # accelerator.optimizer_sharding=zero1 (DDP): each rank updates its share of the tensors
        strategy = self._trainer.strategy if self._trainer is not None else None
        optimizer = build_optimizer(
            rule.optimizer,
            self.model.named_parameters(),
            partition_over=getattr(strategy, "optimizer_partition_group", None),
        )
        # FSDP1 (accelerator.strategy=fsdp): LAMB sums its norms over the shards' ranks
        self._shard_group = attach_shard_group(
            optimizer, self._trainer.model if self._trainer is not None else None
        )
        self.configured_optimizer(optimizer)
        self._configured_groups = [
            {k: copy.deepcopy(v) for k, v in group.items() if k not in ("params", "param_names")}
            for group in optimizer.param_groups
        ]
        if rule.schedule is None:
            self._configured_schedule = None
            return optimizer
        total = rule.total_steps or int(self.trainer.max_steps)
        scheduler = build_schedule(rule.schedule, optimizer, total)
        self._configured_schedule = copy.deepcopy(scheduler.state_dict())
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }

    def on_train_start(self) -> None:
        if self._trainer is not None and self.trainer.ckpt_path:
            self.apply_configured_settings()

    def apply_configured_settings(self) -> None:
        """After Lightning restored a checkpoint's optimiser and schedule: every setting of
        the optimiser's groups (``weight_decay``, ``betas``, ...) as this run configured it,
        the schedule's plan (its peak LRs, length, warm-up, ...) as this run built it at the
        checkpoint's position, and each group's LR the re-planned schedule's at that step
        (without a schedule: the configured LR). With the checkpoint's own settings nothing
        changes, bit for bit."""
        if self._configured_groups is None or not self.trainer.optimizers:
            return
        optimizer = self.trainer.optimizers[0]
        groups = optimizer.param_groups
        for group, configured in zip(groups, self._configured_groups, strict=True):
            group.update({
                k: copy.deepcopy(v) for k, v in configured.items() if k not in _GROUP_POSITION
            })  # fmt: skip
        configs = self.trainer.lr_scheduler_configs
        if self._configured_schedule is None or not configs:
            for group, configured in zip(groups, self._configured_groups, strict=True):
                group["lr"] = configured["lr"]
            return
        scheduler = configs[0].scheduler
        restored = scheduler.state_dict()
        position = {k: restored[k] for k in _SCHEDULE_POSITION if k in restored}
        scheduler.load_state_dict({**copy.deepcopy(self._configured_schedule), **position})
        for group, base in zip(groups, scheduler.base_lrs, strict=True):
            group["initial_lr"] = base
        with warnings.catch_warnings():  # torch warns when get_lr runs outside step()
            warnings.simplefilter("ignore", UserWarning)
            values: list[Any] = [float(v) for v in scheduler.get_lr()]
        for group, lr in zip(groups, values, strict=True):
            group["lr"] = lr
        scheduler._last_lr = values

    # ------------------------------------------------------------------ RNG states
    def setup(self, stage: str) -> None:
        """Training: ranks 1 … N-1 move to random streams of their own (their own dropout
        masks), before a resume restores each rank's (Lightning restores after ``setup``);
        torch's initial seed is the run's ``seed``, which Lightning set again on this rank."""
        if stage == "fit":
            seed_rank_streams(torch.initial_seed(), self.trainer.global_rank)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        states = collect_rng_states()
        checkpoint[RNG_KEY] = states  # rank 0's in the file (what older omnibert reads)
        every = states_of_every_rank(states)  # a collective: every rank builds the checkpoint
        if len(every) > 1:
            checkpoint[RANKS_KEY] = every

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # only when a Trainer resumes: load_from_checkpoint must not reseed the caller's RNGs
        if self._trainer is not None:
            states = states_for_rank(checkpoint, self.trainer.global_rank)
            if states is not None:
                restore_rng_states(states)
