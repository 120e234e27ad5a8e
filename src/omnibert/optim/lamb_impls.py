"""The implementations behind :class:`omnibert.optim.Lamb`'s step, and the two step drivers.

* **Per-implementation functions**: :data:`UPDATES` (one whole single-group update: the
  warm-up runs it on tiny tensors to find a kernel that cannot build) and :data:`STAGES` (the
  two stages of the per-group implementations: moments and squared norms, then the apply with
  the trust ratio), for ``reference`` and ``foreach`` (:mod:`omnibert.optim.lamb_math`),
  ``compiled`` (:mod:`omnibert.optim.lamb_compiled`) and ``triton`` (``omnibert_kernels``).
* **Step drivers**: :func:`staged_step` (global gradient norm, stage 1 of every group,
  stage 2 of every group) and :func:`triton_step` (every group in one multi-tensor call).
  Both take ``reduce``, the in-place sum over the ranks that hold shards of the parameters
  (:func:`shard_all_reduce`) or the other tensors of a partitioned model
  (:func:`partition_all_reduce`; ``None`` unsharded), and run it where the unsharded step
  would read a norm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from omnibert.optim.lamb_compiled import compiled_apply, compiled_norms, compiled_update
from omnibert.optim.lamb_math import (
    LambBatch,
    LambHyper,
    foreach_apply,
    foreach_norms,
    foreach_update,
    grad_sumsq,
    inverse_clip_factor,
    reference_apply,
    reference_norms,
    reference_update,
)

__all__ = [
    "IMPLS",
    "STAGES",
    "UPDATES",
    "multi_tensor_lamb",
    "partition_all_reduce",
    "shard_all_reduce",
    "staged_step",
    "triton_step",
]

IMPLS = ("auto", "reference", "foreach", "compiled", "triton")
UpdateFn = Callable[[LambBatch, Tensor], None]
#: stage 1 of a group (moments; updates or a context; ``[n, 2]`` squared norms) and stage 2
#: (apply with the trust ratio from those norms, summed over ranks when tensors are shards)
NormsFn = Callable[[LambBatch, Tensor], tuple[Any, Tensor]]
ApplyFn = Callable[[LambBatch, Any, Tensor], None]
#: per group: its tensors, (param, master) pairs to copy back, the low-precision mirrors
Built = tuple[LambBatch, list[tuple[Tensor, Tensor]], list[Tensor | None]]


def multi_tensor_lamb(**kwargs: Any) -> Any:
    """An ``omnibert_kernels.lamb_triton.MultiTensorLamb(**kwargs)`` (``chunk_size``)."""
    # lazy: only the Triton path needs omnibert_kernels
    from omnibert_kernels.lamb_triton import MultiTensorLamb

    return MultiTensorLamb(**kwargs)


def _coefficients(h: LambHyper) -> Any:
    # lazy: only the Triton path needs omnibert_kernels
    from omnibert_kernels.lamb_triton import GroupCoefficients

    bc1, bc2 = h.bias_corrections
    return GroupCoefficients(h.lr, h.beta1, h.beta2, h.beta3, bc1, bc2, h.eps, h.max_weight_norm)


def _triton_update(batch: LambBatch, inv_clip: Tensor) -> None:
    """One group through the multi-tensor kernel with a given clip factor (the warm-up's
    build check; the optimiser's step runs every group in one call, clipping included)."""
    h = batch.hyper
    multi_tensor_lamb().step(
        batch.params,
        [g * inv_clip for g in batch.grads],
        batch.exp_avgs,
        batch.exp_avg_sqs,
        tensor_group=[0] * len(batch),
        decays=batch.decays,
        adapt=batch.adapt,
        groups=[_coefficients(h)],
        adam_w_mode=h.adam_w_mode,
        max_grad_norm=None,
    )


#: whole single-group updates (the warm-up runs these on tiny tensors)
UPDATES: dict[str, UpdateFn] = {
    "reference": reference_update,
    "foreach": foreach_update,
    "compiled": compiled_update,
    "triton": _triton_update,
}
#: the two stages of the per-group implementations (``triton`` runs all groups at once)
STAGES: dict[str, tuple[NormsFn, ApplyFn]] = {
    "reference": (reference_norms, reference_apply),
    "foreach": (foreach_norms, foreach_apply),
    "compiled": (compiled_norms, compiled_apply),
}


def shard_all_reduce(group: Any, slots: list[int], total: int) -> Callable[[Tensor], None]:
    """An in-place sum over the ranks of ``group``: ``[1]`` (Σg²) as is, ``[n, 2]``
    per-tensor rows through a vector of ``total`` rows, one per parameter of the optimiser
    (``slots``: the rows of the tensors that have a gradient)."""

    def all_reduce(t: Tensor) -> None:
        if t.dim() == 1:
            dist.all_reduce(t, group=group)
            return
        rows = torch.tensor(slots, dtype=torch.long, device=t.device)
        full = torch.zeros(total, 2, dtype=t.dtype, device=t.device)
        full.index_copy_(0, rows, t)
        dist.all_reduce(full, group=group)
        t.copy_(full.index_select(0, rows))

    return all_reduce


def partition_all_reduce(group: Any) -> Callable[[Tensor], None]:
    """An in-place sum over the ranks of ``group`` of ``[1]`` (Σg²) only, for whole tensors
    partitioned over the ranks (ZeRO-1): the global gradient norm spans every rank's tensors,
    while the ``[n, 2]`` per-tensor rows are whole tensors' norms already and stay local."""

    def all_reduce(t: Tensor) -> None:
        if t.dim() == 1:
            dist.all_reduce(t, group=group)

    return all_reduce


def staged_step(
    stages: tuple[NormsFn, ApplyFn],
    built: list[Built],
    reduce: Callable[[Tensor], None] | None,
    device: torch.device,
    max_grad_norm: float | None,
    proceed: Callable[[Tensor], bool] | None = None,
) -> Tensor:
    """Global norm, stage 1 of every group, (all-reduce), stage 2 of every group; returns
    the global gradient norm before clipping. ``proceed`` (where given) sees that norm first:
    False leaves everything unchanged."""
    norms_fn, apply_fn = stages
    sumsq = grad_sumsq([g for b, _, _ in built for g in b.grads], device)
    if reduce is not None:
        reduce(sumsq)
    grad_norm = sumsq.sqrt().reshape(())
    if proceed is not None and not proceed(grad_norm):
        return grad_norm
    inv_clip = inverse_clip_factor(grad_norm, max_grad_norm)
    firsts = [norms_fn(b, inv_clip) if len(b) else (None, None) for b, _, _ in built]
    if reduce is not None:
        stacked = [sq for _, sq in firsts if sq is not None]
        rows = torch.cat(stacked) if stacked else torch.zeros(0, 2, device=device)
        reduce(rows)
        sizes = [len(b) for b, _, _ in built if len(b)]
        it = iter(rows.split(sizes))
        firsts = [(ctx, next(it)) if sq is not None else (ctx, sq) for ctx, sq in firsts]
    for (batch, _, _), (ctx, sq) in zip(built, firsts, strict=True):
        if sq is not None:
            apply_fn(batch, ctx, sq)
    return grad_norm


def triton_step(
    kernel: Any,
    built: list[Built],
    reduce: Callable[[Tensor], None] | None,
    device: torch.device,
    adam_w_mode: bool,
    max_grad_norm: float | None,
    proceed: Callable[[Tensor], bool] | None = None,
) -> Tensor:
    """Every group in one call of ``kernel`` (a :func:`multi_tensor_lamb`: four Triton
    launches); returns the global gradient norm before clipping."""
    cols: dict[str, list[Any]] = {k: [] for k in ("p", "g", "m", "v", "mirror", "group")}
    decays: list[float] = []
    adapt: list[bool] = []
    for i, (b, _, mirrors) in enumerate(built):
        cols["p"] += b.params
        cols["g"] += b.grads
        cols["m"] += b.exp_avgs
        cols["v"] += b.exp_avg_sqs
        cols["mirror"] += mirrors
        cols["group"] += [i] * len(b)
        decays += b.decays
        adapt += b.adapt
    if not cols["p"]:  # a rank without gradients still takes part in the all-reduces
        if reduce is not None:
            reduce(torch.zeros(1, device=device))
            reduce(torch.zeros(0, 2, device=device))
        return torch.zeros((), device=device)
    norm: Tensor = kernel.step(
        cols["p"],
        [g if g.is_contiguous() else g.contiguous() for g in cols["g"]],
        cols["m"],
        cols["v"],
        tensor_group=cols["group"],
        decays=decays,
        adapt=adapt,
        groups=[_coefficients(b.hyper) for b, _, _ in built],
        adam_w_mode=adam_w_mode,
        max_grad_norm=max_grad_norm,
        mirrors=cols["mirror"],
        all_reduce=reduce,
        proceed=proceed,
    )
    return norm
