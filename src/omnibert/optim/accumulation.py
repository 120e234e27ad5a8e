"""MLPerf TF's order under gradient accumulation: clip each micro-batch, then accumulate.

apex/NVIDIA (and :class:`omnibert.optim.Lamb` by default) clip the *accumulated* gradient
inside the optimiser step. The MLPerf TensorFlow reference instead clips every micro-batch's
gradients to global norm 1.0 and then accumulates their average
(``GradientAggregationOptimizer``), and its LAMB does not clip again. To reproduce that, use
``Lamb(max_grad_norm=None)`` and a :class:`MicroBatchClipper` around each backward pass; in a
LightningModule call :meth:`~MicroBatchClipper.before_backward` from ``on_before_backward``
and :meth:`~MicroBatchClipper.after_backward` from ``on_after_backward``.

Not for fp16 with a ``GradScaler``: its gradients are still scaled when ``on_after_backward``
runs, so a norm threshold would be meaningless (bf16 and fp32 are fine).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from omnibert.optim.lamb_math import global_grad_norm


class MicroBatchClipper:
    """Clip each micro-batch's gradients to a global norm before they are accumulated.

    Args:
        params: the parameters whose ``.grad`` is accumulated.
        max_norm: the global-norm threshold for one micro-batch's gradient (MLPerf: 1.0).
        grads_prescaled_by: the factor by which backward already divided the gradients;
            Lightning divides the loss by ``accumulate_grad_batches``, so pass that number:
            the threshold then applies to the unscaled gradient, as in MLPerf, whose
            accumulated gradient is the mean of the clipped micro-batch gradients.
    """

    def __init__(
        self, params: Iterable[Tensor], max_norm: float = 1.0, grads_prescaled_by: float = 1.0
    ) -> None:
        if max_norm <= 0 or grads_prescaled_by <= 0:
            raise ValueError("MicroBatchClipper needs max_norm > 0 and grads_prescaled_by > 0.")
        self.params = [p for p in params if p.requires_grad]
        self.max_norm = float(max_norm)
        self.prescale = float(grads_prescaled_by)
        self._stash: list[Tensor | None] = []

    @torch.no_grad()
    def before_backward(self) -> None:
        """Move the gradients accumulated so far aside, so backward writes a clean micro-batch."""
        self._stash = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def after_backward(self) -> Tensor:
        """Clip this micro-batch's gradients, add back the stash; returns the pre-clip norm."""
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = global_grad_norm(grads) * self.prescale
        scale = 1.0 / torch.clamp(norm / self.max_norm, min=1.0)
        if grads:
            torch._foreach_mul_(grads, scale)
        for p, old in zip(self.params, self._stash or [None] * len(self.params), strict=True):
            if old is not None:
                if p.grad is None:
                    p.grad = old
                else:
                    old.add_(p.grad)
                    p.grad = old
        self._stash = []
        return norm
