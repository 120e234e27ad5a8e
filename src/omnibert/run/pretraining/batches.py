"""A pretraining run's data and batch plan: the data module, checked against the data
(shapes, vocab, packing), the global batch split over devices and accumulation
(:class:`BatchPlan`: :func:`batch_plan`, :func:`packed_batch_plan`), and the micro batch: the
one ``micro_batch_size`` sets, checked against memory, or the largest that fits
(:mod:`omnibert.run.sizing.memory`). Every problem is one :class:`TrainConfigError` sentence
naming the key and the fix."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnibert.accelerators.base import lightning_precision
from omnibert.checkpoints.resuming import resolve_ckpt_path, saved_sampler_state
from omnibert.config import TrainConfig, TrainConfigError
from omnibert.run.pretraining.checks import resolve_clipping, resolve_vocab_size
from omnibert.run.sizing.memory import MicroBatchChoice, _gib, choose_micro_batch
from omnibert.run.sizing.speed_probe import candidate_sizes, probe_micro_batch

__all__ = [
    "BatchPlan",
    "batch_plan",
    "check_enough_data",
    "data_and_batches",
    "packed_batch_plan",
    "resumed_micro_batch",
]


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
    batch: BatchPlan,
    sequences_per_row: float,
    micro_batch_size: Any = None,
    max_micro_batch_size: int | None = None,
) -> BatchPlan:
    """The batch plan when rows hold ``sequences_per_row`` sequences on average.

    ``phase.global_batch_size`` keeps counting sequences, so the learning rate, warmup and
    step counts of the recipe keep their meaning: a step runs the whole number of
    ``micro × devices`` row groups nearest to ``global / sequences_per_row`` (at least one),
    which is how Graphcore and Habana scale the batch by the average packing factor. With
    ``micro_batch_size`` null (the user set none) the rows are split over the devices without
    accumulation, and with accumulation where that split exceeds ``max_micro_batch_size`` (the
    largest micro batch that fits the device's memory).
    """
    if sequences_per_row <= 0:
        raise ValueError(f"sequences_per_row={sequences_per_row} must be positive.")
    rows = batch.global_batch_size / sequences_per_row
    world = batch.world_size
    if micro_batch_size is None:
        micro, accumulate = max(1, round(rows / world)), 1
        if max_micro_batch_size is not None and micro > max_micro_batch_size:
            micro = max_micro_batch_size
            accumulate = max(1, round(rows / (micro * world)))
    else:
        micro = _positive_int("micro_batch_size", micro_batch_size)
        accumulate = max(1, round(rows / (micro * world)))
    return dataclasses.replace(
        batch,
        micro_batch_size=micro,
        accumulate_grad_batches=accumulate,
        sequences_per_row=sequences_per_row,
    )


def data_and_batches(
    config: TrainConfig,
    device: Any = None,
    precision: str | None = None,
    clip: Any = "resolve",
    compiled: bool = False,
) -> tuple[BatchPlan, Any, MicroBatchChoice]:
    """The batch plan, the data module checked against the data (packing included) and the
    micro-batch choice; ``device``: where the memory is read (default: this machine's CPU),
    ``precision``: the resolved one (default ``trainer.precision``), ``clip``: the resolved
    ``clip_grad_per_micro_batch`` (default: resolved here), ``compiled``: the model will be
    compiled (the speed probe says its timing was eager)."""
    acc = config.accelerator
    phase = config.phase
    requested = config.micro_batch_size
    first = batch_plan(
        phase.global_batch_size, acc.devices, acc.num_nodes, requested,
        config.eval_micro_batch_size,
    ) if requested is not None else None  # fmt: skip
    datamodule = config.data.build()  # the sizes come once the data's facts are known
    datamodule.check()
    world = acc.world_size
    check_enough_data(phase.global_batch_size, datamodule, world, requested)
    vocab = resolve_vocab_size(config.model.vocab_size, datamodule.vocab_size)
    if clip == "resolve":
        clip = resolve_clipping(config.clip_grad_per_micro_batch, config.optimizer)
    model = config.model.bert(vocab)
    shapes = {
        "input_ids": [1, datamodule.max_seq_length],
        "masked_lm_positions": [1, datamodule.predictions_per_pack],
        "nsp_labels": [1, datamodule.packing.sequences_per_row_max],
    }
    device = device if device is not None else torch.device("cpu")
    # fp8 sizes and times its micro batch as the bf16 autocast it runs in
    precision = lightning_precision(precision or config.trainer.precision)
    per_device = max(1, phase.global_batch_size // world)
    resumed = None if requested is not None else resumed_micro_batch(config)
    choice = choose_micro_batch(
        model,
        shapes,
        precision=precision,
        clip=clip,
        device=device,
        # compile-only reports what fits; a resumed run keeps its checkpoint's micro batch
        requested=None if config.compile_only else (requested or resumed),
        per_device=per_device,
        max_rows=max(1, datamodule.num_train_rows // world),
        packed=datamodule.packing.enabled,
        memory_fraction=config.memory_fraction,
        optimizer_ranks=acc.optimizer_ranks,
    )
    if requested is not None and config.compile_only:
        choice = dataclasses.replace(choice, size=requested, reason="set by micro_batch_size")
    elif resumed is not None and not config.compile_only:
        choice = dataclasses.replace(
            choice, reason=f"the micro batch of the checkpoint it resumes; {choice.reason}"
        )
    elif requested is None and not config.compile_only:
        rows = per_device  # rows a device runs per step: packed rows hold several sequences
        if datamodule.packing.enabled:
            rows = max(1, round(phase.global_batch_size / datamodule.sequences_per_row / world))
        choice = _fastest(config, choice, model, shapes, precision, device, rows, world,
                          compiled)  # fmt: skip
    batch = first or batch_plan(
        phase.global_batch_size, acc.devices, acc.num_nodes, choice.size,
        config.eval_micro_batch_size,
    )  # fmt: skip
    if datamodule.packing.enabled:  # the global batch counts sequences: fewer, fuller rows
        # a micro batch the user set (or the resumed checkpoint ran) is kept; one chosen here
        # for unpacked rows (at most the per-device batch) is only an upper bound: the step
        # holds global / sequences-per-row rows, not micro × devices rows of up to K sequences
        kept = requested or (None if config.compile_only else resumed)
        batch = packed_batch_plan(
            batch,
            datamodule.sequences_per_row,
            kept,
            max_micro_batch_size=None if kept is not None else batch.micro_batch_size,
        )
    datamodule.configure_batches(batch.micro_batch_size, batch.eval_micro_batch_size)
    return batch, datamodule, choice


def resumed_micro_batch(config: TrainConfig) -> int | None:
    """The micro batch (rows per micro-batch) of the checkpoint this run resumes, None for a
    fresh run or a checkpoint without a sampler position: a resumed run must keep it (its
    sampler position counts those rows), whatever a probe would choose today."""
    checkpoint_dir = str(Path(config.paths.checkpoint_dir).resolve())
    ckpt = resolve_ckpt_path(config.ckpt_path, checkpoint_dir)
    if ckpt is None:
        return None
    state = saved_sampler_state(ckpt)
    size = state.get("batch_size") if state else None
    return int(size) if isinstance(size, int) and size > 0 else None


def _fastest(
    config: TrainConfig,
    choice: MicroBatchChoice,
    model: Any,
    shapes: dict[str, list[int]],
    precision: str,
    device: Any,
    rows: int,
    world: int,
    compiled: bool,
) -> MicroBatchChoice:
    """The memory's choice narrowed by the speed probe (:mod:`omnibert.run.sizing.speed_probe`) to
    a divisor of the ``rows`` a device runs per step (so the step's rows stay what the
    recipe says), or kept with the reason the probe did not run."""
    why_not = (
        "micro_batch_probe=false" if not config.micro_batch_probe
        else f"{world} processes (the probe times one)" if world > 1
        else "the device's memory is unknown" if choice.bytes_per_row is None
        else None
    )  # fmt: skip
    if why_not is not None:
        return dataclasses.replace(choice, reason=f"{choice.reason} (not timed: {why_not})")
    candidates = candidate_sizes(min(choice.size, rows), rows, packed=False)
    if len(candidates) == 1:
        return choice
    probe = probe_micro_batch(
        model, shapes, precision=precision, device=device, candidates=candidates,
        compiled=compiled,
    )  # fmt: skip
    need = choice.bytes_at(probe.size)
    estimate = f" (estimate {_gib(need)})" if need is not None else ""
    return dataclasses.replace(
        choice,
        size=probe.size,
        reason=f"{probe.describe()}{estimate}, of sizes that fit: {choice.reason}",
        probe=probe.to_dict(),
    )


def check_enough_data(global_batch: int, datamodule: Any, world: int, micro: int | None) -> None:
    """One global batch of sequences must fit in the training set; otherwise name
    ``phase.global_batch_size`` with the largest value that works (a multiple of
    ``micro_batch_size × devices`` when the micro batch is set, else of the devices)."""
    sequences = int(datamodule.num_train_samples)
    if global_batch <= sequences:
        return
    unit = world * (micro or 1)
    largest = sequences // unit * unit
    where = getattr(datamodule.source, "train_path", None)
    origin = f"data.train_path={where}" if where else "the training set"
    fix = (
        f"set phase.global_batch_size={largest} (the largest that fits) or smaller"
        if largest
        else "use fewer devices or a smaller micro_batch_size"
    )
    raise TrainConfigError(
        f"{origin} holds {sequences:,} sequences, fewer than one global batch of "
        f"phase.global_batch_size={global_batch:,}; {fix}, or use more data (experiment="
        "quickstart is sized for a few MB of text)."
    )
