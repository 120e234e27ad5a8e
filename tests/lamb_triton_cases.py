"""Shared inputs for the Triton LAMB checks (interpreter and CUDA)."""

from __future__ import annotations

import torch

from omnibert.optim.lamb import _triton_update
from omnibert.optim.lamb_math import LambBatch, LambHyper


def _batch(dtype=torch.float32, seed=0, adam_w_mode=True, max_weight_norm=None, n=5000):
    g = torch.Generator().manual_seed(seed)
    shapes = [(n,), (33, 7), (16,), (3, 2049)]
    params = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    params[2].zero_()
    grads = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    ms = [torch.randn(s, generator=g).abs() * 0.1 for s in shapes]
    vs = [torch.rand(s, generator=g) * 0.01 for s in shapes]
    hyper = LambHyper(0.05, 0.9, 0.999, 1e-6, 3, True, True, adam_w_mode, max_weight_norm)
    return LambBatch(
        params, grads, ms, vs, [0.01, 0.0, 0.01, 0.01], [True, False, True, True], hyper
    )


def _run_triton(batch: LambBatch, inv_clip: torch.Tensor) -> None:
    """The optimiser's own Triton call (so the test exercises what ``Lamb`` runs)."""
    _triton_update(batch, inv_clip)
