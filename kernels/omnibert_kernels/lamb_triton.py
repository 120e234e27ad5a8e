"""Fused LAMB for CUDA in Triton: two passes over memory per tensor.

* ``_lamb_pass1``: read ``g, p, m, v`` (any float dtype for ``g``/``p``, fp32 ``m``/``v``),
  write the new ``m, v``, and add each block's partial ``Σu²`` and ``Σp²`` into a per-tensor
  fp32 accumulator (atomics, so the summation order is not fixed from run to run);
* trust ratios for all tensors at once (a few torch ops on a ``[T, 2]`` tensor, no sync);
* ``_lamb_pass2``: read ``m, v, p``, recompute the update ``u`` and write ``p`` (rounded to its
  own dtype, so bf16/fp16 parameters without fp32 masters work too).

The maths is the reference's (``omnibert.optim.lamb_math.reference_update``; parity tests in
``tests/test_lamb_triton.py`` run under ``TRITON_INTERPRET=1`` on CPU). One launch per tensor
per pass: ~2 launches per parameter tensor, 412 for BERT-base, each moving megabytes.
``triton`` is imported lazily by :func:`triton_available` / :func:`lamb_update`.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

BLOCK_SIZE = 2048
# coefficient vector layout shared with the kernels
_INV_CLIP, _B1, _B3, _B2, _OMB2, _INV_BC1, _INV_SQRT_BC2, _EPS = range(8)


def triton_available(device: torch.device | None = None) -> bool:
    """True when Triton imports and can run on ``device`` (CUDA, or anything when interpreting)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return device is not None and device.type == "cuda" and torch.cuda.is_available()


@functools.cache
def _kernels() -> tuple[Any, Any]:
    import triton
    import triton.language as tl

    @triton.jit
    def _lamb_pass1(
        g_ptr,
        p_ptr,
        m_ptr,
        v_ptr,
        coef_ptr,
        sums_ptr,
        index,
        n,
        decay,
        DECAY: tl.constexpr,
        L2: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask, other=0.0)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0)
        g = g * tl.load(coef_ptr + 0)
        if DECAY and L2:
            g = g + decay * p
        m = m * tl.load(coef_ptr + 1) + g * tl.load(coef_ptr + 2)
        v = v * tl.load(coef_ptr + 3) + g * g * tl.load(coef_ptr + 4)
        u = (m * tl.load(coef_ptr + 5)) / (
            tl.sqrt(v) * tl.load(coef_ptr + 6) + tl.load(coef_ptr + 7)
        )
        if DECAY and not L2:
            u = u + decay * p
        u = tl.where(mask, u, 0.0)
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
        tl.atomic_add(sums_ptr + 2 * index, tl.sum(u * u, axis=0))
        tl.atomic_add(sums_ptr + 2 * index + 1, tl.sum(p * p, axis=0))

    @triton.jit
    def _lamb_pass2(
        p_ptr,
        m_ptr,
        v_ptr,
        coef_ptr,
        scale_ptr,
        index,
        n,
        decay,
        DECAY: tl.constexpr,
        L2: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        p_raw = tl.load(p_ptr + offs, mask=mask, other=0.0)
        p = p_raw.to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask, other=0.0)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0)
        u = (m * tl.load(coef_ptr + 5)) / (
            tl.sqrt(v) * tl.load(coef_ptr + 6) + tl.load(coef_ptr + 7)
        )
        if DECAY and not L2:
            u = u + decay * p
        p = p + u * tl.load(scale_ptr + index)
        tl.store(p_ptr + offs, p.to(p_raw.dtype), mask=mask)

    return _lamb_pass1, _lamb_pass2


def lamb_update(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    decays: Sequence[float],
    adapt: Sequence[bool],
    *,
    inv_clip: Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    beta3: float,
    bias_corrections: tuple[float, float],
    eps: float,
    adam_w_mode: bool,
    max_weight_norm: float | None,
) -> None:
    """One LAMB step for one parameter group (apex rules, see docs/lamb.md), in place.

    Tensors must be contiguous; ``exp_avgs``/``exp_avg_sqs`` fp32; ``params`` fp32/bf16/fp16.
    """
    if not params:
        return
    pass1, pass2 = _kernels()
    device = params[0].device
    bc1, bc2 = bias_corrections
    coef = torch.tensor(
        [0.0, beta1, beta3, beta2, 1.0 - beta2, 1.0 / bc1, 1.0 / math.sqrt(bc2), eps],
        dtype=torch.float32,
        device=device,
    )
    coef[_INV_CLIP] = inv_clip
    sums = torch.zeros(len(params), 2, dtype=torch.float32, device=device)
    l2 = not adam_w_mode
    for i, (p, g, m, v, d) in enumerate(
        zip(params, grads, exp_avgs, exp_avg_sqs, decays, strict=True)
    ):
        n = p.numel()
        grid = (triton_cdiv(n, BLOCK_SIZE),)
        pass1[grid](g, p, m, v, coef, sums, i, n, float(d), d != 0, l2, BLOCK=BLOCK_SIZE)
    norms = sums.sqrt()
    update_norms, param_norms = norms[:, 0], norms[:, 1]
    if max_weight_norm is not None:
        param_norms = torch.clamp(param_norms, max=max_weight_norm)
    ok = torch.tensor(list(adapt), device=device) & (param_norms != 0) & (update_norms != 0)
    ratio = torch.where(ok, param_norms / torch.where(ok, update_norms, 1.0), 1.0)
    scale = (ratio * (-lr)).contiguous()
    for i, (p, m, v, d) in enumerate(zip(params, exp_avgs, exp_avg_sqs, decays, strict=True)):
        n = p.numel()
        grid = (triton_cdiv(n, BLOCK_SIZE),)
        pass2[grid](p, m, v, coef, scale, i, n, float(d), d != 0, l2, BLOCK=BLOCK_SIZE)


def triton_cdiv(a: int, b: int) -> int:
    """Ceiling division (kept here so callers need not import triton)."""
    return -(-a // b)
