"""Disk space for a run's checkpoints, counted before compute.

One checkpoint holds the model's tensors (parameters and buffers, in the run's precision), the
optimiser's state (LAMB: two fp32 moments per parameter, plus an fp32 master copy of bf16/fp16
parameters; AdamW: two moments in the parameter's dtype and a step counter) and a little more
(the loops' state, the hyper-parameters, the archive's headers: about
:data:`BYTES_PER_TENSOR` per tensor and :data:`BYTES_FIXED`); tested within 10 % of the file
Lightning writes for bert_tiny and for the smoke model (tests/e2e/test_checkpoint_faults.py).

At most ``keep_last`` ``step-*.ckpt`` (fewer when the run saves fewer), ``last.ckpt`` and one
being written are on disk at once (a new ``step-*.ckpt`` is renamed into place before the
oldest is removed). :func:`plan_checkpoint_space` compares that with the free space of the file
system ``paths.checkpoint_dir`` is on (of its nearest existing parent), counting the run's
checkpoints already there as free (a resume replaces them): less than one checkpoint is
refused with one sentence (exit code 2), less than the peak is one warning line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from omnibert.checkpoints.writing import BYTES_PER_TENSOR, format_bytes, free_bytes
from omnibert.config import TrainConfigError
from omnibert.models import BertConfig, BertForPreTraining
from omnibert.optim.build import ADAMW_TARGETS, LAMB_TARGETS

__all__ = [
    "BYTES_FIXED",
    "BYTES_PER_TENSOR",
    "checkpoint_bytes",
    "module_checkpoint_bytes",
    "plan_checkpoint_space",
]

#: what a checkpoint holds besides the model's and the optimiser's tensors: the RNG states,
#: the loops, callbacks and hyper-parameters (a bert_tiny run's, rounded; the estimate is
#: checked against real files by tests/e2e/test_checkpoint_faults.py)
BYTES_FIXED = 14 * 1024

_LOW = {"bf16-true": 2, "16-true": 2, "bf16": 2, "16": 2, "64-true": 8, "64": 8}


def checkpoint_bytes(
    model_config: Mapping[str, Any], precision: str, optimizer: Mapping[str, Any]
) -> int:
    """About the bytes of one training checkpoint of ``model_config`` (vocab size resolved)
    trained at ``precision`` (resolved, e.g. ``32-true``, ``bf16-mixed``) with the optimiser
    node ``optimizer`` (module docstring)."""
    with torch.device("meta"):
        model = BertForPreTraining(BertConfig(**dict(model_config)))
    return module_checkpoint_bytes(model, precision, optimizer)


def module_checkpoint_bytes(
    model: torch.nn.Module, precision: str, optimizer: Mapping[str, Any]
) -> int:
    """About the bytes of one training checkpoint of ``model`` (on any device, the meta device
    included: only shapes and dtypes are read) trained at ``precision`` with the optimiser node
    ``optimizer``: what :func:`checkpoint_bytes` counts for pretraining, and fine-tuning for its
    task's model (the encoder and the task's head)."""
    width = _LOW.get(precision, 4)  # mixed precision keeps fp32 weights
    tensors: dict[int, torch.Tensor] = {}  # tied weights are stored once
    for value in model.state_dict(keep_vars=True).values():
        tensors.setdefault(id(value), value)
    params = {id(p): p for p in model.parameters() if p.requires_grad}
    total, count = 0, len(tensors)
    for tensor in tensors.values():
        floating = tensor.is_floating_point()
        total += tensor.numel() * (width if floating else tensor.element_size())
    numel = sum(p.numel() for p in params.values())
    target = str(optimizer.get("_target_"))
    if target in ADAMW_TARGETS:  # torch's AdamW: moments in the parameter's dtype, a step
        total += numel * 2 * width + 4 * len(params)
        count += 3 * len(params)
    else:  # LAMB and anything else: two fp32 moments
        total += numel * 2 * 4
        count += 2 * len(params)
        if target in LAMB_TARGETS and width == 2 and optimizer.get("master_weights", True):
            total += numel * 4
            count += len(params)
    return total + count * BYTES_PER_TENSOR + BYTES_FIXED


def plan_checkpoint_space(
    checkpoint_dir: str,
    each: int,
    keep_last: int | None,
    every_n_train_steps: int | None,
    max_steps: int,
) -> dict[str, Any]:
    """The plan's ``checkpoint space``: ``each`` bytes a checkpoint, how many at most are on
    disk at once, the free space; raises :class:`TrainConfigError` when not even one fits, and
    says in ``warning`` when the peak does not (module docstring)."""
    saves = math.ceil(max_steps / every_n_train_steps) if every_n_train_steps else 1
    kept = saves if keep_last is None else min(keep_last, saves)
    at_most = kept + 2  # + last.ckpt + the one being written
    folder = Path(checkpoint_dir)
    existing = sum(p.stat().st_size for p in folder.glob("*.ckpt")) if folder.is_dir() else 0
    free = free_bytes(folder)
    room = None if free is None else free + existing
    held = f" (+ {format_bytes(existing)} of this run's checkpoints there)" if existing else ""
    where = f"{format_bytes(free)} free{held}" if free is not None else "free space unknown"
    keep = "every step checkpoint" if keep_last is None else f"keep_last={keep_last}"
    description = (
        f"about {format_bytes(each)} each, at most {at_most} on disk at once ({keep}, "
        f"last.ckpt and one being written) = {format_bytes(at_most * each)}; {where}"
    )
    if room is not None and room < each:
        raise TrainConfigError(
            f"paths.checkpoint_dir={checkpoint_dir} has {format_bytes(room)} free on its file "
            f"system, less than one checkpoint of this run (about {format_bytes(each)}); free "
            "space there or set paths.checkpoint_dir to a file system with room."
        )
    warning = ""
    if room is not None and room < at_most * each:
        fits = room // each - 2
        advice = (
            f"set callbacks.checkpoint.keep_last={fits} or free space"
            if fits >= 0 and fits < kept
            else "free space there or set paths.checkpoint_dir to a file system with room"
        )
        warning = (
            f"the checkpoints of this run need up to {format_bytes(at_most * each)} ({at_most} "
            f"of about {format_bytes(each)}: {keep}, last.ckpt and one being written) but "
            f"{format_bytes(room)} are free for them under paths.checkpoint_dir="
            f"{checkpoint_dir}; a write will fail when the disk fills; {advice}."
        )
    return {
        "bytes_each": each,
        "at_most": at_most,
        "free_bytes": free,
        "existing_bytes": existing,
        "description": description,
        "warning": warning,
    }
