"""Optimiser steps whose gradients are not finite (``trainer.nonfinite``): a skipped step
leaves weights, optimiser state and LR schedule bitwise as before it, is counted, and too
many in a row (or ``stop``) end the run with a checkpoint of the last good state and one
line; fp16's loss scale travels in checkpoints. Faults come from a test callback
(``faults.NanGradAt``), never from a product flag."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from training_state import load_state

from omnibert.apps.train import run_or_exit
from omnibert.config import TrainConfig
from omnibert.config.sections import ConfigError
from omnibert.optim import Lamb
from omnibert.optim.nonfinite import first_nonfinite_gradient, guard

TESTS = Path(__file__).parents[1]
# experiment=smoke (1-layer 32-wide BERT, generated data, 2 micro-batches a step), a
# checkpoint after every step, all of them kept
SMOKE = (
    "experiment=smoke",
    "data.num_train_samples=28",
    "callbacks.checkpoint.every_n_train_steps=1",
    "callbacks.checkpoint.save_top_k=-1",
    "accelerator.threads=1",
    "data.num_workers=0",
)


def _nan_at(*steps: int, value: str = "nan") -> str:
    return f"+callbacks.nan={{_target_:faults.NanGradAt,steps:{list(steps)},value:{value}}}"


def _same_state(a: dict, b: dict) -> None:
    """Weights, optimiser state (moments and step counts) and schedule bitwise equal."""
    for name, tensor in a["state_dict"].items():
        assert torch.equal(b["state_dict"][name], tensor), name
    opt_a, opt_b = a["optimizer_states"][0], b["optimizer_states"][0]
    assert opt_a["state"].keys() == opt_b["state"].keys()
    for key, state in opt_a["state"].items():
        assert all(torch.equal(state[k], opt_b["state"][key][k]) for k in state), key
    assert [g.get("step") for g in opt_a["param_groups"]] == [
        g.get("step") for g in opt_b["param_groups"]
    ]
    assert [g["lr"] for g in opt_a["param_groups"]] == [g["lr"] for g in opt_b["param_groups"]]
    assert a["lr_schedulers"] == b["lr_schedulers"]


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]


@pytest.mark.parametrize("impl", ["reference", "foreach", "compiled"])
def test_lamb_skips_a_nonfinite_step_as_if_it_had_not_been_called(impl):
    """A NaN (or inf) gradient: nothing changes, not even the step count; the next finite
    step is the one a run without the bad step would take, bitwise."""
    runs = []
    for bad in ([], [float("nan")], [float("inf")]):
        params = _params()
        lamb = Lamb(params, lr=0.1, impl=impl)
        lamb.skip_nonfinite = True
        grads = [torch.randn(5, 3, generator=torch.Generator().manual_seed(1)), torch.ones(7)]
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        lamb.step()
        assert not lamb.last_step_skipped
        before = ([p.detach().clone() for p in params], repr(lamb.state_dict()))
        for value in bad:  # a bad step between two good ones
            params[1].grad = torch.ones(7)
            params[1].grad[3] = value
            lamb.step()
            assert lamb.last_step_skipped
            assert all(torch.equal(p, q) for p, q in zip(params, before[0], strict=True))
            assert repr(lamb.state_dict()) == before[1]
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone() * 0.5
        lamb.step()
        runs.append([p.detach().clone() for p in params])
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run, strict=True))


def test_lamb_skips_its_first_step_without_leaving_state_behind():
    params = _params()
    lamb = Lamb(params, lr=0.1, impl="foreach")
    lamb.skip_nonfinite = True
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    lamb.step()
    assert lamb.last_step_skipped and not lamb.state
    assert all(g["step"] == 0 for g in lamb.param_groups)


def test_lamb_without_the_guard_applies_a_nonfinite_step():
    """The guard is what skips: unguarded (the optimiser on its own), NaN reaches the weights."""
    params = _params()
    lamb = Lamb(params, lr=0.1, impl="foreach")
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    lamb.step()
    assert not lamb.last_step_skipped
    assert torch.isnan(params[0]).all()


def test_any_optimizer_is_guarded_by_its_gradient_norm():
    params = _params()
    adamw = torch.optim.AdamW(params, lr=0.1)
    guard(adamw)
    for p in params:
        p.grad = torch.ones_like(p)
    adamw.step()
    assert not adamw.last_step_skipped
    before = ([p.detach().clone() for p in params], repr(adamw.state_dict()))
    params[0].grad[1, 2] = float("inf")
    adamw.step()
    assert adamw.last_step_skipped
    assert all(torch.equal(p, q) for p, q in zip(params, before[0], strict=True))
    assert repr(adamw.state_dict()) == before[1]


def test_the_first_nonfinite_gradient_is_named():
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    a.grad, b.grad = torch.ones(2), torch.tensor([1.0, float("nan")])
    assert first_nonfinite_gradient([("a", a), ("b", b)]) == "b"
    b.grad = torch.ones(2)
    assert first_nonfinite_gradient([("a", a), ("b", b)]) is None


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("trainer.nonfinite=ignore", "trainer.nonfinite='ignore' is not one of skip, stop"),
        ("trainer.nonfinite_max_consecutive=0", "trainer.nonfinite_max_consecutive=0 must be"),
    ],
)
def test_a_bad_policy_is_one_sentence(compose_config, tmp_path, override, words):
    from omnibert.config import TrainConfig

    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        TrainConfig.of(compose_config("experiment=smoke", override, root=tmp_path))


def test_a_skipped_step_changes_nothing_and_is_counted(compose_config, tmp_path):
    """Step 3's gradients are NaN: the checkpoint of step 3 holds exactly step 2's weights,
    optimiser state and schedule; step 4 trains again; the summary counts the skipped step."""
    summary = run_or_exit(
        compose_config(*SMOKE, "phase.max_steps=4", _nan_at(3), root=tmp_path), tmp_path / "out"
    )
    ckpts = tmp_path / "out" / "checkpoints"
    if not ckpts.is_dir():
        ckpts = Path(summary["checkpoint_dir"])
    step = {n: load_state(ckpts / f"step-{n:08d}.ckpt") for n in (2, 3, 4)}
    assert step[3]["global_step"] == 3
    _same_state(step[2], step[3])
    changed = [
        name
        for name, t in step[4]["state_dict"].items()
        if not torch.equal(t, step[3]["state_dict"][name])
    ]
    assert changed and all(torch.isfinite(t).all() for t in step[4]["state_dict"].values())
    assert summary["steps"] == 4
    assert summary["nonfinite_skipped_steps"] == 1
    assert summary["nonfinite_steps"] == [3]
    assert math.isfinite(summary["validation"]["val/loss"])


def test_too_many_in_a_row_stop_with_the_last_good_state(compose_config, tmp_path, capsys):
    """Steps 3, 4 and 5 are NaN with at most 2 in a row: the run stops at step 5 in one line
    (exit code 65), and last.ckpt (written at step 5) holds step 2's state, from which
    ``ckpt_path=last`` resumes and finishes."""
    run = (*SMOKE, "phase.max_steps=7")
    config = compose_config(
        *run, "trainer.nonfinite_max_consecutive=2", _nan_at(3, 4, 5), root=tmp_path
    )
    with pytest.raises(SystemExit) as stopped:
        run_or_exit(config, tmp_path / "out")
    assert stopped.value.code == 65
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert line.startswith("omnibert-train: error: the gradients were not finite in steps 3 to 5")
    assert "first non-finite gradient model." in line
    assert "holds the weights of step 2, the last good one" in line
    assert line.endswith("then resume with ckpt_path=last")
    assert "Traceback" not in err
    checkpoints = next(tmp_path.glob("**/checkpoints"))
    last = load_state(checkpoints / "last.ckpt")
    assert last["global_step"] == 5
    _same_state(load_state(checkpoints / "step-00000002.ckpt"), last)
    summary = run_or_exit(compose_config(*run, "ckpt_path=last", root=tmp_path), tmp_path / "out")
    assert summary["steps"] == 7
    assert load_state(checkpoints / "last.ckpt")["global_step"] == 7


def test_stop_stops_at_the_first(compose_config, tmp_path, capsys):
    config = compose_config(
        *SMOKE, "phase.max_steps=4", "trainer.nonfinite=stop", _nan_at(2, value="inf"),
        root=tmp_path,
    )  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        run_or_exit(config, tmp_path / "out")
    assert stopped.value.code == 65
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "not finite in step 2 (trainer.nonfinite=stop)" in line
    assert "holds the weights of step 1, the last good one" in line


def _fp16_run(compose_config, root: Path, monkeypatch, *overrides: str) -> dict:
    """omnibert-train's own steps (prepare, build, fit) with fp16 autocast and a dynamic loss
    scale on the CPU: Lightning's ``16-mixed`` needs CUDA, so the test hands the Trainer the
    precision plugin a GPU run gets, with a CPU ``GradScaler`` whose first scale overflows."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    from omnibert.run.pretraining.job import build, fit, prepare

    prepared = prepare(
        TrainConfig.of(compose_config(*SMOKE, "phase.max_steps=6", *overrides, root=root))
    )
    own = prepared.plugin.trainer_kwargs

    def fp16_kwargs(precision: str) -> dict:
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20, growth_interval=2)
        return {
            **own(precision),
            "precision": None,
            "plugins": [MixedPrecision("16-mixed", "cpu", scaler)],
        }

    monkeypatch.setattr(prepared.plugin, "trainer_kwargs", fp16_kwargs)
    return fit(build(prepared, root / "out"))


def test_fp16_loss_scale_resumes_bitwise_and_its_skipped_steps_count(
    compose_config, tmp_path, monkeypatch
):
    """Under fp16 the loss scaler skips the steps that overflow (the first ones here: the
    initial scale is far too large): they count as skipped, the schedule does not move for
    them, and the scale (with its growth tracker) is in every checkpoint: a run stopped after
    step 3 and resumed from its checkpoint ends bitwise where an uninterrupted one does, scale included."""
    whole = _fp16_run(compose_config, tmp_path / "whole", monkeypatch)
    assert 1 <= whole["nonfinite_skipped_steps"] < 6
    run = Path(whole["checkpoint_dir"])
    first = load_state(run / "step-00000001.ckpt")
    assert first["MixedPrecision"]["scale"] == 2.0**19  # one overflow: halved, step skipped
    assert first["lr_schedulers"][0]["last_epoch"] == 0  # the schedule did not move
    end = "+callbacks.end={_target_:faults.EndFitAtStep,step:3}"
    part = _fp16_run(compose_config, tmp_path / "part", monkeypatch, end)
    assert part["steps"] == 3
    at_3 = Path(part["checkpoint_dir"]) / "step-00000003.ckpt"
    resumed = _fp16_run(compose_config, tmp_path / "part", monkeypatch, f"ckpt_path={at_3}")
    assert resumed["steps"] == 6
    want = load_state(run / "last.ckpt")
    got = load_state(Path(resumed["checkpoint_dir"]) / "last.ckpt")
    _same_state(want, got)
    assert want["MixedPrecision"] == got["MixedPrecision"]
