"""The LAMB update itself, written twice: per parameter (the readable reference) and multi-tensor.

Both functions take one :class:`LambBatch` (the tensors of one parameter group that have a
gradient, already in fp32 working precision) and a 0-d fp32 tensor ``inv_clip`` (1 / the
global-norm clipping factor), and update ``params``, ``exp_avgs`` and ``exp_avg_sqs`` in place.
The rules are NVIDIA apex ``FusedLAMB``'s (see docs/lamb.md), with the extra flags that the
optimiser resolves per tensor: ``decays`` (0 for tensors excluded from weight decay), ``adapt``
(whether the trust ratio applies) and ``max_weight_norm`` (poptorch's clamp of ``‖p‖``).

No function here reads a tensor value back to Python, so nothing forces a device sync.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from omnibert.compat import foreach_copy_, foreach_mul, foreach_norm_fp32


@dataclass
class LambHyper:
    """Hyperparameters of one group for one step (plain Python numbers)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    step: int
    bias_correction: bool
    grad_averaging: bool
    adam_w_mode: bool
    max_weight_norm: float | None

    @property
    def beta3(self) -> float:
        """Weight of the new gradient in the first moment (apex: ``1-beta1`` or 1)."""
        return 1.0 - self.beta1 if self.grad_averaging else 1.0

    @property
    def bias_corrections(self) -> tuple[float, float]:
        """``(1 - beta1**t, 1 - beta2**t)``, or ``(1, 1)`` without bias correction."""
        if not self.bias_correction:
            return 1.0, 1.0
        return 1.0 - self.beta1**self.step, 1.0 - self.beta2**self.step


@dataclass
class LambBatch:
    """The tensors of one group that take part in this step, all fp32 and on one device."""

    params: list[Tensor]
    grads: list[Tensor]
    exp_avgs: list[Tensor]
    exp_avg_sqs: list[Tensor]
    decays: list[float]
    adapt: list[bool]
    hyper: LambHyper

    def __len__(self) -> int:
        return len(self.params)


def global_grad_norm(grads: list[Tensor]) -> Tensor:
    """L2 norm over every gradient tensor, accumulated in fp32, as a 0-d tensor."""
    if not grads:
        return torch.zeros(())
    norms = foreach_norm_fp32(grads)
    return torch.linalg.vector_norm(torch.stack(norms))


def grad_sumsq(grads: list[Tensor], device: torch.device) -> Tensor:
    """``Σ g²`` over every gradient tensor, accumulated in fp32, as a ``[1]`` tensor on
    ``device`` (zero without gradients), ready to be summed over ranks that hold shards."""
    if not grads:
        return torch.zeros(1, device=device)
    return torch.stack(foreach_norm_fp32(grads)).square().sum().reshape(1).to(device)


def inverse_clip_factor(grad_norm: Tensor, max_grad_norm: float | None) -> Tensor:
    """``1 / max(‖g‖ / max_grad_norm, 1)``: apex divides gradients by the clip factor."""
    if max_grad_norm is None or max_grad_norm <= 0:
        return torch.ones((), dtype=torch.float32, device=grad_norm.device)
    return 1.0 / torch.clamp(grad_norm / max_grad_norm, min=1.0)


def trust_ratios(
    param_norms: Tensor, update_norms: Tensor, adapt: Tensor, max_weight_norm: float | None
) -> Tensor:
    """Per-tensor ``‖p‖ / ‖u‖`` where ``adapt``; 1 where not, or where either norm is 0."""
    if max_weight_norm is not None:
        param_norms = torch.clamp(param_norms, max=max_weight_norm)
    ok = adapt & (param_norms != 0) & (update_norms != 0)
    ratio = param_norms / torch.where(ok, update_norms, torch.ones_like(update_norms))
    return torch.where(ok, ratio, torch.ones_like(ratio))


def reference_norms(batch: LambBatch, inv_clip: Tensor) -> tuple[list[Tensor], Tensor]:
    """Stage 1, one tensor at a time: moments updated in place; the updates ``u`` and the
    ``[n, 2]`` squared norms ``(‖u‖², ‖p‖²)`` per tensor (``p`` before the update, as apex)."""
    h = batch.hyper
    bc1, bc2 = h.bias_corrections
    updates: list[Tensor] = []
    sq: list[Tensor] = []
    for p, g, m, v, decay in zip(
        batch.params, batch.grads, batch.exp_avgs, batch.exp_avg_sqs, batch.decays, strict=True
    ):
        scaled_grad = g * inv_clip
        if not h.adam_w_mode and decay != 0:  # L2 mode: decay joins the gradient
            scaled_grad = scaled_grad + decay * p
        m.mul_(h.beta1).add_(scaled_grad, alpha=h.beta3)
        v.mul_(h.beta2).addcmul_(scaled_grad, scaled_grad, value=1.0 - h.beta2)
        update = (m / bc1) / ((v / bc2).sqrt() + h.eps)
        if h.adam_w_mode and decay != 0:  # decoupled decay joins the update
            update = update + decay * p
        updates.append(update)
        sq.append(torch.stack([(update * update).sum(), (p * p).sum()]))
    return updates, torch.stack(sq)


def reference_apply(batch: LambBatch, updates: list[Tensor], sq_norms: Tensor) -> None:
    """Stage 2, one tensor at a time: ``p -= lr·r·u`` with the trust ratio from ``sq_norms``
    (this rank's sums, or the all-reduced ones when the tensors are shards)."""
    h = batch.hyper
    norms = sq_norms.sqrt()
    for i, (p, update) in enumerate(zip(batch.params, updates, strict=True)):
        ratio = trust_ratios(
            norms[i, 1],
            norms[i, 0],
            torch.tensor(batch.adapt[i], device=p.device),
            h.max_weight_norm,
        )
        p.sub_(h.lr * ratio * update)


def reference_update(batch: LambBatch, inv_clip: Tensor) -> None:
    """One LAMB step, one tensor at a time: the readable statement of the rules."""
    updates, sq = reference_norms(batch, inv_clip)
    reference_apply(batch, updates, sq)


def _subset(values: Sequence[Tensor], mask: list[bool]) -> list[Tensor]:
    return [t for t, keep in zip(values, mask, strict=True) if keep]


def foreach_norms(batch: LambBatch, inv_clip: Tensor) -> tuple[list[Tensor], Tensor]:
    """Stage 1 with ``torch._foreach_*`` ops (a fixed number of multi-tensor launches):
    moments in place; the updates (one temporary list) and ``[n, 2]`` squared norms."""
    h = batch.hyper
    bc1, bc2 = h.bias_corrections
    params, m, v = batch.params, batch.exp_avgs, batch.exp_avg_sqs
    # Tensors grouped by decay value (normally one value per group, or zero).
    decay_values = sorted({d for d in batch.decays if d != 0})
    masks = {d: [x == d for x in batch.decays] for d in decay_values}

    param_norms = torch.stack(torch._foreach_norm(params))
    update = foreach_mul(batch.grads, inv_clip)  # scaled gradient, fresh buffers
    if not h.adam_w_mode:
        for d in decay_values:
            torch._foreach_add_(_subset(update, masks[d]), _subset(params, masks[d]), alpha=d)
    torch._foreach_mul_(m, h.beta1)
    torch._foreach_add_(m, update, alpha=h.beta3)
    torch._foreach_mul_(v, h.beta2)
    torch._foreach_addcmul_(v, update, update, value=1.0 - h.beta2)
    # update <- (m / bc1) / (sqrt(v / bc2) + eps), reusing the scaled-gradient buffers
    foreach_copy_(update, v)
    torch._foreach_sqrt_(update)
    torch._foreach_mul_(update, 1.0 / math.sqrt(bc2))
    torch._foreach_add_(update, h.eps)
    torch._foreach_reciprocal_(update)
    torch._foreach_mul_(update, m)
    torch._foreach_mul_(update, 1.0 / bc1)
    if h.adam_w_mode:
        for d in decay_values:
            torch._foreach_add_(_subset(update, masks[d]), _subset(params, masks[d]), alpha=d)
    update_norms = torch.stack(torch._foreach_norm(update))
    return update, torch.stack([update_norms, param_norms], dim=1).square()


def foreach_apply(batch: LambBatch, update: list[Tensor], sq_norms: Tensor) -> None:
    """Stage 2 with ``torch._foreach_*`` ops: ``p -= lr·r·u`` for every tensor."""
    h = batch.hyper
    norms = sq_norms.sqrt()
    adapt = torch.tensor(batch.adapt, device=batch.params[0].device)
    scale = trust_ratios(norms[:, 1], norms[:, 0], adapt, h.max_weight_norm) * (-h.lr)
    torch._foreach_mul_(update, list(scale.unbind()))
    torch._foreach_add_(batch.params, update)


def foreach_update(batch: LambBatch, inv_clip: Tensor) -> None:
    """The same step as :func:`reference_update` with ``torch._foreach_*`` ops."""
    if not batch.params:
        return
    update, sq = foreach_norms(batch, inv_clip)
    foreach_apply(batch, update, sq)
