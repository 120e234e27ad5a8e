"""Learning-rate schedules against closed-form values at chosen steps, incl. the seed recipes."""

from __future__ import annotations

import math

import pytest
import torch
from hydra.utils import instantiate

from omnibert.optim.schedules import (
    NaturalExpWarmupLR,
    PolyWarmupLR,
    StepTableLR,
    WarmupStableDecayLR,
)


def _opt(lr: float, groups: int = 1) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        [
            {"params": [torch.zeros(1, requires_grad=True)], "lr": lr * (i + 1)}
            for i in range(groups)
        ]
    )


def _lrs_by_stepping(sched, optimizer, steps: int) -> list[float]:
    """The LR each update would use, by actually stepping the scheduler (as training does)."""
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        sched.step()
    return out


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 0.0),
        (1000, 6e-3 * 1000 / (0.2843 * 7038)),
        (2000, 6e-3 * 2000 / 2000.9034),
        (2001, 6e-3 * (1 - 2001 / 7038) ** 0.5),
        (5000, 6e-3 * (1 - 5000 / 7038) ** 0.5),
        (7037, 6e-3 * (1 / 7038) ** 0.5),
        (7038, 0.0),
        (9000, 0.0),
    ],
)
def test_seed_phase1_recipe(step, expected):
    opt = _opt(6e-3)
    sched = PolyWarmupLR(opt, total_steps=7038, warmup_proportion=0.2843, power=0.5)
    assert sched.lr_at(step, 6e-3) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 0.0),
        (100, 4e-3 * 100 / (0.128 * 1563)),
        (200, 4e-3 * 200 / 200.064),
        (201, 4e-3 * (1 - 201 / 1563) ** 0.5),
        (1000, 4e-3 * (1 - 1000 / 1563) ** 0.5),
        (1563, 0.0),
    ],
)
def test_seed_phase2_recipe(step, expected):
    sched = PolyWarmupLR(_opt(4e-3), total_steps=1563, warmup_proportion=0.128, power=0.5)
    assert sched.lr_at(step, 4e-3) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_mlperf_start_warmup_step_and_end_lr():
    # MLPerf: warmup while step - start < W, lr = base*(step-start)/W; decay uses global step
    sched = PolyWarmupLR(
        _opt(1e-3),
        total_steps=1000,
        warmup_steps=100,
        power=1.0,
        end_lr=1e-5,
        start_warmup_step=-50,
    )
    assert sched.lr_at(0, 1e-3) == pytest.approx(1e-3 * 50 / 100)
    assert sched.lr_at(49, 1e-3) == pytest.approx(1e-3 * 99 / 100)
    assert sched.lr_at(50, 1e-3) == pytest.approx((1e-3 - 1e-5) * (1 - 50 / 1000) + 1e-5)
    assert sched.lr_at(1000, 1e-3) == pytest.approx(1e-5)


def test_decay_from_warmup_end_is_the_hugging_face_form():
    sched = PolyWarmupLR(_opt(1.0), total_steps=110, warmup_steps=10, decay_from_warmup_end=True)
    assert sched.lr_at(10, 1.0) == pytest.approx(1.0)
    assert sched.lr_at(60, 1.0) == pytest.approx(0.5)
    assert sched.lr_at(110, 1.0) == pytest.approx(0.0)


def test_stepping_matches_closed_form_for_every_group():
    opt = _opt(6e-3, groups=2)
    sched = PolyWarmupLR(opt, total_steps=50, warmup_proportion=0.2, power=0.5)
    seen = _lrs_by_stepping(sched, opt, 50)
    assert seen == pytest.approx([sched.lr_at(t, 6e-3) for t in range(50)], rel=1e-12)
    assert opt.param_groups[1]["lr"] == pytest.approx(sched.lr_at(50, 12e-3), abs=1e-15)


def test_natural_exp_decay():
    sched = NaturalExpWarmupLR(
        _opt(2e-3), total_steps=1000, warmup_steps=10, decay_rate=0.5, decay_steps=100
    )
    assert sched.lr_at(5, 2e-3) == pytest.approx(1e-3)
    assert sched.lr_at(300, 2e-3) == pytest.approx(2e-3 * math.exp(-0.5 * 3))
    stair = NaturalExpWarmupLR(
        _opt(2e-3), total_steps=1000, decay_rate=0.5, decay_steps=100, staircase=True
    )
    assert stair.lr_at(399, 2e-3) == pytest.approx(2e-3 * math.exp(-0.5 * 3))


def test_step_table():
    opt = _opt(1.0, groups=2)
    sched = StepTableLR(opt, {"0": 1e-4, 10: 5e-4, 20: 1e-5})
    assert [sched.table_lr(t) for t in (0, 9, 10, 19, 20, 99)] == [
        1e-4,
        1e-4,
        5e-4,
        5e-4,
        1e-5,
        1e-5,
    ]
    lin = StepTableLR(_opt(1.0), {0: 0.0, 10: 1.0}, interpolate=True)
    assert lin.table_lr(5) == pytest.approx(0.5)
    _lrs_by_stepping(sched, opt, 10)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([5e-4, 1e-3])


def test_bad_schedule_values_are_named():
    with pytest.raises(ValueError, match="total_steps"):
        PolyWarmupLR(_opt(1.0), total_steps=0)
    with pytest.raises(ValueError, match="warmup_proportion"):
        PolyWarmupLR(_opt(1.0), total_steps=10, warmup_proportion=2.0)
    with pytest.raises(ValueError, match="table"):
        StepTableLR(_opt(1.0), {})


def test_scheduler_state_round_trips_weights_only(tmp_path):
    opt = _opt(1.0)
    sched = StepTableLR(opt, {0: 0.1, 3: 0.2})
    _lrs_by_stepping(sched, opt, 4)
    torch.save(sched.state_dict(), tmp_path / "s.pt")
    fresh = StepTableLR(_opt(1.0), {0: 0.1, 3: 0.2})
    fresh.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert fresh.last_epoch == 4


@pytest.mark.parametrize(
    ("name", "phase", "step", "expected"),
    [
        ("poly_warmup", "phase1", 5000, 6e-3 * (1 - 5000 / 7038) ** 0.5),
        ("poly_warmup", "phase2", 1000, 4e-3 * (1 - 1000 / 1563) ** 0.5),
        ("poly_warmup", "phase2", 100, 4e-3 * 100 / (0.128 * 1563)),
        ("linear_warmup", "phase1", 3519, 6e-3 * 0.5),
        ("natural_exp_warmup", "phase1", 3000, 6e-3 * math.exp(-3000 / 7038)),
        ("step_table", "phase1", 1500, 6e-3),
        ("wsd", "phase1", 1000, 6e-3 * 1000 / (0.2843 * 7038)),
        ("wsd", "phase1", 5000, 6e-3),
        ("wsd", "phase1", 7000, 6e-3 * (1 - math.sqrt((7000 - 0.9 * 7038) / (0.1 * 7038)))),
    ],
)
def test_schedule_configs_run_the_phase(name, phase, step, expected, tmp_path):
    """Each schedule config as the app builds it: the phase's warmup and LR, the phase's
    step count passed as total_steps (conf/schedule/*.yaml, conf/phase/*.yaml)."""
    from omnibert.apps.compose import compose

    cfg = compose("pretrain", [f"schedule={name}", f"phase={phase}", "data.train_path=x",
                               "data.eval_path=null", f"paths.output_root={tmp_path}"])  # fmt: skip
    model = torch.nn.Linear(2, 2)
    optimizer = instantiate(cfg.optimizer)(model.named_parameters())
    sched = instantiate(cfg.schedule)(optimizer, total_steps=cfg.phase.max_steps)
    sched.last_epoch = step
    assert sched.get_lr()[0] == pytest.approx(expected, rel=1e-9)


def test_a_step_table_entry_past_the_run_is_refused():
    with pytest.raises(ValueError, match=r"entry at step 5000 but the run has 100 steps"):
        StepTableLR(_opt(1.0), [[0, 0.1], [5000, 0.2]], total_steps=100)
    assert StepTableLR(_opt(1.0), [[0, 0.1], [99, 0.2]], total_steps=100).table_lr(99) == 0.2


# ---------------------------------------------------------------- warmup-stable-decay (wsd)
def _wsd(shape: str = "1-sqrt", **kw) -> WarmupStableDecayLR:
    """1000 steps: warmup 100, peak 2e-3 held, the last 20 % (steps 800..1000) decaying."""
    args = {"total_steps": 1000, "warmup_steps": 100, "decay_proportion": 0.2} | kw
    return WarmupStableDecayLR(_opt(2e-3), decay_shape=shape, **args)


@pytest.mark.parametrize(
    ("shape", "step", "expected"),
    [
        ("1-sqrt", 0, 0.0),
        ("1-sqrt", 50, 1e-3),  # half way up the warmup
        ("1-sqrt", 100, 2e-3),  # warmup's end: the peak
        ("1-sqrt", 450, 2e-3),  # stable
        ("1-sqrt", 800, 2e-3),  # the decay's first step: p = 0
        ("1-sqrt", 900, 2e-3 * (1 - math.sqrt(0.5))),
        ("1-sqrt", 825, 2e-3 * (1 - math.sqrt(0.125))),
        ("1-sqrt", 1000, 0.0),  # the end
        ("1-sqrt", 1200, 0.0),  # past it: end_lr
        ("linear", 900, 1e-3),
        ("linear", 950, 0.5e-3),
        ("cosine", 825, 2e-3 * (1 + math.cos(math.pi / 8)) / 2),
        ("cosine", 900, 1e-3),
        ("cosine", 1000, 0.0),
    ],
)
def test_wsd_exact_values(shape, step, expected):
    sched = _wsd(shape)
    assert sched.lr_at(step, 2e-3) == pytest.approx(expected, rel=1e-12, abs=1e-18)


def test_wsd_decay_steps_end_lr_and_no_decay():
    # decay_steps overrides the proportion; end_lr is where the decay ends
    sched = _wsd("linear", decay_steps=100, end_lr=2e-4)
    assert sched.decay_start == 900
    assert sched.lr_at(899, 2e-3) == pytest.approx(2e-3)
    assert sched.lr_at(950, 2e-3) == pytest.approx(2e-4 + 1.8e-3 * 0.5)
    assert sched.lr_at(1000, 2e-3) == pytest.approx(2e-4)
    held = _wsd(decay_steps=0)  # a run to be continued: the peak to the end
    assert held.lr_at(999, 2e-3) == held.lr_at(5000, 2e-3) == 2e-3
    # warmup_proportion as the other schedules: 10 % of 1000
    prop = WarmupStableDecayLR(_opt(1.0), total_steps=1000, warmup_proportion=0.1)
    assert (prop.lr_at(50, 1.0), prop.lr_at(100, 1.0), prop.decay_start) == (0.5, 1.0, 900)


def test_wsd_stepping_matches_closed_form_and_resumes_exactly(tmp_path):
    opt = _opt(2e-3, groups=2)
    sched = WarmupStableDecayLR(
        opt, total_steps=40, warmup_steps=5, decay_proportion=0.25, decay_shape="cosine"
    )
    whole = _lrs_by_stepping(sched, opt, 40)
    assert whole == pytest.approx([sched.lr_at(t, 2e-3) for t in range(40)], rel=1e-12)
    assert whole[5:30] == [2e-3] * 25  # stable between warmup and decay
    # resume at step 33 (inside the decay) from a weights_only state dict, in Lightning's
    # order: optimiser and scheduler built, then the optimiser's state, then the scheduler's
    opt = _opt(2e-3, groups=2)
    first = WarmupStableDecayLR(
        opt, total_steps=40, warmup_steps=5, decay_proportion=0.25, decay_shape="cosine"
    )
    head = _lrs_by_stepping(first, opt, 33)
    torch.save({"opt": opt.state_dict(), "sched": first.state_dict()}, tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    opt2 = _opt(2e-3, groups=2)
    second = WarmupStableDecayLR(
        opt2, total_steps=40, warmup_steps=5, decay_proportion=0.25, decay_shape="cosine"
    )
    opt2.load_state_dict(state["opt"])
    second.load_state_dict(state["sched"])
    assert second.last_epoch == 33
    tail = _lrs_by_stepping(second, opt2, 7)
    assert head + tail == whole
    assert opt2.param_groups[1]["lr"] == pytest.approx(sched.lr_at(40, 4e-3), abs=1e-18)


def test_wsd_bad_values_are_named():
    with pytest.raises(ValueError, match="decay_shape='exp' is not one of linear, cosine, 1-sqrt"):
        _wsd("exp")
    with pytest.raises(ValueError, match="decay_proportion must be in"):
        _wsd(decay_proportion=1.5)
    with pytest.raises(ValueError, match="decay_steps must be >= 0"):
        _wsd(decay_steps=-1)
    with pytest.raises(ValueError, match=r"warmup \(100 steps\) and decay \(950 steps\) overlap"):
        _wsd(decay_steps=950)
    _wsd(decay_steps=900)  # warmup ends exactly where the decay starts: allowed


def test_a_bad_wsd_key_is_one_sentence_before_compute():
    from omnibert.config import TrainConfigError
    from omnibert.config.node import Optimizer
    from omnibert.run.pretraining.checks import check_optimizer

    optimizer = Optimizer({"_target_": "omnibert.optim.AdamW", "_partial_": True, "lr": 1e-3})
    schedule = {"_target_": "omnibert.optim.schedules.WarmupStableDecayLR", "_partial_": True,
                "warmup_steps": 10, "decay_shape": "quadratic"}  # fmt: skip
    with pytest.raises(TrainConfigError, match=r"decay_shape='quadratic'.*fix the schedule keys"):
        check_optimizer(optimizer, schedule, 100)
