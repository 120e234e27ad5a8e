"""HPU/IPU LAMB mapping, tested against FAKE vendor modules (tests/fakes/sdk), not hardware."""

from __future__ import annotations

import sys

import pytest
import torch

from omnibert.optim.vendor import VendorOptimizerError, habana_lamb, poptorch_lamb

APEX_LIKE = {
    "lr": 6e-3,
    "betas": [0.9, 0.999],
    "eps": 1e-6,
    "weight_decay": 0.01,
    "max_grad_norm": 1.0,
    "use_nvlamb": False,
    "no_weight_decay": ["bias", "LayerNorm"],
}


def _model():
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))


def test_fake_hpu_gets_fused_lamb_with_mapped_flags(fake_sdk):
    opt = habana_lamb(_model().named_parameters(), **{**APEX_LIKE, "use_nvlamb": True})
    assert type(opt).__name__ == "FusedLamb" and opt.fake
    assert opt.use_lamb is True
    assert opt.defaults["max_grad_norm"] == 1.0 and opt.defaults["betas"] == (0.9, 0.999)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]  # groups by name
    assert all("param_names" not in g for g in opt.param_groups)


def test_fake_hpu_disabled_clipping_maps_to_none(fake_sdk):
    opt = habana_lamb(_model().parameters(), lr=1e-3, max_grad_norm=0.0)
    assert opt.defaults["max_grad_norm"] is None


@pytest.mark.parametrize(
    ("flag", "key"),
    [
        ({"adam_w_mode": False}, "optimizer.adam_w_mode=false"),
        ({"max_weight_norm": 10.0}, "optimizer.max_weight_norm"),
        ({"exclude_from_layer_adaptation": ["bias"]}, "optimizer.exclude_from_layer_adaptation"),
    ],
)
def test_fake_hpu_refuses_settings_fused_lamb_cannot_compute(fake_sdk, flag, key):
    """optimizer=lamb_habana gives the configured maths or one sentence, never another
    optimiser (it used to fall back to omnibert's Lamb with a warning)."""
    with pytest.raises(VendorOptimizerError) as info:
        habana_lamb(_model().named_parameters(), **{**APEX_LIKE, **flag})
    assert key in str(info.value) and "optimizer=lamb" in str(info.value)


def test_hpu_lamb_without_the_sdk_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "habana_frameworks", None)  # import fails
    with pytest.raises(VendorOptimizerError, match="habana_frameworks is not importable"):
        habana_lamb(_model().named_parameters(), **APEX_LIKE)


def test_fake_ipu_builds_poptorch_lamb_with_its_own_rules(fake_sdk):
    opt = poptorch_lamb(_model().named_parameters(), lr=6e-3, no_weight_decay=["bias", "LayerNorm"])
    assert type(opt).__name__ == "LAMB" and opt.fake
    assert opt.defaults["eps"] == 1e-6 and opt.bias_correction is True
    assert opt.defaults["max_weight_norm"] == 65500.0 and opt.loss_scaling == 1.0
    scaled = poptorch_lamb(_model().named_parameters(), lr=6e-3, loss_scaling=4096.0)
    assert scaled.loss_scaling == 4096.0  # type: ignore[attr-defined]
    assert opt.accum_types == (torch.float32,) * 3
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    with pytest.raises(TypeError, match="max_grad_norm"):  # a key poptorch's LAMB has not
        poptorch_lamb(_model().named_parameters(), lr=6e-3, max_grad_norm=1.0)  # type: ignore[call-arg]


def test_ipu_lamb_without_poptorch_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "poptorch", None)
    with pytest.raises(VendorOptimizerError, match="poptorch is not importable"):
        poptorch_lamb(_model().named_parameters(), lr=1e-3)
