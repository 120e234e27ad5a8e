"""A pretraining run's data and batch plan: the data module, checked against the data
(shapes, vocab, packing), the global batch split over devices and accumulation, and the micro
batch: the one ``micro_batch_size`` sets, checked against memory, or the largest that fits
(:mod:`omnibert.run.sizing.memory`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from omnibert.accelerators.base import lightning_precision
from omnibert.checkpoints.resuming import resolve_ckpt_path, saved_sampler_state
from omnibert.config import TrainConfig, TrainConfigError
from omnibert.run.checks import resolve_clipping, resolve_vocab_size
from omnibert.run.plan import BatchPlan, batch_plan, packed_batch_plan
from omnibert.run.sizing.memory import MicroBatchChoice, _gib, choose_micro_batch
from omnibert.run.sizing.speed_probe import candidate_sizes, probe_micro_batch

__all__ = ["check_enough_data", "data_and_batches", "resumed_micro_batch"]


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
    vocab = resolve_vocab_size(config.model.fields, datamodule.vocab_size)
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
