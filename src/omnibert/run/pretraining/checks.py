"""Checks a pretraining run makes of its optimiser, schedule, clipping and vocab size before
compute (the optimiser and schedule are built once on a dummy tensor, so a bad key is one
sentence naming it before any data is read)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from omnibert.config import TrainConfigError
from omnibert.config.node import Optimizer
from omnibert.errors import UserError
from omnibert.optim.build import build_optimizer, build_schedule

__all__ = ["check_optimizer", "describe_clipping", "resolve_clipping", "resolve_vocab_size"]


def resolve_clipping(setting: Any, optimizer: Optimizer) -> float | None:
    """``clip_grad_per_micro_batch``: ``auto`` → 1.0 when the optimiser itself does not clip
    (``max_grad_norm: null``, as ``lamb_mlperf``), else off; a number → that norm; null → off."""
    if setting is None:
        return None
    if setting == "auto":
        switched_off = optimizer.sets_max_grad_norm and optimizer.max_grad_norm is None
        return 1.0 if switched_off else None
    if isinstance(setting, bool) or not isinstance(setting, (int, float)) or setting <= 0:
        raise TrainConfigError(
            f"clip_grad_per_micro_batch={setting!r} must be auto, null or a positive norm."
        )
    return float(setting)


def describe_clipping(
    micro_clip: float | None, optimizer: Optimizer, gradient_clip_val: Any
) -> str:
    in_optimizer = optimizer.max_grad_norm
    if micro_clip is not None and in_optimizer is not None:
        raise TrainConfigError(
            f"clip_grad_per_micro_batch={micro_clip} and optimizer.max_grad_norm="
            f"{in_optimizer} would clip twice; set one of them to null."
        )
    if gradient_clip_val and (micro_clip is not None or in_optimizer is not None):
        raise TrainConfigError(
            f"trainer.gradient_clip_val={gradient_clip_val} clips on top of the optimiser's "
            "own clipping and changes the maths; leave trainer.gradient_clip_val null."
        )
    if micro_clip is not None:
        return f"each micro-batch to global norm {micro_clip:g} before accumulation (MLPerf)"
    if in_optimizer is not None:
        return f"accumulated gradient to global norm {in_optimizer:g} in the optimiser (apex)"
    if gradient_clip_val:
        return f"accumulated gradient to {gradient_clip_val:g} by Lightning"
    return "none"


def check_optimizer(
    optimizer: Optimizer, schedule: Mapping[str, Any] | None, total_steps: int
) -> None:
    """Build the optimiser and schedule (``total_steps`` long) on one dummy tensor: config
    errors before any compute."""
    weight = torch.zeros(1, requires_grad=True)
    try:
        opt = build_optimizer(optimizer, [("dummy.weight", weight)])
    except UserError:
        raise
    except Exception as err:
        raise TrainConfigError(
            f"optimizer ({optimizer.target}) cannot be built: {_root(err)}; fix the optimizer keys."
        ) from err
    if schedule is None:
        return
    try:
        build_schedule(schedule, opt, total_steps)
    except Exception as err:
        raise TrainConfigError(
            f"schedule ({schedule.get('_target_')}) cannot be built: {_root(err)}; fix the "
            "schedule keys (the schedule runs phase.max_steps steps)."
        ) from err


def _root(err: BaseException) -> str:
    while err.__cause__ is not None:
        err = err.__cause__
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def resolve_vocab_size(configured: int | None, data_vocab_size: int) -> int:
    if configured is None:
        return int(data_vocab_size)
    if configured != data_vocab_size:
        raise TrainConfigError(
            f"model.config.vocab_size={configured} but the data was tokenised with a "
            f"{data_vocab_size}-token vocab; set model.config.vocab_size=null (take it from "
            "the data) or use data prepared with the model's vocab."
        )
    return int(configured)
