"""What a resume may change, decided before compute (docs/faults.md, "Resume rules").

A run resumed with ``ckpt_path`` compares its settings with the checkpoint's: the task's
hyper-parameters (optimiser, schedule, run length, clipping), the run record
(:class:`RunRecord` writes it into every checkpoint: global batch, precision, checkpoint
cadence) and, for a
checkpoint written before that record existed, the checkpoint callback's state key (the
cadence). Every state-bearing setting that differs is either

* **applied**, with a line in the plan: the run's length (the schedule is *re-planned*: the
  same schedule function, built with this run's settings and length, evaluated from the
  resumed step on, e.g. ``schedule: poly decay ends at step 40 (was 20)``; a warm-up given as
  a proportion scales with the new length, a warmup-stable-decay's decay moves to the new
  end, a natural-exponential decay and a step table do not depend on it), the learning rate
  (``optimizer.lr: 0.006 -> 0.001``) and every other optimiser or schedule setting, the
  precision between fp32 and the mixed precisions, the clipping and the checkpoint cadence;
* or **refused** in one sentence naming the key and the way out: a length that ends before
  the resumed step, another optimiser class or parameter grouping (its saved state would
  not fit), a schedule added or removed, another global batch (the data position and the
  accumulation are counted in the checkpoint's steps), a change to or from a half-precision
  ``-true`` setting (the weights' own dtype).

The micro batch, the devices, the data and the seed belong to the data sampler's position:
another value is refused by :func:`omnibert.checkpoints.resuming.check_resume_position`; another
architecture by :func:`~omnibert.checkpoints.resuming.check_resume_target`. The applied changes
take effect through :meth:`omnibert.tasks.base.TrainingTask.apply_configured_settings`
(optimiser and schedule) and the Trainer and callbacks the run builds from its config.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import lightning.pytorch as pl
import torch

from omnibert.checkpoints.files import unreadable_checkpoint
from omnibert.compat import load_checkpoint
from omnibert.config import TrainConfigError
from omnibert.errors import UserError
from omnibert.optim.build import build_optimizer, build_schedule

__all__ = [
    "FINETUNING",
    "PRETRAINING",
    "RUN_RECORD_KEY",
    "ResumeKeys",
    "RunRecord",
    "RunSettings",
    "plan_resume",
]

#: where a checkpoint keeps the run record (:class:`RunRecord`)
RUN_RECORD_KEY = "omnibert_run"

#: optimiser keys whose change would not fit the saved optimiser state
_STATE_SHAPING = {
    "_target_": "its saved state belongs to that optimiser",
    "no_weight_decay": "it decides the parameter groups the saved state is kept in",
}


@dataclass(frozen=True)
class ResumeKeys:
    """The keys a user types for the settings a resume compares (each job's own)."""

    #: the key that sets the run's length
    max_steps: str
    lr: str
    global_batch: str
    #: the key that starts a new run from a checkpoint's weights (fresh optimiser, schedule)
    fresh: str

    def length(self, steps: int) -> str:
        if self.max_steps == "phase.max_steps":
            return f"{self.max_steps}={steps}"
        return f"{self.max_steps} ({steps} steps)"

    def length_change(self, before: int, after: int) -> str:
        if self.max_steps == "phase.max_steps":
            return f"{self.max_steps}: {before} -> {after} steps"
        return f"steps ({self.max_steps} × steps per epoch): {before} -> {after}"


PRETRAINING = ResumeKeys("phase.max_steps", "optimizer.lr", "phase.global_batch_size",
                         "phase.init_from")  # fmt: skip
FINETUNING = ResumeKeys("task.epochs", "task.lr", "task.batch_size", "model.init_from")


@dataclass(frozen=True)
class RunSettings:
    """This run's state-bearing settings, as its config resolved them."""

    optimizer: Mapping[str, Any]
    schedule: Mapping[str, Any] | None
    total_steps: int
    global_batch_size: int
    micro_batch_size: int
    world_size: int
    precision: str
    every_n_train_steps: int | None
    keep_last: int | None
    clip_grad_per_micro_batch: float | None = None

    def record(self) -> dict[str, Any]:
        """What :class:`RunRecord` writes into checkpoints
        (what the hyper-parameters lack)."""
        out = asdict(self)
        for key in ("optimizer", "schedule", "total_steps", "clip_grad_per_micro_batch"):
            del out[key]
        return out


class RunRecord(pl.Callback):
    """Puts ``record`` (plain values: :meth:`RunSettings.record`, the settings the task's
    ``hparams`` do not hold) into every checkpoint under :data:`RUN_RECORD_KEY`; a run that
    resumes the checkpoint compares them with its own (:func:`plan_resume`)."""

    def __init__(self, record: Mapping[str, Any]) -> None:
        super().__init__()
        self.record = copy.deepcopy(dict(record))

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[RUN_RECORD_KEY] = copy.deepcopy(self.record)


def plan_resume(
    ckpt: str,
    now: RunSettings,
    keys: ResumeKeys = PRETRAINING,
    error: type[UserError] = TrainConfigError,
    run_name: str | None = None,
    origins: Mapping[str, str] | None = None,
) -> list[str]:
    """The plan's lines of what differs from the checkpoint ``ckpt`` and is applied (empty:
    nothing); raises ``error`` for what cannot be honoured (module docstring), its way out
    naming a new run (another ``run_name`` than ``run_name``, whose directory holds the
    checkpoints) where a resume cannot be made. ``origins`` (the typed config's) name an
    interpolated setting by the key it was typed at (``phase.warmup_proportion``, not
    ``schedule.warmup_proportion``)."""
    try:
        saved = load_checkpoint(ckpt, mmap=True)
    except Exception as err:
        raise error(unreadable_checkpoint("ckpt_path", ckpt, err)) from err
    step = int(saved.get("global_step") or 0)
    hparams = saved.get("hyper_parameters") or {}
    record = saved.get(RUN_RECORD_KEY) or {}
    name = f"{run_name}-from-step{step}" if run_name else "<another name>"
    fresh = (
        f"start a new run from its weights (a fresh optimiser and schedule): {keys.fresh}="
        f"{ckpt} run_name={name}, without ckpt_path"
    )
    if now.total_steps < step:
        raise error(
            f"{keys.length(now.total_steps)} ends before step {step}, where ckpt_path={ckpt} "
            f"stopped; set a longer run, or resume an earlier step-*.ckpt."
        )
    lines: list[str] = []
    old_total = hparams.get("total_steps")
    if old_total is not None and old_total != now.total_steps:
        lines.append(
            f"{keys.length_change(old_total, now.total_steps)}; the schedule is re-planned "
            f"over {now.total_steps} steps and goes on from step {step}"
        )
    old_optimizer = hparams.get("optimizer") or {}
    typed = dict(origins or {})
    typed.setdefault("optimizer.lr", keys.lr)
    lines += _optimizer_changes(old_optimizer, now.optimizer, ckpt, typed, fresh, error)
    lines += _schedule_changes(saved, hparams, now, step, ckpt, fresh, error, typed)
    clip = hparams.get("clip_grad_per_micro_batch")
    if "clip_grad_per_micro_batch" in hparams and clip != now.clip_grad_per_micro_batch:
        lines.append(f"clip_grad_per_micro_batch: {clip} -> {now.clip_grad_per_micro_batch}")
    lines += _record_changes(record, now, ckpt, keys, fresh, error)
    every = record.get("every_n_train_steps", _saved_cadence(saved))
    if every is not None and every != now.every_n_train_steps:
        lines.append(f"callbacks.checkpoint.every_n_train_steps: {every} -> "
                     f"{now.every_n_train_steps}")  # fmt: skip
    return lines


def _optimizer_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], ckpt: str, typed: Mapping[str, str],
    fresh: str, error: type[UserError],
) -> list[str]:  # fmt: skip
    if not old:
        return []
    lines = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if key == "_partial_" or before == after:
            continue
        if key in _STATE_SHAPING:
            back = (
                f"the optimizer group whose _target_ is {before}"
                if key == "_target_"
                else f"optimizer.{key}={before}"
            )
            raise error(
                f"optimizer.{key}={after} but ckpt_path={ckpt} was trained with {before}: "
                f"{_STATE_SHAPING[key]}; resume with {back}, or {fresh}."
            )
        name = typed.get(f"optimizer.{key}", f"optimizer.{key}")
        if key == "lr":
            lines.append(f"{name}: {_number(before)} -> {_number(after)} (the optimiser's "
                         "groups and the schedule's peak take it)")  # fmt: skip
        else:
            lines.append(f"{name}: {before} -> {after}")
    return lines


def _schedule_changes(
    saved: Mapping[str, Any], hparams: Mapping[str, Any], now: RunSettings, step: int,
    ckpt: str, fresh: str, error: type[UserError], typed: Mapping[str, str],
) -> list[str]:  # fmt: skip
    if "schedule" not in hparams:
        return []
    old, new = hparams["schedule"], now.schedule
    if (old is None) != (new is None):
        had = "without a schedule" if old is None else f"with the schedule {old['_target_']}"
        raise error(
            f"schedule={'null' if new is None else new['_target_']} but ckpt_path={ckpt} was "
            f"trained {had}, whose position a resume continues; resume with its schedule, "
            f"or {fresh}."
        )
    if old is None or new is None:
        return []
    lines = [
        f"{typed.get(f'schedule.{key}', f'schedule.{key}')}: {old.get(key)} -> {new.get(key)}"
        for key in sorted(set(old) | set(new))
        if key != "_partial_" and old.get(key) != new.get(key)
    ]
    old_lr = (hparams.get("optimizer") or {}).get("lr")
    old_total = hparams.get("total_steps")
    changed = lines or old_lr != now.optimizer.get("lr") or old_total != now.total_steps
    if not changed or old_lr is None or old_total is None:
        return lines
    position = _schedule_position(saved, step)
    try:
        before = _schedule(old, old_lr, int(old_total))
        after = _schedule(new, now.optimizer.get("lr"), now.total_steps)
    except Exception:  # a schedule of another version that no longer builds: no details
        return lines
    moved = [
        f"{what} {_number(where)} (was {_number(before[1][what]) if what in before[1] else 'none'})"
        for what, where in after[1].items()
        if before[1].get(what) != where
    ]
    if moved:
        lines.append(f"schedule: {', '.join(moved)}")
    lr_before, lr_after = before[0](position), after[0](position)
    if lr_before != lr_after:
        lines.append(f"the LR at step {step}, where this run resumes: {_number(lr_after)} "
                     f"(was {_number(lr_before)})")  # fmt: skip
    return lines


def _schedule(spec: Mapping[str, Any], lr: Any, total: int) -> tuple[Any, dict[str, float]]:
    """The LR at a position of the schedule ``spec`` at peak ``lr`` over ``total`` steps,
    and its milestones."""
    weight = torch.zeros(1, requires_grad=True)
    optimizer = build_optimizer({"_target_": "torch.optim.SGD", "_partial_": True, "lr": lr},
                                [("dummy.weight", weight)])  # fmt: skip
    scheduler = build_schedule(spec, optimizer, total)

    def lr_at(position: int) -> float:
        scheduler.last_epoch = position
        return float(scheduler.get_lr()[0])

    milestones = getattr(scheduler, "milestones", dict)
    return lr_at, dict(milestones())


def _record_changes(
    record: Mapping[str, Any], now: RunSettings, ckpt: str, keys: ResumeKeys, fresh: str,
    error: type[UserError],
) -> list[str]:  # fmt: skip
    lines: list[str] = []
    batch = record.get("global_batch_size")
    if batch is not None and batch != now.global_batch_size:
        raise error(
            f"{keys.global_batch}={now.global_batch_size} but ckpt_path={ckpt} was trained with "
            f"{batch}: its data position and gradient accumulation are counted in steps of "
            f"{batch} sequences, so another batch cannot go on exactly from there; resume with "
            f"{keys.global_batch}={batch}, or {fresh}."
        )
    precision = record.get("precision")
    if precision is not None and precision != now.precision:
        if _half_weights(precision) or _half_weights(now.precision):
            raise error(
                f"trainer.precision={now.precision} but ckpt_path={ckpt} was trained in "
                f"{precision}: the dtype the weights themselves are kept in would change; "
                f"resume with trainer.precision={precision}, or {fresh}."
            )
        scale = ""
        if now.precision.startswith("16") != precision.startswith("16"):
            scale = "; fp16's loss scale " + (
                "starts afresh" if now.precision.startswith("16") else "is dropped"
            )
        lines.append(f"trainer.precision: {precision} -> {now.precision} (weights and optimiser "
                     f"state stay fp32{scale})")  # fmt: skip
    if "keep_last" in record and record["keep_last"] != now.keep_last:
        lines.append(f"callbacks.checkpoint.keep_last: {record['keep_last']} -> {now.keep_last} "
                     "(counting the step checkpoints already there)")  # fmt: skip
    return lines


def _half_weights(precision: str) -> bool:
    """A precision whose weights themselves are 16-bit (``bf16-true``, ``16-true``)."""
    return precision.endswith("-true") and not precision.startswith(("32", "64"))


def _schedule_position(saved: Mapping[str, Any], step: int) -> int:
    """The schedule's step count in the checkpoint (below ``global_step`` after skipped
    non-finite steps), else ``step``."""
    schedulers = saved.get("lr_schedulers") or []
    if schedulers and isinstance(schedulers[0], Mapping) and "last_epoch" in schedulers[0]:
        return int(schedulers[0]["last_epoch"])
    return step


def _saved_cadence(saved: Mapping[str, Any]) -> int | None:
    """``every_n_train_steps`` from the checkpoint callback's state key (Lightning's keys
    hold the cadence), for checkpoints written without a run record."""
    for key in saved.get("callbacks") or {}:
        name, brace, rest = str(key).partition("{")
        if name != "PretrainingCheckpoint" or not brace:
            continue
        try:
            settings = ast.literal_eval(brace + rest)
        except (ValueError, SyntaxError):
            return None
        every = settings.get("every_n_train_steps") if isinstance(settings, dict) else None
        return every if isinstance(every, int) and every > 0 else None
    return None


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:.6g}"
