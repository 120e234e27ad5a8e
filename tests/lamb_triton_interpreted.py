"""Triton LAMB kernel checks that must run with ``TRITON_INTERPRET=1`` set before Triton is
imported; ``tests/test_lamb_triton.py`` runs this file in a subprocess with it (the name does
not match ``test_*.py`` so the main test run does not collect it).
"""

from __future__ import annotations

import os

import pytest
import torch
from lamb_triton_cases import _batch, _run_triton

from omnibert.optim.lamb_math import reference_update

assert os.environ.get("TRITON_INTERPRET") == "1", "run through tests/test_lamb_triton.py"


@pytest.mark.parametrize(
    "kwargs", [{}, {"adam_w_mode": False}, {"max_weight_norm": 1.0}], ids=["adamw", "l2", "clamp"]
)
def test_triton_fp32_matches_reference(kwargs):
    assert os.environ["TRITON_INTERPRET"] == "1"
    ref, tri = _batch(**kwargs), _batch(**kwargs)
    inv_clip = torch.tensor(0.5)
    reference_update(ref, inv_clip)
    _run_triton(tri, inv_clip)
    for a, b in zip(
        ref.params + ref.exp_avgs + ref.exp_avg_sqs,
        tri.params + tri.exp_avgs + tri.exp_avg_sqs,
        strict=True,
    ):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_triton_bf16_params_round_like_the_fp32_result():
    tri = _batch(dtype=torch.bfloat16, n=700)
    ref32 = _batch(n=700)
    for t, r in zip(tri.params + tri.grads, ref32.params + ref32.grads, strict=True):
        r.copy_(t.float())  # the same (bf16-representable) numbers in fp32
    inv_clip = torch.tensor(1.0)
    reference_update(ref32, inv_clip)
    _run_triton(tri, inv_clip)
    for a, b in zip(ref32.params, tri.params, strict=True):
        assert b.dtype == torch.bfloat16
        torch.testing.assert_close(b, a.to(torch.bfloat16))  # within one bf16 rounding


def test_lamb_optimizer_selects_triton_under_the_interpreter_when_asked():
    from omnibert.optim import Lamb

    for impl in ("reference", "triton"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 2)
        )
        opt = Lamb(model.named_parameters(), lr=1e-2, no_weight_decay=["bias", r"^1\."], impl=impl)
        x = torch.randn(32, 8)
        for _ in range(3):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        if impl == "reference":
            expected = flat
    torch.testing.assert_close(flat, expected, rtol=1e-5, atol=1e-6)
