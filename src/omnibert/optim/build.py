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
    spec: Mapping[str, Any], named_parameters: Iterable[tuple[str, torch.Tensor]]
) -> torch.optim.Optimizer:
    """The optimiser ``spec`` configures, over ``named_parameters`` (names decide the weight
    decay groups)."""
    optimizer: torch.optim.Optimizer = build(dict(spec), _convert_="all")(named_parameters)
    return optimizer


def build_schedule(
    spec: Mapping[str, Any], optimizer: torch.optim.Optimizer, total_steps: int
) -> Any:
    """The learning-rate schedule ``spec`` configures, ``total_steps`` optimiser steps long."""
    return build(dict(spec), _convert_="all")(optimizer, total_steps=total_steps)
