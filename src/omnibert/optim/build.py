"""Where a run's optimiser and learning-rate schedule are built, from their config nodes
(``_partial_`` ``_target_`` mappings): the pretraining and fine-tuning tasks, the checks
before compute and compile-only all build them here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from omnibert.config.node import build

__all__ = ["ADAMW_TARGETS", "LAMB_TARGETS", "build_optimizer", "build_schedule"]

#: the ``_target_`` names an optimiser node builds omnibert's LAMB / AdamW with
LAMB_TARGETS = ("omnibert.optim.Lamb", "omnibert.optim.lamb.Lamb")
ADAMW_TARGETS = ("omnibert.optim.AdamW", "omnibert.optim.param_groups.AdamW")


def build_optimizer(
    spec: Mapping[str, Any],
    named_parameters: Iterable[tuple[str, torch.Tensor]],
    partition_over: Any = None,
) -> torch.optim.Optimizer:
    """The optimiser ``spec`` configures, over ``named_parameters`` (names decide the weight
    decay groups); with ``partition_over`` (a ``torch.distributed`` process group: the DDP
    ranks of ``accelerator.optimizer_sharding=zero1``) each rank keeps and updates its share
    of the tensors (:class:`omnibert.optim.zero1.Zero1Optimizer`)."""
    make = build(dict(spec), _convert_="all")
    if partition_over is None:
        optimizer: torch.optim.Optimizer = make(named_parameters)
        return optimizer
    # lazy: torch.distributed.optim takes most of a second to import; only zero1 runs need it
    from omnibert.optim.zero1 import Zero1Optimizer

    return Zero1Optimizer(make, named_parameters, process_group=partition_over)


def build_schedule(
    spec: Mapping[str, Any], optimizer: torch.optim.Optimizer, total_steps: int
) -> Any:
    """The learning-rate schedule ``spec`` configures, ``total_steps`` optimiser steps long."""
    return build(dict(spec), _convert_="all")(optimizer, total_steps=total_steps)
