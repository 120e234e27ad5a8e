"""The derived training plan: batch arithmetic, cadences, resume target, clipping.

``omnibert-train`` never mutates its composed config; everything that follows from it (world
size, micro batches, gradient accumulation, validation cadence in batches, the checkpoint to
resume from, where gradients are clipped) is derived here, checked, printed and saved with
the run. Every problem is one :class:`TrainConfigError` sentence naming the key and the fix.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnibert.callbacks.checkpoint_io import stale_temporary_files
from omnibert.errors import UserError


class TrainConfigError(UserError):
    """The training configuration cannot work; the message names the key and the fix."""


@dataclass(frozen=True)
class BatchPlan:
    """``rows_per_step = micro_batch_size · world_size · accumulate_grad_batches``.

    Unpacked, a row is a sequence and ``rows_per_step == global_batch_size``. Packed,
    ``global_batch_size`` still counts sequences and ``rows_per_step`` is about
    ``global_batch_size / sequences_per_row`` (:func:`packed_batch_plan`).
    """

    global_batch_size: int
    world_size: int
    micro_batch_size: int
    accumulate_grad_batches: int
    eval_micro_batch_size: int
    sequences_per_row: float = 1.0

    @property
    def rows_per_step(self) -> int:
        return self.micro_batch_size * self.world_size * self.accumulate_grad_batches

    @property
    def sequences_per_step(self) -> float:
        """Average sequences per optimiser step (exactly ``global_batch_size`` unpacked)."""
        return self.rows_per_step * self.sequences_per_row


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TrainConfigError(f"{key}={value!r} must be a positive integer; fix {key}.")
    return value


def batch_plan(
    global_batch_size: Any,
    devices: Any,
    num_nodes: Any,
    micro_batch_size: Any = None,
    eval_micro_batch_size: Any = None,
) -> BatchPlan:
    """Split the global batch over devices and accumulation steps (or explain why not)."""
    total = _positive_int("phase.global_batch_size", global_batch_size)
    world = _positive_int("accelerator.devices", devices) * _positive_int(
        "accelerator.num_nodes", num_nodes
    )
    if micro_batch_size is None:
        if total % world:
            raise TrainConfigError(
                f"phase.global_batch_size={total} does not split over {world} devices; choose "
                f"a global batch that is a multiple of {world} or set micro_batch_size."
            )
        micro = total // world
    else:
        micro = _positive_int("micro_batch_size", micro_batch_size)
    if total % (micro * world):
        raise TrainConfigError(
            f"phase.global_batch_size={total} is not a multiple of micro_batch_size={micro} × "
            f"{world} device(s) = {micro * world}; choose a micro batch size that divides "
            f"{total // world if total % world == 0 else total} evenly."
        )
    evaluation = micro if eval_micro_batch_size is None else eval_micro_batch_size
    evaluation = _positive_int("eval_micro_batch_size", evaluation)
    return BatchPlan(total, world, micro, total // (micro * world), evaluation)


def packed_batch_plan(
    batch: BatchPlan, sequences_per_row: float, micro_batch_size: Any = None
) -> BatchPlan:
    """The batch plan when rows hold ``sequences_per_row`` sequences on average.

    ``phase.global_batch_size`` keeps counting sequences, so the learning rate, warmup and
    step counts of the recipe keep their meaning: a step runs the whole number of
    ``micro × devices`` row groups nearest to ``global / sequences_per_row`` (at least one),
    which is how Graphcore and Habana scale the batch by the average packing factor. With
    ``micro_batch_size`` null the rows are split over the devices without accumulation.
    """
    if sequences_per_row <= 0:
        raise ValueError(f"sequences_per_row={sequences_per_row} must be positive.")
    rows = batch.global_batch_size / sequences_per_row
    world = batch.world_size
    if micro_batch_size is None:
        micro, accumulate = max(1, round(rows / world)), 1
    else:
        micro = _positive_int("micro_batch_size", micro_batch_size)
        accumulate = max(1, round(rows / (micro * world)))
    return dataclasses.replace(
        batch,
        micro_batch_size=micro,
        accumulate_grad_batches=accumulate,
        sequences_per_row=sequences_per_row,
    )


def resolve_clipping(setting: Any, optimizer: Mapping[str, Any]) -> float | None:
    """``clip_grad_per_micro_batch``: ``auto`` → 1.0 when the optimiser itself does not clip
    (``max_grad_norm: null``, as ``lamb_mlperf``), else off; a number → that norm; null → off."""
    if setting is None:
        return None
    if setting == "auto":
        clips_itself = optimizer.get("max_grad_norm", 0) is not None
        return None if clips_itself or "max_grad_norm" not in optimizer else 1.0
    if isinstance(setting, bool) or not isinstance(setting, (int, float)) or setting <= 0:
        raise TrainConfigError(
            f"clip_grad_per_micro_batch={setting!r} must be auto, null or a positive norm."
        )
    return float(setting)


def describe_clipping(
    micro_clip: float | None, optimizer: Mapping[str, Any], gradient_clip_val: Any
) -> str:
    in_optimizer = optimizer.get("max_grad_norm")
    if micro_clip is not None and in_optimizer is not None:
        raise TrainConfigError(
            f"clip_grad_per_micro_batch={micro_clip} and optimizer.max_grad_norm="
            f"{in_optimizer} would clip twice; set one of them to null."
        )
    if gradient_clip_val and (micro_clip is not None or in_optimizer is not None):
        raise TrainConfigError(
            f"trainer.gradient_clip_val={gradient_clip_val} clips on top of the optimiser's "
            "own clipping and changes the maths; leave trainer.gradient_clip_val null."
        )
    if micro_clip is not None:
        return f"each micro-batch to global norm {micro_clip:g} before accumulation (MLPerf)"
    if in_optimizer is not None:
        return f"accumulated gradient to global norm {in_optimizer:g} in the optimiser (apex)"
    if gradient_clip_val:
        return f"accumulated gradient to {gradient_clip_val:g} by Lightning"
    return "none"


def check_optimizer(optimizer: Mapping[str, Any], schedule: Mapping[str, Any] | None) -> None:
    """Build the optimiser and schedule on one dummy tensor: config errors before any compute."""
    from hydra.utils import instantiate

    weight = torch.zeros(1, requires_grad=True)
    try:
        opt = instantiate(dict(optimizer), _convert_="all")([("dummy.weight", weight)])
    except Exception as err:
        raise TrainConfigError(
            f"optimizer ({optimizer.get('_target_')}) cannot be built: {_root(err)}; fix the "
            "optimizer keys."
        ) from err
    if schedule is None:
        return
    try:
        instantiate(dict(schedule), _convert_="all")(opt)
    except Exception as err:
        raise TrainConfigError(
            f"schedule ({schedule.get('_target_')}) cannot be built: {_root(err)}; fix the "
            "schedule keys (phase.max_steps feeds schedule.total_steps)."
        ) from err


def _root(err: BaseException) -> str:
    while err.__cause__ is not None:
        err = err.__cause__
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def resolve_vocab_size(model_config: Mapping[str, Any], data_vocab_size: int) -> int:
    configured = model_config.get("vocab_size")
    if configured is None:
        return int(data_vocab_size)
    if configured != data_vocab_size:
        raise TrainConfigError(
            f"model.config.vocab_size={configured} but the data was tokenised with a "
            f"{data_vocab_size}-token vocab; set model.config.vocab_size=null (take it from "
            "the data) or use data prepared with the model's vocab."
        )
    return int(configured)


def resolve_ckpt_path(ckpt_path: Any, checkpoint_dir: str | os.PathLike[str]) -> str | None:
    """``null`` → fresh run (refused over an earlier run's checkpoints); ``last`` →
    ``<checkpoint_dir>/last.ckpt``; otherwise an existing file."""
    folder = Path(checkpoint_dir)
    if ckpt_path is None:
        existing = sorted(folder.glob("*.ckpt")) if folder.is_dir() else []
        if existing:
            raise TrainConfigError(
                f"{folder} already holds {len(existing)} checkpoint(s) of an earlier run "
                f"(e.g. {existing[-1].name}); resume it with ckpt_path=last, or start a new "
                "run under another run_name."
            )
        return None
    if ckpt_path == "last":
        last = folder / "last.ckpt"
        if not last.is_file():
            raise TrainConfigError(
                f"ckpt_path=last but there is no last.ckpt in {folder}; run without ckpt_path "
                "to start fresh, or pass ckpt_path=<file.ckpt>."
            )
        return str(last)
    path = Path(str(ckpt_path))
    if not path.is_file():
        raise TrainConfigError(
            f"ckpt_path={ckpt_path} does not exist; pass an existing .ckpt file or ckpt_path=last."
        )
    return str(path)


def check_resume_target(ckpt: str, model_config: Mapping[str, Any]) -> None:
    """The checkpoint to resume must hold the same model (read lazily with ``mmap``)."""
    try:
        saved = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:
        raise TrainConfigError(
            f"ckpt_path={ckpt} cannot be read ({_root(err)}); pass an intact checkpoint."
        ) from err
    theirs = (saved.get("hyper_parameters") or {}).get("model_config") or {}
    diffs = [
        f"{k}={theirs.get(k)!r} (now {v!r})" for k, v in model_config.items() if theirs.get(k) != v
    ]
    if diffs:
        raise TrainConfigError(
            f"ckpt_path={ckpt} was written for another model ({', '.join(diffs)}); resume with "
            "the model config of that run or start a new run_name."
        )


#: BertConfig fields that may differ between a run and the weights it starts from
REGULARISATION_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range")


def architecture_diffs(saved: Mapping[str, Any], model: Mapping[str, Any]) -> list[str]:
    """``key=saved (this model: ours)`` for every architecture field that differs."""
    return [
        f"{k}={saved.get(k)!r} (this model: {v!r})"
        for k, v in model.items()
        if k not in REGULARISATION_FIELDS and saved.get(k) != v
    ]


def check_init_from(init_from: Any, model_config: Mapping[str, Any]) -> str | None:
    """``init_from`` must exist and hold this architecture (a Hugging Face directory's
    config.json, or a .ckpt's ``hyper_parameters['model_config']``, read lazily)."""
    if init_from is None:
        return None
    path = Path(str(init_from))
    if not path.exists():
        raise TrainConfigError(
            f"init_from={init_from} does not exist; point model.init_from at a Hugging Face "
            "BERT directory or phase.init_from at a .ckpt of the previous phase."
        )
    if path.is_dir():
        from omnibert.convert.hf import read_hf_config

        saved = dataclasses.asdict(read_hf_config(path))
    else:
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            saved = dict(ckpt["hyper_parameters"]["model_config"])
        except Exception as err:
            raise TrainConfigError(
                f"init_from={path} is not a checkpoint written by omnibert-train "
                f"({_root(err)}); pass the previous phase's .ckpt."
            ) from err
    diffs = architecture_diffs(saved, model_config)
    if diffs:
        raise TrainConfigError(
            f"init_from={path} holds a different architecture: {', '.join(diffs)}; use the "
            "same model config (or model.config.vocab_size of the same vocab)."
        )
    return str(path)


def remove_stale_temporaries(checkpoint_dir: str | os.PathLike[str]) -> list[str]:
    """Delete half-written checkpoint temporaries of killed writers (never a real checkpoint)."""
    removed = []
    for path in stale_temporary_files(checkpoint_dir):
        path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


@dataclass(frozen=True)
class TrainPlan:
    """Everything ``omnibert-train`` derived from its config (printed and saved as JSON)."""

    batch: BatchPlan
    max_steps: int
    steps_per_epoch: int
    limit_train_batches: int
    val_every_n_steps: int | None
    val_check_interval: int | None
    vocab_size: int
    init_from: str | None
    ckpt_path: str | None
    checkpoint_dir: str
    clipping: str
    clip_grad_per_micro_batch: float | None
    precision: str
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["batch"].update(
            rows_per_step=self.batch.rows_per_step,
            sequences_per_step=self.batch.sequences_per_step,
        )
        return out

    def rows(self) -> list[tuple[str, str]]:
        b = self.batch
        val = (
            f"every {self.val_every_n_steps} steps ({self.val_check_interval} micro-batches) + end"
            if self.val_every_n_steps
            else "at the end"
        )
        packing = self.data.get("packing") or {}
        rows = [("global batch", f"{b.global_batch_size} sequences")]
        if packing.get("mode", "none") != "none":
            rows += [
                (
                    "packing",
                    f"{packing['mode']}, {b.sequences_per_row:.3f} sequences per row (K="
                    f"{packing['max_sequences_per_pack']}, P={packing['max_predictions_per_pack']}"
                    f"), efficiency {packing['efficiency_unpacked']:.3f} -> "
                    f"{packing['efficiency']:.3f}",
                ),
                (
                    "rows per step",
                    f"{b.rows_per_step} packed rows ≈ {b.sequences_per_step:.1f} sequences",
                ),
            ]
        return [
            *rows,
            ("devices", f"{b.world_size}"),
            ("micro batch", f"{b.micro_batch_size} per device (eval {b.eval_micro_batch_size})"),
            ("accumulation", f"{b.accumulate_grad_batches} micro-batches per step"),
            ("steps", f"{self.max_steps} ({self.steps_per_epoch} per pass over the data)"),
            ("train samples", f"{self.data.get('train_samples')}"),
            ("eval samples", f"{self.data.get('eval_samples')}"),
            ("validation", val),
            ("vocab size", f"{self.vocab_size}"),
            ("precision", self.precision),
            ("clipping", self.clipping),
            ("init from", self.init_from or "random init"),
            ("resume from", self.ckpt_path or "fresh run"),
            ("checkpoints", self.checkpoint_dir),
        ]

    def table(self) -> str:
        width = max(len(k) for k, _ in self.rows())
        return "\n".join(f"  {k:<{width}}  {v}" for k, v in self.rows())
