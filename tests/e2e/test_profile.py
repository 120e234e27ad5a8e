"""profile=true: a torch.profiler Chrome/TensorBoard trace of the scheduled training steps in
<output dir>/profile/; settings and conflicts checked before compute; HPU activity with a FAKE
habana_frameworks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity

from omnibert.apps.train import run_or_exit
from omnibert.config import TrainConfigError
from omnibert.run.launching.profiling import (
    ProfileSettings,
    build_profiler,
    profile_settings,
    profiler_activities,
)

FAKE_SDK = Path(__file__).parents[1] / "fakes" / "sdk"


SMOKE = ("experiment=smoke", "data.num_workers=0")


def test_profile_writes_a_chrome_trace_of_the_scheduled_steps(tmp_path, capsys, compose_config):
    out = tmp_path / "out"
    # 3 optimiser steps of 2 micro-batches: training steps 0-5; record 2 and 3. Validation
    # after every step used to restart Lightning's profiler schedule, so the operator table
    # held a later, partial cycle (and only the 20 slowest rows, which depended on load).
    summary = run_or_exit(
        compose_config(
            *SMOKE, "profile={wait:1,warmup:1,active:2}", "phase.max_steps=3",
            "val_every_n_steps=1", root=tmp_path,
        ),
        out,
    )  # fmt: skip
    assert summary["steps"] == 3  # training ran as configured
    assert "profiling training micro-batches 2-3" in capsys.readouterr().out
    traces = sorted((out / "profile").glob("*.pt.trace.json"))
    assert len(traces) == 1 and "training_step" in traces[0].name, traces
    trace = json.loads(traces[0].read_text())  # Chrome trace format, what TensorBoard reads
    events = trace["traceEvents"]
    steps = sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    # torch 2.0 labels each step with the number of the step before it (fixed in 2.1);
    # the schedule records the same steps
    label = 1 if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 1) else 0
    assert steps == [f"ProfilerStep#{2 - label}", f"ProfilerStep#{3 - label}"]
    names = {e.get("name", "") for e in events}
    assert "aten::addmm" in names  # the model's matmuls
    assert any(n.startswith("aten::_foreach") for n in names)  # LAMB's multi-tensor step
    assert any("BertForPreTraining" in n for n in names)  # Lightning's module labels
    assert trace["record_shapes"] == 1 and trace["profile_memory"] == 1
    table = (out / "profile" / "fit-profile.txt").read_text()  # the recorded steps' operators
    assert "ProfilerStep*" in table and "aten::addmm" in table and "aten::_foreach" in table


def test_profile_off_writes_no_trace(tmp_path, compose_config):
    out = tmp_path / "out"
    run_or_exit(compose_config(*SMOKE, "phase.max_steps=1", root=tmp_path), out)
    assert not (out / "profile").exists()


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ({"active": 0}, "profile.active"),
        ({"wait": -1}, "profile.wait"),
        ({"warmup": 1.5}, "profile.warmup"),
        ({"with_stack": 1}, "profile.with_stack"),
        ({"activ": 3}, "profile.activ"),
        ("yes", "profile='yes'"),
    ],
)
def test_bad_profile_settings_name_the_key(value, key):
    with pytest.raises(TrainConfigError, match=key.replace(".", r"\.")):
        profile_settings(value)


def test_profile_settings_true_and_mapping():
    assert profile_settings(False) is None and profile_settings(None) is None
    assert profile_settings(True) == ProfileSettings()
    custom = profile_settings({"wait": 2, "active": 5, "profile_memory": False})
    assert custom == ProfileSettings(wait=2, active=5, profile_memory=False)
    assert custom.recorded_steps() == [3, 4, 5, 6, 7]


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (("profile=true", "debug=profile"), "trainer.profiler"),
        (("profile=true", "compile_only=true"), "compile_only=true"),
        (("profile={active:0}",), "profile.active"),
    ],
)
def test_profile_conflicts_stop_before_compute(tmp_path, capsys, overrides, words, compose_config):
    with pytest.raises(SystemExit) as info:
        run_or_exit(compose_config(*SMOKE, *overrides, root=tmp_path), tmp_path / "out")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "smoke" / "checkpoints").exists()
    assert not (tmp_path / "out" / "profile").exists()


def test_cpu_profiles_cpu_activity_only(tmp_path):
    assert profiler_activities("cpu") == [ProfilerActivity.CPU]
    profiler = build_profiler(ProfileSettings(), tmp_path / "p", "cpu")
    assert profiler._profiler_kwargs["activities"] == [ProfilerActivity.CPU]
    assert profiler.dirpath == str(tmp_path / "p")


@pytest.mark.skipif(
    not hasattr(ProfilerActivity, "HPU"), reason=f"torch {torch.__version__} has no HPU activity"
)
def test_hpu_profiles_the_hpu_activity_with_fake_habana_frameworks(tmp_path, fake_sdk):
    """Intel's documented HPU tracing: ProfilerActivity.HPU next to CPU, after importing
    habana_frameworks.torch (here the FAKE one; no Gaudi involved)."""
    profiler = build_profiler(ProfileSettings(active=2), tmp_path / "p", "hpu")
    assert profiler._profiler_kwargs["activities"] == [ProfilerActivity.CPU, ProfilerActivity.HPU]
    imported = sys.modules["habana_frameworks.torch"]
    assert Path(imported.__file__).is_relative_to(FAKE_SDK)  # the SDK import was made


def test_hpu_profiling_on_a_torch_without_the_hpu_activity_names_it(monkeypatch, fake_sdk):
    """torch 2.0.1 (the IPU environment's) has no ProfilerActivity.HPU: one sentence."""

    class OldProfilerActivity:  # what older torches have
        CPU = ProfilerActivity.CPU
        CUDA = ProfilerActivity.CUDA

    monkeypatch.setattr(torch.profiler, "ProfilerActivity", OldProfilerActivity)
    with pytest.raises(TrainConfigError, match=r"ProfilerActivity\.HPU, which torch .* does not"):
        profiler_activities("hpu")


def test_hpu_profiling_without_the_sdk_fails_on_the_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "habana_frameworks", None)  # not importable
    with pytest.raises(ImportError):
        profiler_activities("hpu")
