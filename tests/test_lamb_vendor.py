"""HPU/IPU LAMB mapping, tested against FAKE vendor modules (tests/fakes/sdk), not hardware."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

from omnibert.optim import Lamb
from omnibert.optim.vendor import hpu_lamb, ipu_lamb, ipu_lamb_differences

FAKE_SDK = Path(__file__).parent / "fakes" / "sdk"
APEX_LIKE = {
    "lr": 6e-3,
    "betas": [0.9, 0.999],
    "eps": 1e-6,
    "weight_decay": 0.01,
    "max_grad_norm": 1.0,
    "use_nvlamb": False,
    "no_weight_decay": ["bias", "LayerNorm"],
}


@pytest.fixture
def fake_sdk(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKE_SDK))
    for name in list(sys.modules):
        if name.startswith(("poptorch", "habana_frameworks")):
            monkeypatch.delitem(sys.modules, name)
    yield
    for name in list(sys.modules):
        if name.startswith(("poptorch", "habana_frameworks")):
            del sys.modules[name]


def _model():
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))


def test_fake_hpu_gets_fused_lamb_with_mapped_flags(fake_sdk):
    opt = hpu_lamb(_model().named_parameters(), **{**APEX_LIKE, "use_nvlamb": True})
    assert type(opt).__name__ == "FusedLamb" and opt.fake
    assert opt.use_lamb is True
    assert opt.defaults["max_grad_norm"] == 1.0 and opt.defaults["betas"] == (0.9, 0.999)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]  # groups by name
    assert all("param_names" not in g for g in opt.param_groups)


def test_fake_hpu_disabled_clipping_maps_to_none(fake_sdk):
    opt = hpu_lamb(_model().parameters(), lr=1e-3, max_grad_norm=0.0)
    assert opt.defaults["max_grad_norm"] is None


@pytest.mark.parametrize(
    "flag", [{"adam_w_mode": False}, {"max_weight_norm": 10.0}, {"impl": "reference"}]
)
def test_fake_hpu_falls_back_with_a_warning_when_semantics_differ(fake_sdk, flag):
    with pytest.warns(UserWarning, match="instead of Habana FusedLamb"):
        opt = hpu_lamb(_model().named_parameters(), **{**APEX_LIKE, **flag})
    assert isinstance(opt, Lamb) and opt.impl == "foreach"


def test_hpu_without_sdk_falls_back(monkeypatch):
    monkeypatch.setitem(sys.modules, "habana_frameworks", None)  # import fails
    with pytest.warns(UserWarning, match="not importable"):
        opt = hpu_lamb(_model().named_parameters(), **APEX_LIKE)
    assert isinstance(opt, Lamb)


def test_fake_ipu_maps_to_poptorch_lamb_and_names_each_difference(fake_sdk):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = ipu_lamb(_model().named_parameters(), **APEX_LIKE)
    assert type(opt).__name__ == "LAMB" and opt.fake
    assert opt.defaults["eps"] == 1e-6 and opt.bias_correction is True
    assert opt.accum_types == (torch.float32,) * 3
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    messages = " | ".join(str(w.message) for w in caught)
    assert "no global gradient-norm clipping" in messages
    assert "trust ratio applies to every tensor" in messages
    assert "65500" in messages


def test_ipu_differences_shrink_when_flags_match_poptorch():
    diffs = ipu_lamb_differences(max_grad_norm=None, use_nvlamb=True, max_weight_norm=65500.0)
    assert diffs == ["the step count is per parameter, not per group (equal unless grads skip)"]
