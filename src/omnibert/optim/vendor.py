"""LAMB on Intel Gaudi (HPU) and Graphcore IPU: vendor optimisers where the maths matches.

Vendor SDKs are imported inside these functions only. Neither was run on real hardware in
this project's tests: they run against fake ``habana_frameworks`` / ``poptorch`` modules that
follow the documented signatures (``tests/fakes/sdk``).

* :func:`hpu_lamb` returns ``habana_frameworks.torch.hpex.optimizers.FusedLamb`` when the
  requested flags mean the same thing there, else warns and returns :class:`Lamb` (foreach).
* :func:`ipu_lamb` returns ``poptorch.optim.LAMB`` and warns once per semantic difference
  (:func:`ipu_lamb_differences`); poptorch compiles the optimiser into the IPU graph, so
  there is no host-side fallback.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from omnibert.optim.lamb import Lamb
from omnibert.optim.param_groups import normalize_params

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


def hpu_lamb_mismatches(**kwargs: Any) -> list[str]:
    """Why Habana's ``FusedLamb`` would not compute what ``Lamb(**kwargs)`` computes."""
    reasons = []
    if kwargs.get("adam_w_mode", True) is False:
        reasons.append("adam_w_mode=False (FusedLamb's phase-1 op always decays decoupled)")
    if kwargs.get("max_weight_norm") is not None:
        reasons.append("max_weight_norm (FusedLamb does not clamp the weight norm)")
    if kwargs.get("exclude_from_layer_adaptation"):
        reasons.append("exclude_from_layer_adaptation (FusedLamb has no per-name trust ratio)")
    if kwargs.get("impl", "auto") != "auto":
        reasons.append(f"impl={kwargs['impl']!r} was requested explicitly")
    return reasons


def hpu_lamb(params: Any, **kwargs: Any) -> torch.optim.Optimizer:
    """Habana ``FusedLamb`` when its semantics match ``kwargs`` (Lamb's), else :class:`Lamb`.

    Matching flags map one to one (``use_nvlamb`` is Habana's ``use_lamb``; ``max_grad_norm``
    ``None`` or ``<= 0`` disables clipping in both). ``no_weight_decay`` patterns become
    parameter groups first, which FusedLamb honours. FusedLamb keeps its moments in the
    parameters' dtype, not fp32 (same as apex): fine for fp32 parameters with bf16 autocast.
    """
    reasons = hpu_lamb_mismatches(**kwargs)
    fused_cls = None
    if not reasons:
        try:
            from habana_frameworks.torch.hpex.optimizers import FusedLamb

            fused_cls = FusedLamb
        except ImportError as err:
            reasons.append(f"habana_frameworks is not importable ({err})")
    if fused_cls is None:
        warnings.warn(
            "HPU LAMB: using omnibert's foreach Lamb instead of Habana FusedLamb because of "
            + "; ".join(reasons),
            stacklevel=2,
        )
        return Lamb(params, **{**kwargs, "impl": "foreach"})
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
    return fused_cls(groups, **fused_kwargs)


def ipu_lamb_differences(**kwargs: Any) -> list[str]:
    """How ``poptorch.optim.LAMB`` differs from ``Lamb(**kwargs)`` (empty: same maths)."""
    diffs = []
    max_grad_norm = kwargs.get("max_grad_norm", 1.0)
    if max_grad_norm is not None and max_grad_norm > 0:
        diffs.append(
            f"no global gradient-norm clipping (max_grad_norm={max_grad_norm} is ignored): "
            "poptorch's LAMB has none"
        )
    if not kwargs.get("use_nvlamb", False):
        diffs.append(
            "the trust ratio applies to every tensor, also those with weight_decay 0 "
            "(as use_nvlamb=True)"
        )
    if kwargs.get("adam_w_mode", True) is False:
        diffs.append("adam_w_mode=False is not available: weight decay is decoupled")
    if kwargs.get("grad_averaging", True) is False:
        diffs.append("grad_averaging=False is not available: m = b1*m + (1-b1)*g")
    if kwargs.get("exclude_from_layer_adaptation"):
        diffs.append("exclude_from_layer_adaptation is not available")
    if kwargs.get("max_weight_norm") is None:
        diffs.append("max_weight_norm=None becomes poptorch's default clamp of 65500 (fp16 max)")
    diffs.append("the step count is per parameter, not per group (equal unless grads skip)")
    return diffs


def ipu_lamb(params: Any, **kwargs: Any) -> torch.optim.Optimizer:
    """``poptorch.optim.LAMB`` with ``kwargs`` (Lamb's) mapped; warns about each difference."""
    import poptorch

    for diff in ipu_lamb_differences(**kwargs):
        warnings.warn(
            f"IPU LAMB (poptorch.optim.LAMB) differs from omnibert Lamb: {diff}.", stacklevel=2
        )
    groups = normalize_params(
        params, kwargs.get("weight_decay", 0.01), kwargs.get("no_weight_decay")
    )
    for group in groups:
        if isinstance(group, dict):
            group.pop("param_names", None)
    betas: Sequence[float] = kwargs.get("betas", (0.9, 0.999))
    return poptorch.optim.LAMB(
        groups,
        lr=kwargs.get("lr", 1e-3),
        betas=tuple(betas),
        eps=kwargs.get("eps", 1e-6),
        weight_decay=kwargs.get("weight_decay", 0.01),
        bias_correction=kwargs.get("bias_correction", True),
        max_weight_norm=kwargs.get("max_weight_norm"),
        accum_type=torch.float32,
        first_order_momentum_accum_type=torch.float32,
        second_order_momentum_accum_type=torch.float32,
    )
