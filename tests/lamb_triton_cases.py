"""Shared cases for the multi-tensor Triton LAMB: the interpreter checks
(``lamb_triton_interpreted.py``, run by ``test_lamb_triton.py``) and the CUDA ones (``-m gpu``).

``check_trajectory(device)`` runs :class:`omnibert.optim.Lamb` with ``impl="triton"`` for a
few steps on a parameter set made to stress the chunking (tensors spanning several chunks,
one ending exactly on a chunk boundary, tiny ones, a zero-initialised bias, a tensor without
a gradient in one step) in three groups with their own hyperparameters (one with weight decay
0, hence no trust ratio) and compares every step with the float64 oracle of apex's rules in
``test_lamb.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from test_lamb import OracleGroup, oracle_step

from omnibert.optim import Lamb

#: chunk size for the checks: small, so small tensors span several chunks (the interpreter
#: runs each program in Python); each program then loops over 4 inner blocks of 16
CHUNK = 64
SHAPES = [
    [(20, 15), (64,), (3,), (130,)],  # decayed: 5 chunks; exactly one; tiny; 3 chunks
    [(7,), (1,), (9, 9)],  # no decay (bias / LayerNorm): no trust ratio
    [(40, 4), (5,)],  # decayed, another lr / betas / eps
]
GROUPS = [
    {"lr": 2e-2, "weight_decay": 0.01},
    {"lr": 2e-2, "weight_decay": 0.0},
    {"lr": 5e-3, "weight_decay": 0.1, "betas": (0.8, 0.99), "eps": 1e-5},
]


def make_params(seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    groups = [[rng.normal(size=s) for s in shapes] for shapes in SHAPES]
    groups[1][0][:] = 0.0  # a zero-initialised bias: ||p|| = 0, ratio 1
    return [[p.astype(np.float32).astype(np.float64) for p in g] for g in groups]


def check_trajectory(
    device: str,
    grad_scale: float,
    steps: int = 3,
    rtol: float = 2e-5,
    atol: float = 2e-6,
    **lamb_kwargs,
) -> Lamb:
    """Lamb(impl=triton) on ``device`` against the float64 oracle, step by step."""
    start = make_params()
    oracle_kwargs = {
        k: lamb_kwargs[k]
        for k in ("max_grad_norm", "adam_w_mode", "use_nvlamb", "max_weight_norm")
        if k in lamb_kwargs
    }
    oracle = [OracleGroup([p.copy() for p in ps], **GROUPS[i]) for i, ps in enumerate(start)]
    tparams = [[torch.tensor(p, dtype=torch.float32, device=device) for p in ps] for ps in start]
    opt = Lamb(
        [{"params": tp, **GROUPS[i]} for i, tp in enumerate(tparams)],
        impl="triton",
        triton_chunk_size=CHUNK,
        **lamb_kwargs,
    )
    rng = np.random.default_rng(1)
    for step in range(steps):
        grads: list[list[np.ndarray | None]] = [
            [rng.normal(size=p.shape).astype(np.float32).astype(np.float64) * grad_scale for p in g]
            for g in start
        ]
        if step == 1:
            grads[0][2] = None  # a tensor without a gradient this step: left untouched
        for tps, gs in zip(tparams, grads, strict=True):
            for tp, g in zip(tps, gs, strict=True):
                tp.grad = None if g is None else torch.tensor(g, dtype=torch.float32, device=device)
        opt.step()
        oracle_step(oracle, grads, **oracle_kwargs)
        want = np.sqrt(sum(float(np.sum(g * g)) for gs in grads for g in gs if g is not None))
        np.testing.assert_allclose(float(opt.last_grad_norm), want, rtol=1e-5)
        for tps, og in zip(tparams, oracle, strict=True):
            for tp, op in zip(tps, og.params, strict=True):
                got = tp.detach().cpu().numpy().astype(np.float64)
                np.testing.assert_allclose(got, op, rtol=rtol, atol=atol, err_msg=f"step {step}")
    return opt


@contextmanager
def counting_launches() -> Iterator[list[str]]:
    """Record every Triton kernel launch of the LAMB step (by wrapping the kernels' ``[grid]``)."""
    from omnibert_kernels import lamb_triton

    real = lamb_triton.kernels()
    launches: list[str] = []

    class Counted:
        def __init__(self, name: str, kernel) -> None:
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            launch = self.kernel[grid]

            def run(*args, **kwargs):
                launches.append(self.name)
                return launch(*args, **kwargs)

            return run

    original = lamb_triton.kernels
    lamb_triton.kernels = lambda: {n: Counted(n, k) for n, k in real.items()}  # type: ignore[assignment]
    try:
        yield launches
    finally:
        lamb_triton.kernels = original
