"""FAKE ``habana_frameworks.torch.hpex.optimizers`` with the documented ``FusedLamb`` signature."""

from __future__ import annotations

from typing import Any

import torch


class FusedLamb(torch.optim.Optimizer):
    """Records its arguments; ``step`` raises (the real one calls ``torch.ops.hpu`` kernels)."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        amsgrad: bool = False,
        adam_w_mode: bool = True,
        grad_averaging: bool = True,
        set_grad_none: bool = True,
        max_grad_norm: float | None = 1.0,
        use_lamb: bool = False,
        fused: bool = False,
        dtype: torch.dtype | None = None,
    ) -> None:
        defaults = {
            "lr": lr,
            "bias_correction": bias_correction,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "grad_averaging": grad_averaging,
            "max_grad_norm": max_grad_norm,
        }
        super().__init__(params, defaults)
        self.adam_w_mode = adam_w_mode
        self.set_grad_none = set_grad_none
        self.use_lamb = use_lamb
        self.fake = True

    def step(self, closure: Any = None) -> Any:
        raise RuntimeError("fake habana_frameworks: FusedLamb only runs on an HPU")
