"""The implementations agree (reference vs foreach vs compiled), and the optimiser plumbing:
mixed precision with fp32 master state, state_dict round trips, implementation choice."""

from __future__ import annotations

import warnings

import pytest
import torch

from omnibert import compat
from omnibert.optim import Lamb, lamb_impls

# a miniature BERT parameter set: embeddings, attention/FFN matrices, biases, LayerNorm
SHAPES = [
    (97, 16),
    (32, 16),
    (2, 16),
    (16,),
    (16,),
    (48, 16),
    (48,),
    (16, 16),
    (16,),
    (64, 16),
    (64,),
    (16, 64),
    (16,),
]


def make_named(seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    named = []
    for i, shape in enumerate(SHAPES):
        name = f"layer{i}.{'bias' if len(shape) == 1 else 'weight'}"
        t = torch.randn(shape, generator=g) * 0.05
        if i == 3:
            t.zero_()  # a zero-initialised bias: ||p|| = 0
        named.append((name, torch.nn.Parameter(t.to(dtype))))
    return named


def run(impl: str, steps: int = 5, dtype=torch.float32, grad_scale: float = 1.0, **kwargs):
    named = make_named(dtype=dtype)
    opt = Lamb(named, lr=2e-2, no_weight_decay=["bias"], impl=impl, **kwargs)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for _, p in named:
            p.grad = (torch.randn(p.shape, generator=g) * grad_scale).to(dtype)
        opt.step()
    return named, opt


@pytest.mark.parametrize("grad_scale", [0.01, 3.0])
@pytest.mark.parametrize(
    "kwargs", [{}, {"adam_w_mode": False}, {"use_nvlamb": True, "max_weight_norm": 0.3}]
)
def test_foreach_matches_reference(grad_scale, kwargs):
    ref, _ = run("reference", grad_scale=grad_scale, **kwargs)
    fused, _ = run("foreach", grad_scale=grad_scale, **kwargs)
    for (_, a), (_, b) in zip(ref, fused, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", [{}, {"adam_w_mode": False, "max_weight_norm": 0.3}])
def test_compiled_matches_reference(kwargs):
    ref, _ = run("reference", grad_scale=3.0, **kwargs)
    comp, _ = run("compiled", grad_scale=3.0, **kwargs)
    for (_, a), (_, b) in zip(ref, comp, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_params_follow_the_fp32_trajectory_through_masters(dtype):
    # same random draws; the low-precision run sees them rounded to bf16/fp16
    ref, _ = run("foreach", dtype=torch.float32, grad_scale=1.0)
    low, opt = run("foreach", dtype=dtype, grad_scale=1.0)
    for _, b in low:
        state = opt.state[b]
        assert state["exp_avg"].dtype == torch.float32 and state["master"].dtype == torch.float32
        assert b.dtype == dtype
        torch.testing.assert_close(b, state["master"].to(dtype), rtol=0, atol=0)
    # the master copies start from rounded weights, so compare relative to that start
    start_ref = dict(make_named(dtype=torch.float32))
    start_low = dict(make_named(dtype=dtype))
    for (name, a), (_, b) in zip(ref, low, strict=True):
        delta_ref = a.detach() - start_ref[name].detach()
        delta_low = opt.state[b]["master"] - start_low[name].detach().float()
        torch.testing.assert_close(delta_low, delta_ref, rtol=2e-2, atol=2e-4)


def test_state_dict_round_trip_keeps_fp32_state_for_bf16_params(tmp_path):
    named, opt = run("foreach", steps=2, dtype=torch.bfloat16)
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    loaded = torch.load(tmp_path / "opt.pt", weights_only=True)
    fresh = Lamb(named, lr=2e-2, no_weight_decay=["bias"], impl="foreach")
    fresh.load_state_dict(loaded)
    for _, p in named:
        assert fresh.state[p]["exp_avg"].dtype == torch.float32
        assert fresh.state[p]["master"].dtype == torch.float32
        torch.testing.assert_close(fresh.state[p]["master"], opt.state[p]["master"])
    assert [g["step"] for g in fresh.param_groups] == [2, 2]


def test_resumed_trajectory_equals_uninterrupted(tmp_path):
    full, _ = run("foreach", steps=4)
    named, opt = run("foreach", steps=2)
    torch.save({"opt": opt.state_dict(), "w": [p.detach() for _, p in named]}, tmp_path / "c.pt")
    ckpt = torch.load(tmp_path / "c.pt", weights_only=True)
    resumed = make_named()
    for (_, p), w in zip(resumed, ckpt["w"], strict=True):
        p.data.copy_(w)
    opt2 = Lamb(resumed, lr=2e-2, no_weight_decay=["bias"], impl="foreach")
    opt2.load_state_dict(ckpt["opt"])
    g = torch.Generator().manual_seed(1)
    for _ in range(2):  # replay the first two steps' gradient draws
        for _, p in resumed:
            torch.randn(p.shape, generator=g)
    for _ in range(2):
        for _, p in resumed:
            p.grad = torch.randn(p.shape, generator=g)
        opt2.step()
    for (_, a), (_, b) in zip(full, resumed, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_auto_picks_compiled_only_for_large_cpu_models():
    small = Lamb([torch.nn.Parameter(torch.zeros(10))])
    assert small.resolve_impl() == "foreach"
    large = Lamb([torch.nn.Parameter(torch.zeros(10))], compile_min_numel=5)
    assert large.resolve_impl() == "compiled"
    assert (
        Lamb([torch.nn.Parameter(torch.zeros(10))], impl="reference").resolve_impl() == "reference"
    )


def test_auto_falls_back_to_foreach_when_the_fast_path_cannot_build(monkeypatch):
    def broken(batch, inv_clip):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setitem(lamb_impls.UPDATES, "compiled", broken)
    ref, _ = run("foreach")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, opt = run("auto", compile_min_numel=1)
    assert any("foreach" in str(w.message) for w in caught)
    assert opt.resolve_impl() == "foreach"
    for (_, a), (_, b) in zip(ref, got, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.skipif(
    not compat.HAS_FOREACH_NORM_DTYPE,
    reason=f"torch {torch.__version__} has no _foreach_norm(dtype=): one norm per tensor",
)
def test_foreach_uses_no_per_parameter_python_loop(monkeypatch):
    """The fused path launches a fixed number of ops, whatever the number of tensors."""
    calls: list[str] = []
    real_norm = torch.linalg.vector_norm

    def counting_norm(*args, **kwargs):
        calls.append("norm")
        return real_norm(*args, **kwargs)

    monkeypatch.setattr(torch.linalg, "vector_norm", counting_norm)
    run("foreach", steps=1)
    assert not calls  # the global and per-tensor norms are _foreach_norm calls, no loop


def test_bf16_params_without_masters_are_rounded_each_step():
    named, opt = run("foreach", steps=3, dtype=torch.bfloat16, master_weights=False)
    ref, _ = run("foreach", steps=3, dtype=torch.float32)
    for (_, low), (_, full) in zip(named, ref, strict=True):
        assert "master" not in opt.state[low] and low.dtype == torch.bfloat16
        assert opt.state[low]["exp_avg"].dtype == torch.float32
        torch.testing.assert_close(low.float(), full, rtol=5e-2, atol=5e-3)
