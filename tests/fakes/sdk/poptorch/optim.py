"""FAKE ``poptorch.optim`` with the documented ``LAMB`` signature (poptorch 3.x); no maths."""

from __future__ import annotations

from typing import Any

import torch


class LAMB(torch.optim.Optimizer):
    """Records its arguments; ``step`` raises, as poptorch optimisers run inside the IPU graph."""

    def __init__(
        self,
        params: Any,
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        bias_correction: bool | None = None,
        loss_scaling: float | None = None,
        max_weight_norm: float | None = None,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
    ) -> None:
        defaults = {
            "lr": 1e-3 if lr is None else lr,
            "betas": (0.9, 0.999) if betas is None else betas,
            "eps": 1e-8 if eps is None else eps,
            "weight_decay": 1e-2 if weight_decay is None else weight_decay,
            "max_weight_norm": 65500.0 if max_weight_norm is None else max_weight_norm,
        }
        super().__init__(params, defaults)
        self.bias_correction = True if bias_correction is None else bias_correction
        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        self.accum_types = (
            accum_type,
            first_order_momentum_accum_type,
            second_order_momentum_accum_type,
        )
        self.fake = True

    def step(self, closure: Any = None) -> Any:
        raise RuntimeError("fake poptorch: optimisers only run on an IPU")
