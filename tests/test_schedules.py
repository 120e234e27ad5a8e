"""Learning-rate schedules against closed-form values at chosen steps, incl. the seed recipes."""

from __future__ import annotations

import math

import pytest
import torch
from hydra.utils import instantiate

from omnibert.optim.schedules import NaturalExpWarmupLR, PolyWarmupLR, StepTableLR


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
