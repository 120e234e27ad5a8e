"""Vendor LAMBs as explicit optimiser choices: ``optimizer=lamb_habana`` and
``optimizer=lamb_poptorch``. Never swapped in by an accelerator plugin.

Vendor SDKs are imported inside these functions only, so that the module imports anywhere.
The tests run both against fake ``habana_frameworks`` / ``poptorch`` modules that follow the
documented signatures (``tests/fakes/sdk``), not on real hardware.

* :func:`habana_lamb` (``conf/optimizer/lamb_habana.yaml``) takes :class:`Lamb`'s keyword
  arguments and returns ``habana_frameworks.torch.hpex.optimizers.FusedLamb`` computing the
  same update. Settings FusedLamb cannot honour are refused with one sentence: the user gets
  the maths they configured or an error, never another optimiser.
* :func:`poptorch_lamb` (``conf/optimizer/lamb_poptorch.yaml``) builds
  ``poptorch.optim.LAMB`` with the arguments it has. Its update differs from omnibert's
  (docs/lamb.md): the config states poptorch's rules, and the IPU plugin refuses omnibert's
  LAMB, which cannot run inside the IPU program, naming those differences.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from omnibert.errors import UserError
from omnibert.optim.param_groups import BERT_NO_WEIGHT_DECAY, normalize_params

_APEX_ARGS = (
    "lr",
    "bias_correction",
    "betas",
    "eps",
    "weight_decay",
    "adam_w_mode",
    "grad_averaging",
    "set_grad_none",
    "max_grad_norm",
    "use_nvlamb",
)


class VendorOptimizerError(UserError):
    """A vendor optimiser cannot run here or cannot compute what its config asks."""


def hpu_lamb_mismatches(**kwargs: Any) -> list[str]:
    """Why Habana's ``FusedLamb`` would not compute what ``Lamb(**kwargs)`` computes."""
    reasons = []
    if kwargs.get("adam_w_mode", True) is False:
        reasons.append("optimizer.adam_w_mode=false (FusedLamb always decays decoupled)")
    if kwargs.get("max_weight_norm") is not None:
        reasons.append("optimizer.max_weight_norm (FusedLamb does not clamp the weight norm)")
    if kwargs.get("exclude_from_layer_adaptation"):
        reasons.append(
            "optimizer.exclude_from_layer_adaptation (FusedLamb has no per-name trust ratio)"
        )
    return reasons


def habana_lamb(params: Any, **kwargs: Any) -> torch.optim.Optimizer:
    """``optimizer=lamb_habana``: Habana ``FusedLamb`` with ``Lamb``'s keyword arguments.

    Matching flags map one to one (``use_nvlamb`` is Habana's ``use_lamb``; ``max_grad_norm``
    ``None`` or ``<= 0`` disables clipping in both); ``no_weight_decay`` patterns become
    parameter groups first, which FusedLamb honours. FusedLamb keeps its moments in the
    parameters' dtype, not fp32 (as apex): fine for fp32 parameters with bf16 autocast.
    """
    reasons = hpu_lamb_mismatches(**kwargs)
    if reasons:
        raise VendorOptimizerError(
            "optimizer=lamb_habana (Habana FusedLamb) cannot compute what is configured: "
            + "; ".join(reasons)
            + "; drop those settings or use optimizer=lamb, which runs on Gaudi too."
        )
    try:  # lazy: Intel's Gaudi SDK, importable only in its container
        from habana_frameworks.torch.hpex.optimizers import FusedLamb
    except ImportError as err:
        raise VendorOptimizerError(
            "optimizer=lamb_habana is Intel Gaudi's FusedLamb and habana_frameworks is not "
            "importable here; use it with accelerator=hpu in Intel's Gaudi container, or "
            "optimizer=lamb elsewhere."
        ) from err
    kwargs.pop("impl", None)  # omnibert's kernel choice; FusedLamb has its own kernel
    groups = normalize_params(
        params, kwargs.get("weight_decay", 0.01), kwargs.get("no_weight_decay")
    )
    fused_kwargs = {k: kwargs[k] for k in _APEX_ARGS if k in kwargs}
    if "use_nvlamb" in fused_kwargs:
        fused_kwargs["use_lamb"] = fused_kwargs.pop("use_nvlamb")
    max_norm = fused_kwargs.get("max_grad_norm", 1.0)
    if max_norm is not None and max_norm <= 0:
        fused_kwargs["max_grad_norm"] = None
    if "betas" in fused_kwargs:
        fused_kwargs["betas"] = tuple(fused_kwargs["betas"])
    for group in groups:
        if isinstance(group, dict):
            group.pop("param_names", None)  # FusedLamb predates named parameter groups
    return FusedLamb(groups, **fused_kwargs)


def poptorch_lamb(
    params: Any,
    lr: float,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    no_weight_decay: Sequence[str] | None = BERT_NO_WEIGHT_DECAY,
    bias_correction: bool = True,
    max_weight_norm: float = 65500.0,
    loss_scaling: float = 1.0,
) -> torch.optim.Optimizer:
    """``optimizer=lamb_poptorch``: ``poptorch.optim.LAMB`` with fp32 accumulators; its rules
    (docs/lamb.md): no gradient clipping, the trust ratio on every tensor, the weight norm
    clamped at ``max_weight_norm``, per-parameter step counts. ``loss_scaling`` is poptorch's
    static loss scale (the loss is multiplied by it before backward and the gradients divided
    by it in the update, inside the IPU program), for ``trainer.precision=16-true``."""
    try:  # lazy: Graphcore's Poplar SDK, importable only in its environment
        import poptorch
    except ImportError as err:
        raise VendorOptimizerError(
            "optimizer=lamb_poptorch is Graphcore's poptorch.optim.LAMB and poptorch is not "
            "importable here; use it with accelerator=ipu in the Poplar SDK's environment, or "
            "optimizer=lamb elsewhere."
        ) from err
    groups = normalize_params(params, weight_decay, no_weight_decay)
    for group in groups:
        if isinstance(group, dict):
            group.pop("param_names", None)
    optimizer: torch.optim.Optimizer = poptorch.optim.LAMB(
        groups,
        lr=lr,
        betas=tuple(betas),
        eps=eps,
        weight_decay=weight_decay,
        bias_correction=bias_correction,
        max_weight_norm=max_weight_norm,
        loss_scaling=loss_scaling,
        accum_type=torch.float32,
        first_order_momentum_accum_type=torch.float32,
        second_order_momentum_accum_type=torch.float32,
    )
    return optimizer
