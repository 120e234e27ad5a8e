"""Lamb trajectories against an independent float64 (numpy) statement of apex FusedLAMB's rules.

The oracle below is written from apex's published algorithm (fused_lamb.py + the stage-1/2
CUDA functors): global grad norm over all groups, divide grads by max(norm/max_norm, 1),
per-group step, bias correction, L2 or decoupled decay, trust ratio ||p||/||u|| where the
group's decay != 0 (or nvlamb), 1 when either norm is 0, p -= lr * ratio * u.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from omnibert.optim import Lamb

FAST_IMPLS = ["reference", "foreach"]


@dataclass
class OracleGroup:
    params: list[np.ndarray]
    lr: float = 1e-2
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    bias_correction: bool = True
    grad_averaging: bool = True
    step: int = 0
    m: list[np.ndarray] = field(default_factory=list)
    v: list[np.ndarray] = field(default_factory=list)


def oracle_step(
    groups: list[OracleGroup],
    grads: list[list[np.ndarray | None]],
    max_grad_norm: float | None = 1.0,
    adam_w_mode: bool = True,
    use_nvlamb: bool = False,
    max_weight_norm: float | None = None,
    adapt_override: list[list[bool]] | None = None,
) -> None:
    present = [g for gs in grads for g in gs if g is not None]
    norm = float(np.sqrt(sum(float(np.sum(g * g)) for g in present)))
    clip = norm / max_grad_norm if max_grad_norm and norm > max_grad_norm else 1.0
    for gi, (group, gs) in enumerate(zip(groups, grads, strict=True)):
        group.step += 1
        if not group.m:
            group.m = [np.zeros_like(p) for p in group.params]
            group.v = [np.zeros_like(p) for p in group.params]
        b1, b2 = group.betas
        bc1 = 1 - b1**group.step if group.bias_correction else 1.0
        bc2 = 1 - b2**group.step if group.bias_correction else 1.0
        b3 = 1 - b1 if group.grad_averaging else 1.0
        wd = group.weight_decay
        for i, g in enumerate(gs):
            if g is None:
                continue
            p = group.params[i]
            sg = g / clip
            if not adam_w_mode:
                sg = sg + wd * p
            group.m[i] = b1 * group.m[i] + b3 * sg
            group.v[i] = b2 * group.v[i] + (1 - b2) * sg * sg
            u = (group.m[i] / bc1) / (np.sqrt(group.v[i] / bc2) + group.eps)
            if adam_w_mode:
                u = u + wd * p
            pn = float(np.sqrt(np.sum(p * p)))
            if max_weight_norm is not None:
                pn = min(pn, max_weight_norm)
            un = float(np.sqrt(np.sum(u * u)))
            adapt = use_nvlamb or wd != 0
            if adapt_override is not None:
                adapt = adapt_override[gi][i]
            ratio = pn / un if adapt and pn != 0 and un != 0 else 1.0
            group.params[i] = p - group.lr * ratio * u


def make_problem(seed: int = 0):
    """Two groups (decayed matrices; undecayed bias/LayerNorm), incl. a zero-init bias."""
    rng = np.random.default_rng(seed)
    decayed = [rng.normal(size=(6, 5)), rng.normal(size=(4, 6)), rng.normal(size=(3,))]
    plain = [np.zeros(5), rng.normal(size=(7,)), np.ones(4)]
    return decayed, plain


def run_both(
    steps: int,
    grad_scale: float,
    impl: str,
    lamb_kwargs: dict,
    oracle_kwargs: dict | None = None,
    group_kwargs: dict | None = None,
    no_grad: tuple[int, int] | None = None,
    zero_grad: tuple[int, int] | None = None,
    decay: float = 0.01,
):
    decayed, plain = make_problem()
    gk = group_kwargs or {}
    oracle = [
        OracleGroup([p.copy() for p in decayed], weight_decay=decay, **gk),
        OracleGroup([p.copy() for p in plain], weight_decay=0.0, **gk),
    ]
    tparams = [[torch.tensor(p, dtype=torch.float32) for p in ps] for ps in (decayed, plain)]
    torch_groups = [
        {"params": tparams[0], "weight_decay": decay},
        {"params": tparams[1], "weight_decay": 0.0},
    ]
    opt = Lamb(torch_groups, impl=impl, **{**gk, **lamb_kwargs})
    rng = np.random.default_rng(1)
    for _ in range(steps):
        grads = [
            [rng.normal(size=p.shape) * grad_scale for p in oracle[0].params],
            [rng.normal(size=p.shape) * grad_scale for p in oracle[1].params],
        ]
        if no_grad is not None:
            grads[no_grad[0]][no_grad[1]] = None
        if zero_grad is not None:
            grads[zero_grad[0]][zero_grad[1]] = np.zeros_like(grads[zero_grad[0]][zero_grad[1]])
        # the optimiser sees the float32-rounded gradients; so does the oracle
        grads = [
            [None if g is None else g.astype(np.float32).astype(np.float64) for g in gs]
            for gs in grads
        ]
        for tp_list, g_list in zip(tparams, grads, strict=True):
            for tp, g in zip(tp_list, g_list, strict=True):
                tp.grad = None if g is None else torch.tensor(g, dtype=torch.float32)
        opt.step()
        oracle_step(oracle, grads, **(oracle_kwargs or {}))
    return opt, tparams, oracle


def assert_close(tparams, oracle, rtol=2e-5, atol=2e-6):
    for tp_list, og in zip(tparams, oracle, strict=True):
        for tp, op in zip(tp_list, og.params, strict=True):
            np.testing.assert_allclose(tp.numpy().astype(np.float64), op, rtol=rtol, atol=atol)


@pytest.mark.parametrize("impl", FAST_IMPLS)
@pytest.mark.parametrize("grad_scale", [0.01, 10.0], ids=["clip-inactive", "clip-active"])
def test_trajectory_matches_apex_oracle(impl, grad_scale):
    opt, tparams, oracle = run_both(6, grad_scale, impl, {"lr": 1e-2, "max_grad_norm": 1.0})
    assert_close(tparams, oracle)
    norm = float(opt.last_grad_norm)
    assert (norm > 1.0) == (grad_scale > 1.0)  # the two cases really differ in clipping


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_zero_norm_tensors_get_ratio_one(impl):
    # group 0 tensor 2 gets zero grads; group 1 starts with a zero bias (||p|| = 0)
    _, tparams, oracle = run_both(4, 1.0, impl, {"lr": 1e-2}, zero_grad=(0, 2))
    assert_close(tparams, oracle)
    assert torch.isfinite(torch.cat([p.flatten() for ps in tparams for p in ps])).all()


def test_zero_param_and_zero_update_stays_finite():
    p = torch.zeros(5, requires_grad=True)
    opt = Lamb([p], lr=0.1, weight_decay=0.01)
    p.grad = torch.zeros(5)
    opt.step()
    assert torch.equal(p.detach(), torch.zeros(5))


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_parameters_without_gradients_are_untouched(impl):
    before = make_problem()[0][1].copy()
    opt, tparams, oracle = run_both(3, 1.0, impl, {"lr": 1e-2}, no_grad=(0, 1))
    assert_close(tparams, oracle)
    np.testing.assert_array_equal(tparams[0][1].numpy(), before.astype(np.float32))
    assert tparams[0][1] not in opt.state
    assert [g["step"] for g in opt.param_groups] == [3, 3]


@pytest.mark.parametrize("impl", FAST_IMPLS)
@pytest.mark.parametrize(
    ("lamb_kwargs", "oracle_kwargs", "group_kwargs"),
    [
        ({"adam_w_mode": False}, {"adam_w_mode": False}, {}),
        ({"use_nvlamb": True}, {"use_nvlamb": True}, {}),
        ({"max_grad_norm": None}, {"max_grad_norm": None}, {}),
        ({"max_weight_norm": 0.5}, {"max_weight_norm": 0.5}, {}),
        ({}, {}, {"bias_correction": False}),
        ({}, {}, {"grad_averaging": False}),
        ({}, {}, {"betas": (0.8, 0.99), "eps": 1e-4}),
    ],
    ids=["l2", "nvlamb", "no-clip", "max-weight-norm", "no-bias-corr", "no-grad-avg", "betas"],
)
def test_flags_match_oracle(impl, lamb_kwargs, oracle_kwargs, group_kwargs):
    _, tparams, oracle = run_both(
        4, 3.0, impl, {"lr": 1e-2, **lamb_kwargs}, oracle_kwargs, group_kwargs
    )
    assert_close(tparams, oracle)


def test_group_without_decay_gets_no_trust_ratio_but_decayed_group_does():
    # identical tensors in both groups: only the decayed one is rescaled by ||p||/||u||
    a = torch.full((4,), 3.0, requires_grad=True)
    b = torch.full((4,), 3.0, requires_grad=True)
    opt = Lamb(
        [{"params": [a], "weight_decay": 0.0}, {"params": [b], "weight_decay": 1e-9}], lr=0.1
    )
    a.grad = torch.ones(4)
    b.grad = torch.ones(4)
    opt.step()
    # first step: u = m_hat/(sqrt(v_hat)+eps) ~ 1 per element, so ||u|| ~ 2, ||p|| = 6
    assert a.detach()[0].item() == pytest.approx(3.0 - 0.1 * 1.0, rel=1e-5)
    assert b.detach()[0].item() == pytest.approx(3.0 - 0.1 * 3.0 * 1.0, rel=1e-5)


def test_named_parameters_exclusion_and_layer_adaptation():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    opt = Lamb(model, no_weight_decay=["bias", r"^1\."], exclude_from_layer_adaptation=[r"^1\."])
    names = [g["param_names"] for g in opt.param_groups]
    assert names == [["0.weight"], ["0.bias", "1.weight", "1.bias"]]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    # MLPerf rule: the trust ratio follows the name list, not the decay
    assert opt._adapt_flags(names[1], [0.0, 0.0, 0.0]) == [True, False, False]


def test_bad_arguments_say_what_to_do():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="named_parameters"):
        Lamb(model.parameters(), no_weight_decay=["bias"])
    with pytest.raises(ValueError, match="AMSGrad"):
        Lamb(model.parameters(), amsgrad=True)
    with pytest.raises(ValueError, match="impl"):
        Lamb(model.parameters(), impl="cuda-magic")
    with pytest.raises(ValueError, match="exclude_from_layer_adaptation"):
        Lamb(model.parameters(), exclude_from_layer_adaptation=["bias"])


def test_closure_and_zero_grad_follow_apex():
    p = torch.ones(3, requires_grad=True)
    opt = Lamb([p], lr=0.1)

    def closure():
        loss = (p * p).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == pytest.approx(3.0)
    opt.zero_grad()
    assert p.grad is None
    keep = Lamb([p], set_grad_none=False)
    p.grad = torch.ones(3)
    keep.zero_grad()
    assert p.grad is not None and torch.equal(p.grad, torch.zeros(3))


@pytest.mark.parametrize("name", ["lamb", "lamb_mlperf", "adamw"])
def test_optimizer_configs_instantiate_with_named_parameters(name):
    from hydra.utils import instantiate

    from omnibert.apps.compose import compose

    cfg = compose("pretrain", ["experiment=smoke", f"optimizer={name}", "+phase.lr.adamw=1e-4"])
    model = torch.nn.Module()
    model.dense = torch.nn.Linear(3, 4)  # BERT's names: dense.*, LayerNorm.*
    model.LayerNorm = torch.nn.LayerNorm(4)
    opt = instantiate(cfg.optimizer)(model.named_parameters())
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    assert opt.param_groups[0]["param_names"] == ["dense.weight"]
    assert opt.param_groups[1]["param_names"] == [
        "dense.bias",
        "LayerNorm.weight",
        "LayerNorm.bias",
    ]
    model.LayerNorm(model.dense(torch.randn(2, 3))).pow(2).sum().backward()
    opt.step()
    if name == "lamb_mlperf":
        assert opt.max_grad_norm is None and opt.exclude_from_layer_adaptation
