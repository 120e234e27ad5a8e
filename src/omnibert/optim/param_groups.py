"""Parameter groups as in the BERT recipes: no weight decay for biases and LayerNorm.

Patterns are regular expressions searched in the parameter's name (``re.search``, as the
Google/MLPerf TensorFlow code does with ``exclude_from_weight_decay``), so ``"bias"``,
``"LayerNorm"`` and ``"layer_norm"`` cover BERT's names. They come from config
(``conf/optimizer/*.yaml``: ``no_weight_decay``), never from code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

#: ``_norm``: the pre-norm encoders' ``attn_norm`` / ``mlp_norm`` / ``final_norm`` (docs/modern.md)
BERT_NO_WEIGHT_DECAY = ("bias", "LayerNorm", "layer_norm", "_norm")

NamedParams = Iterable[tuple[str, Tensor]]


def matches_any(name: str, patterns: Sequence[str] | None) -> bool:
    """True when any pattern is found in ``name`` (``re.search``)."""
    return any(re.search(p, name) is not None for p in patterns or ())


def _is_named(items: list[Any]) -> bool:
    return bool(items) and all(
        isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in items
    )


def build_param_groups(
    params: nn.Module | NamedParams,
    weight_decay: float,
    no_weight_decay: Sequence[str] = BERT_NO_WEIGHT_DECAY,
) -> list[dict[str, Any]]:
    """Split trainable named parameters into a decayed and a not-decayed group.

    Each group carries ``param_names`` so that name-based flags and logs can see them.
    Empty groups are dropped; parameters with ``requires_grad=False`` are left out.
    """
    named = list(params.named_parameters() if isinstance(params, nn.Module) else params)
    if not _is_named(named):
        raise ValueError(
            "build_param_groups needs (name, parameter) pairs: pass model.named_parameters() "
            "or the module itself, not model.parameters()."
        )
    decay: list[tuple[str, Tensor]] = []
    no_decay: list[tuple[str, Tensor]] = []
    for name, p in named:
        if p.requires_grad:
            (no_decay if matches_any(name, no_weight_decay) else decay).append((name, p))
    groups = []
    for members, wd in ((decay, weight_decay), (no_decay, 0.0)):
        if members:
            groups.append(
                {
                    "params": [p for _, p in members],
                    "param_names": [n for n, _ in members],
                    "weight_decay": wd,
                }
            )
    return groups


def normalize_params(
    params: Any, weight_decay: float, no_weight_decay: Sequence[str] | None
) -> list[Any]:
    """Turn a module, named parameters, tensors or group dicts into what ``Optimizer`` takes.

    Named parameters (or a module) are split with :func:`build_param_groups` when
    ``no_weight_decay`` is given, otherwise kept in one group that still records the names.
    """
    if isinstance(params, nn.Module):
        params = params.named_parameters()
    items = list(params)
    if _is_named(items):
        if no_weight_decay:
            return build_param_groups(items, weight_decay, no_weight_decay)
        kept = [(n, p) for n, p in items if p.requires_grad]
        return [{"params": [p for _, p in kept], "param_names": [n for n, _ in kept]}]
    if no_weight_decay and not all(isinstance(x, dict) for x in items):
        raise ValueError(
            "no_weight_decay patterns need parameter names: pass model.named_parameters() "
            "(or the module) instead of model.parameters()."
        )
    return items


def fused_adamw_applies(params: Sequence[Tensor]) -> bool:
    """Whether torch's fused AdamW kernel is the one to use for ``params``: all floating
    point, all on CUDA (one kernel launch per step for every tensor, instead of the foreach
    path's several)."""
    return bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` that takes named parameters and config-driven no-decay patterns.

    ``fused``: ``"auto"`` (``conf/optimizer/adamw.yaml``) uses torch's fused kernel when every
    parameter is on CUDA (:func:`fused_adamw_applies`; the same update, in fewer launches) and
    torch's default elsewhere; ``True``/``False``/``None`` as in ``torch.optim.AdamW``.
    :attr:`impl` says which kernel the steps run.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        no_weight_decay: Sequence[str] | None = BERT_NO_WEIGHT_DECAY,
        fused: bool | str | None = None,
        **kwargs: Any,
    ) -> None:
        if "betas" in kwargs:
            kwargs["betas"] = tuple(kwargs["betas"])
        groups = normalize_params(params, weight_decay, no_weight_decay)
        if fused == "auto":
            tensors = [p for g in groups for p in (g["params"] if isinstance(g, dict) else [g])]
            fused = True if fused_adamw_applies(tensors) and not kwargs.get("foreach") else None
        elif isinstance(fused, str):
            raise ValueError(f"AdamW fused={fused!r} must be auto, true, false or null.")
        super().__init__(groups, lr=lr, weight_decay=weight_decay, fused=fused, **kwargs)

    @property
    def impl(self) -> str:
        """The update kernel: ``fused``, ``foreach`` or ``for-loop``."""
        group = self.param_groups[0] if self.param_groups else {}
        if group.get("fused"):
            return "fused"
        foreach = group.get("foreach")
        if foreach is None:  # torch's default: foreach for CUDA tensors, the loop elsewhere
            foreach = all(p.is_cuda for g in self.param_groups for p in g["params"])
        return "foreach" if foreach else "for-loop"
