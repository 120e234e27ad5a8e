"""Learning-rate schedules of the BERT references, as ``torch`` LR schedulers.

``step`` below is the scheduler's ``last_epoch``: the number of optimiser steps taken so far,
so the LR at ``step`` is the one the ``step+1``-th update uses (MLPerf's ``global_step``).
Step the scheduler once per optimiser step (Lightning: ``"interval": "step"``).

* :class:`PolyWarmupLR`: linear warmup, then polynomial decay (TF ``polynomial_decay`` /
  MLPerf ``create_optimizer`` / NVIDIA ``PolyWarmUpScheduler``):

  - warmup, while ``step - start_warmup_step < W``: ``lr = base·(step - start_warmup_step)/W``
    (as MLPerf; a step before ``start_warmup_step`` gives a negative value there too, so keep
    ``start_warmup_step <= 0``);
  - afterwards ``lr = (base - end_lr)·(1 - min(step, T)/T)**power + end_lr`` with ``T`` the
    total steps (or, with ``decay_from_warmup_end``, ``(step-W)/(T-W)`` as progress: the
    Hugging Face form).

  ``W`` is ``warmup_steps``, or ``warmup_proportion·T`` (a float, as NVIDIA: 0.2843·7038).
* :class:`NaturalExpWarmupLR`: the same warmup, then ``base·exp(-decay_rate·step/decay_steps)``
  (TF ``natural_exp_decay``; ``staircase`` floors the exponent's step ratio).
* :class:`StepTableLR`: a step→LR table, piecewise constant (or linear with ``interpolate``).
* Linear warmup + linear decay is :class:`PolyWarmupLR` with ``power=1``
  (``conf/schedule/linear_warmup.yaml``).
* :class:`WarmupStableDecayLR`: warmup-stable-decay ("trapezoidal", WSD): the same warmup to
  the peak, the peak held, then a decay to ``end_lr`` over the last ``D`` steps ending at
  ``T`` (``D = decay_steps``, or ``decay_proportion·T``). With ``p = (step - (T - D))/D``
  clipped to [0, 1]: ``lr = end_lr + (base - end_lr)·f(p)``, ``f`` one of ``linear``
  (``1 - p``), ``cosine`` (``(1 + cos(pi·p))/2``) and ``1-sqrt`` (``1 - sqrt(p)``, Hägele et
  al. 2024, the shape ModernBERT decayed with).

Scheduler state is plain numbers, so it round-trips through ``weights_only`` checkpoints.
Each schedule's :meth:`milestones` names the steps its shape is pinned to (where the warm-up
ends, where the decay starts and ends): what a resume with another ``phase.max_steps`` prints
as moved (:mod:`omnibert.checkpoints.resume_rules`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler


def _warmup_steps(total_steps: int, warmup_steps: float | None, warmup_proportion: float) -> float:
    if total_steps <= 0:
        raise ValueError(f"schedule total_steps must be positive, got {total_steps}.")
    if warmup_steps is not None:
        if warmup_steps < 0:
            raise ValueError(f"schedule warmup_steps must be >= 0, got {warmup_steps}.")
        return float(warmup_steps)
    if not 0.0 <= warmup_proportion <= 1.0:
        raise ValueError(f"schedule warmup_proportion must be in [0, 1], got {warmup_proportion}.")
    return warmup_proportion * total_steps


class _WarmupSchedule(LRScheduler):
    """Linear warmup over ``W`` steps from ``start_warmup_step``, then :meth:`decayed`."""

    def __init__(
        self,
        optimizer: Optimizer,
        total_steps: int,
        warmup_steps: float | None = None,
        warmup_proportion: float = 0.0,
        start_warmup_step: int = 0,
        last_epoch: int = -1,
    ) -> None:
        self.total_steps = int(total_steps)
        self.warmup = _warmup_steps(self.total_steps, warmup_steps, warmup_proportion)
        self.start_warmup_step = int(start_warmup_step)
        super().__init__(optimizer, last_epoch)

    def decayed(self, step: int, base_lr: float) -> float:
        raise NotImplementedError

    def milestones(self) -> dict[str, float]:
        """The steps this schedule's shape is pinned to, by what happens there."""
        return {"its warm-up ends at step": self.start_warmup_step + self.warmup}

    def lr_at(self, step: int, base_lr: float) -> float:
        """Closed-form LR at ``step`` for a group whose peak LR is ``base_lr``."""
        since = step - self.start_warmup_step
        if self.warmup > 0 and since < self.warmup:
            return base_lr * since / self.warmup
        return self.decayed(step, base_lr)

    def get_lr(self) -> list[float]:  # type: ignore[override]
        return [self.lr_at(self.last_epoch, float(base)) for base in self.base_lrs]


class PolyWarmupLR(_WarmupSchedule):
    """Linear warmup then polynomial decay to ``end_lr`` at ``total_steps`` (module doc)."""

    def __init__(
        self,
        optimizer: Optimizer,
        total_steps: int,
        warmup_steps: float | None = None,
        warmup_proportion: float = 0.0,
        power: float = 1.0,
        end_lr: float = 0.0,
        start_warmup_step: int = 0,
        decay_from_warmup_end: bool = False,
        last_epoch: int = -1,
    ) -> None:
        self.power = float(power)
        self.end_lr = float(end_lr)
        self.decay_from_warmup_end = bool(decay_from_warmup_end)
        super().__init__(
            optimizer, total_steps, warmup_steps, warmup_proportion, start_warmup_step, last_epoch
        )

    def decayed(self, step: int, base_lr: float) -> float:
        if self.decay_from_warmup_end:
            span = max(self.total_steps - self.warmup, 1e-12)
            progress = min(max(step - self.warmup, 0.0), span) / span
        else:
            progress = min(step, self.total_steps) / self.total_steps
        return (base_lr - self.end_lr) * (1.0 - progress) ** self.power + self.end_lr

    def milestones(self) -> dict[str, float]:
        return {"poly decay ends at step": self.total_steps, **super().milestones()}


class NaturalExpWarmupLR(_WarmupSchedule):
    """Linear warmup then ``base·exp(-decay_rate·step/decay_steps)`` (module doc)."""

    def __init__(
        self,
        optimizer: Optimizer,
        total_steps: int,
        decay_rate: float,
        decay_steps: int,
        warmup_steps: float | None = None,
        warmup_proportion: float = 0.0,
        staircase: bool = False,
        start_warmup_step: int = 0,
        last_epoch: int = -1,
    ) -> None:
        if decay_steps <= 0:
            raise ValueError(f"natural_exp decay_steps must be positive, got {decay_steps}.")
        self.decay_rate = float(decay_rate)
        self.decay_steps = int(decay_steps)
        self.staircase = bool(staircase)
        super().__init__(
            optimizer, total_steps, warmup_steps, warmup_proportion, start_warmup_step, last_epoch
        )

    def decayed(self, step: int, base_lr: float) -> float:
        ratio = step / self.decay_steps
        if self.staircase:
            ratio = math.floor(ratio)
        return base_lr * math.exp(-self.decay_rate * ratio)


#: the decay shapes of :class:`WarmupStableDecayLR`: the fraction of ``base - end_lr`` left
#: at progress ``p`` in [0, 1] through the decay
DECAY_SHAPES: dict[str, Callable[[float], float]] = {
    "linear": lambda p: 1.0 - p,
    "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p)),
    "1-sqrt": lambda p: 1.0 - math.sqrt(p),
}


class WarmupStableDecayLR(_WarmupSchedule):
    """Linear warmup, the peak LR held, then a decay to ``end_lr`` over the last
    ``decay_steps`` (or ``decay_proportion·total_steps``) steps (module doc).

    The decay ends at ``total_steps`` and must not start before the warmup ends; a step past
    ``total_steps`` keeps ``end_lr``. ``decay_steps=0`` (or ``decay_proportion=0``) holds the
    peak to the end: a run meant to be continued (ModernBERT's main phase).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        total_steps: int,
        warmup_steps: float | None = None,
        warmup_proportion: float = 0.0,
        decay_proportion: float = 0.1,
        decay_steps: float | None = None,
        decay_shape: str = "1-sqrt",
        end_lr: float = 0.0,
        start_warmup_step: int = 0,
        last_epoch: int = -1,
    ) -> None:
        if decay_shape not in DECAY_SHAPES:
            raise ValueError(
                f"schedule decay_shape={decay_shape!r} is not one of "
                f"{', '.join(DECAY_SHAPES)}; pick one of them."
            )
        if decay_steps is not None:
            if decay_steps < 0:
                raise ValueError(f"schedule decay_steps must be >= 0, got {decay_steps}.")
            decay = float(decay_steps)
        elif not 0.0 <= decay_proportion <= 1.0:
            raise ValueError(
                f"schedule decay_proportion must be in [0, 1], got {decay_proportion}."
            )
        else:
            decay = float(decay_proportion) * int(total_steps)
        self.decay_shape = str(decay_shape)
        self.decay_steps = decay
        self.end_lr = float(end_lr)
        warmup = _warmup_steps(int(total_steps), warmup_steps, warmup_proportion)
        if warmup + start_warmup_step > int(total_steps) - decay + 1e-9:
            raise ValueError(
                f"schedule warmup ({warmup:g} steps) and decay ({decay:g} steps) overlap in a "
                f"{int(total_steps)}-step run; shorten schedule.decay_steps / "
                "schedule.decay_proportion or the phase's warmup."
            )
        super().__init__(
            optimizer, total_steps, warmup_steps, warmup_proportion, start_warmup_step, last_epoch
        )

    @property
    def decay_start(self) -> float:
        """The step the decay begins at (``total_steps - decay_steps``)."""
        return self.total_steps - self.decay_steps

    def decayed(self, step: int, base_lr: float) -> float:
        if self.decay_steps <= 0:  # no decay: the peak to the end
            return base_lr
        progress = min(max(step - self.decay_start, 0.0) / self.decay_steps, 1.0)
        return self.end_lr + (base_lr - self.end_lr) * DECAY_SHAPES[self.decay_shape](progress)

    def milestones(self) -> dict[str, float]:
        return {
            "warmup-stable-decay's decay starts at step": self.decay_start,
            "warmup-stable-decay's decay ends at step": self.total_steps,
            **super().milestones(),
        }


class StepTableLR(LRScheduler):
    """LR from a table of ``(step, lr)`` pairs (or a ``{step: lr}`` mapping): the entry of the
    largest step ``<=`` the current one.

    Before the first entry the first LR applies. With ``interpolate`` the LR moves linearly
    between entries. Values are absolute LRs for the first parameter group; other groups keep
    their ratio to it (``lr_g = table · base_g / base_0``). ``total_steps`` (the run's length,
    as every schedule gets it) refuses entries the run would never reach.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        table: Mapping[Any, float] | Sequence[Sequence[float]],
        interpolate: bool = False,
        total_steps: int | None = None,
        last_epoch: int = -1,
    ) -> None:
        pairs = table.items() if isinstance(table, Mapping) else table
        items = sorted((int(k), float(v)) for k, v in pairs)
        if not items:
            raise ValueError("StepTableLR needs a non-empty table of [step, lr] pairs.")
        if total_steps is not None and items[-1][0] >= total_steps:
            raise ValueError(
                f"schedule.table has an entry at step {items[-1][0]} but the run has "
                f"{total_steps} steps (phase.max_steps), so it would never apply; drop it or "
                "train longer."
            )
        self.steps = [k for k, _ in items]
        self.values = [v for _, v in items]
        self.interpolate = bool(interpolate)
        super().__init__(optimizer, last_epoch)

    def milestones(self) -> dict[str, float]:
        """None: the table's steps are absolute, whatever the run's length."""
        return {}

    def table_lr(self, step: int) -> float:
        """The table's LR at ``step``."""
        i = bisect.bisect_right(self.steps, step) - 1
        if i < 0:
            return self.values[0]
        if not self.interpolate or i == len(self.steps) - 1:
            return self.values[i]
        s0, s1, v0, v1 = self.steps[i], self.steps[i + 1], self.values[i], self.values[i + 1]
        return v0 + (v1 - v0) * (step - s0) / (s1 - s0)

    def get_lr(self) -> list[float]:  # type: ignore[override]
        lr = self.table_lr(self.last_epoch)
        first = float(self.base_lrs[0])
        return [lr * float(base) / first if first else lr for base in self.base_lrs]
