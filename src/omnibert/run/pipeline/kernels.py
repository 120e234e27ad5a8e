"""Which kernels a run will use, decided from the config and the device before compute and
printed in the plan (``omnibert-train``'s "kernels" rows, ``plan.json``'s ``kernels``).

Precision (``trainer.precision``, ``auto`` resolved by the accelerator), attention (the
model's path on this device), the optimiser's update kernel (LAMB's ``impl: auto`` resolved
by :func:`omnibert.optim.lamb.choose_impl`, the rule the optimiser itself applies; AdamW's ``fused: auto``), the
optimiser state one rank holds (``accelerator.optimizer_sharding``:
:mod:`omnibert.optim.zero1_plan`), and what the accelerator plugin adds (``torch.compile``
and its mode, CUDA graphs: ``kernels()``).
``tests/e2e/test_kernels.py`` checks these predictions against the objects a run builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from omnibert.config.node import Optimizer
from omnibert.models import BertConfig, BertForPreTraining
from omnibert.optim.build import ADAMW_TARGETS, LAMB_TARGETS
from omnibert.optim.lamb import COMPILE_MIN_NUMEL, choose_impl
from omnibert.optim.param_groups import BERT_NO_WEIGHT_DECAY, normalize_params
from omnibert.optim.zero1_plan import state_memory_line


def count_parameters(model_config: Mapping[str, Any]) -> int:
    """Parameters of :class:`~omnibert.models.BertForPreTraining` for ``model_config`` (built
    on the meta device: no memory, no init)."""
    with torch.device("meta"):
        model = BertForPreTraining(BertConfig(**dict(model_config)))
    return sum(p.numel() for p in model.parameters())


def attention_choice(model_config: Mapping[str, Any], device_type: str) -> str:
    """The attention path :func:`omnibert.models.attention_choice.resolve_attention` picks on
    ``device_type``."""
    dropout = float(model_config.get("attention_probs_dropout_prob", 0.1))
    if device_type == "cpu" and dropout > 0:
        return (
            "training: explicit masked softmax (CPU SDPA with dropout would take its slower "
            "math kernel); evaluation: SDPA with the block-diagonal mask"
        )
    return "SDPA with the block-diagonal boolean mask (efficient-attention or math kernel)"


def lamb_choice(optimizer: Optimizer, device: torch.device, num_params: int) -> str:
    """What ``Lamb(impl=...)`` will run for contiguous parameters on ``device``: the rule of
    :func:`omnibert.optim.lamb.choose_impl`, which the optimiser itself applies."""
    threshold = optimizer.compile_min_numel
    return choose_impl(
        optimizer.impl, device, num_params,
        COMPILE_MIN_NUMEL if threshold is None else threshold,
    )[1]  # fmt: skip


def adamw_choice(optimizer: Optimizer, device: torch.device) -> str:
    """What ``omnibert.optim.AdamW(fused=...)`` will run on ``device``."""
    fused = optimizer.fused
    if fused == "auto":
        fused = True if device.type == "cuda" and not optimizer.foreach else None
    if fused:
        return "fused (torch, optimizer.fused)"
    foreach = optimizer.foreach
    if foreach is None:
        foreach = device.type == "cuda"
    return "foreach (torch)" if foreach else "for-loop (torch)"


def optimizer_choice(optimizer: Optimizer, device: torch.device, num_params: int) -> str:
    target = str(optimizer.target)
    name = target.rsplit(".", 1)[-1]
    if target in LAMB_TARGETS:
        return f"LAMB {lamb_choice(optimizer, device, num_params)}"
    if target in ADAMW_TARGETS:
        return f"AdamW {adamw_choice(optimizer, device)}"
    return f"{name} ({target})"


def kernel_choices(
    plugin: Any,
    model_config: Mapping[str, Any],
    optimizer: Optimizer,
    precision: str,
    precision_reason: str,
) -> dict[str, str]:
    """The plan's kernel rows: ``model_config`` with its vocab size resolved, the optimiser
    config and the resolved precision, on ``plugin``'s device."""
    device = plugin.device
    with torch.device("meta"):
        model = BertForPreTraining(BertConfig(**dict(model_config)))
    rows = {
        "precision": f"{precision} ({precision_reason})",
        "attention": attention_choice(model_config, device.type),
        "optimizer": optimizer_choice(
            optimizer, device, sum(p.numel() for p in model.parameters())
        ),
    }
    state = optimizer_state(plugin, model, optimizer, precision)
    return {**rows, **({"optimizer state": state} if state else {}), **plugin.kernels()}


def optimizer_state(
    plugin: Any, model: torch.nn.Module, optimizer: Optimizer, precision: str
) -> str | None:
    """The plan's optimiser-state line for ``model`` (on the meta device): one rank's state
    under ``plugin``'s ``optimizer_sharding`` against the unsharded state (``None``: an
    optimiser whose state is not counted)."""
    default = BERT_NO_WEIGHT_DECAY if optimizer.target in ADAMW_TARGETS else None
    groups = normalize_params(
        model.named_parameters(), optimizer.weight_decay, optimizer.no_weight_decay(default)
    )
    sizes = [[p.numel() for p in group["params"]] for group in groups]
    sharding = str(getattr(plugin, "optimizer_sharding", "none"))
    return state_memory_line(optimizer, sizes, plugin.world_size, sharding, precision)
