"""Multi-tensor Triton LAMB checks that must run with ``TRITON_INTERPRET=1`` set before Triton is
imported; ``tests/e2e/test_lamb_triton.py`` runs this file in a subprocess with it (the name does
not match ``test_*.py`` so the main test run does not collect it).
"""

from __future__ import annotations

import os

import pytest
import torch
from lamb_triton_cases import CHUNK, check_trajectory, counting_launches

from omnibert.optim import Lamb

assert os.environ.get("TRITON_INTERPRET") == "1", "run through tests/e2e/test_lamb_triton.py"


@pytest.mark.parametrize("grad_scale", [0.01, 10.0], ids=["clip-inactive", "clip-active"])
def test_trajectory_matches_the_float64_oracle(grad_scale):
    opt = check_trajectory("cpu", grad_scale, max_grad_norm=1.0)
    assert (float(opt.last_grad_norm) > 1.0) == (grad_scale > 1.0)  # clipping really differs


@pytest.mark.parametrize(
    "kwargs",
    [
        {"adam_w_mode": False},
        {"use_nvlamb": True, "max_weight_norm": 0.5},
        {"max_grad_norm": None},
    ],
    ids=["l2", "nvlamb-clamp", "no-clipping"],
)
def test_flags_match_the_float64_oracle(kwargs):
    check_trajectory("cpu", 3.0, steps=2, **kwargs)


def _model(n_layers: int) -> list[tuple[str, torch.nn.Parameter]]:
    g = torch.Generator().manual_seed(n_layers)
    named = []
    for i in range(n_layers):
        named.append((f"l{i}.weight", torch.nn.Parameter(torch.randn(9, 10, generator=g))))
        named.append((f"l{i}.bias", torch.nn.Parameter(torch.randn(9, generator=g))))
    return named


def test_launches_per_step_do_not_grow_with_the_number_of_tensors():
    counts = {}
    for n_layers in (2, 20):
        named = _model(n_layers)
        opt = Lamb(named, impl="triton", triton_chunk_size=CHUNK, no_weight_decay=["bias"])
        for _, p in named:
            p.grad = torch.ones_like(p)
        opt.step()  # builds the tables
        with counting_launches() as launches:
            opt.step()
        counts[2 * n_layers] = launches
    assert counts[4] == counts[40] == ["grad_sumsq", "moments", "segment_sums", "apply"]


def test_bf16_parameters_with_fp32_masters_get_the_rounded_master():
    """bf16-true: the kernel updates the fp32 master and writes the bf16 weight in one pass."""
    named32 = _model(2)
    named16 = [(n, torch.nn.Parameter(p.detach().to(torch.bfloat16))) for n, p in named32]
    for (_, a), (_, b) in zip(named32, named16, strict=True):
        a.data.copy_(b.detach().float())  # the same bf16-representable start
    ref = Lamb(named32, impl="foreach", no_weight_decay=["bias"])
    tri = Lamb(named16, impl="triton", triton_chunk_size=CHUNK, no_weight_decay=["bias"])
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        for (_, a), (_, b) in zip(named32, named16, strict=True):
            grad = torch.randn(a.shape, generator=g).to(torch.bfloat16)
            a.grad, b.grad = grad.float(), grad  # the kernel reads the bf16 gradient itself
        ref.step()
        tri.step()
    for (_, a), (_, b) in zip(named32, named16, strict=True):
        master = tri.state[b]["master"]
        torch.testing.assert_close(master, a.detach(), rtol=1e-5, atol=1e-6)
        assert b.dtype == torch.bfloat16
        assert torch.equal(b.detach(), master.to(torch.bfloat16))


def test_bf16_parameters_without_masters_are_updated_in_place():
    named_ref = [(n, torch.nn.Parameter(p.detach().to(torch.bfloat16))) for n, p in _model(2)]
    named_tri = [(n, torch.nn.Parameter(p.detach().clone())) for n, p in named_ref]
    opts = [
        Lamb(named, impl=impl, master_weights=False, triton_chunk_size=CHUNK)
        for named, impl in ((named_ref, "foreach"), (named_tri, "triton"))
    ]
    g = torch.Generator().manual_seed(4)
    for _ in range(2):
        for (_, a), (_, b) in zip(named_ref, named_tri, strict=True):
            a.grad = torch.randn(a.shape, generator=g).to(torch.bfloat16)
            b.grad = a.grad.clone()
        for opt in opts:
            opt.step()
    for (_, a), (_, b) in zip(named_ref, named_tri, strict=True):
        assert b.dtype == torch.bfloat16 and "master" not in opts[1].state[b]
        # both round the same fp32 result (up to fp32 ulps) to bf16: within one bf16 step
        torch.testing.assert_close(b, a, rtol=2**-7, atol=1e-6)
