"""A pretraining run's data and batch plan: the data module, checked against the data
(shapes, vocab, packing), the global batch split over devices and accumulation, and the micro
batch: the one ``micro_batch_size`` sets, checked against memory, or the largest that fits
(:mod:`omnibert.run.memory`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from omnibert.config import TrainConfig
from omnibert.run.checks import resolve_clipping, resolve_vocab_size
from omnibert.run.memory import MicroBatchChoice, choose_micro_batch
from omnibert.run.plan import BatchPlan, TrainConfigError, batch_plan, packed_batch_plan

__all__ = ["check_enough_data", "data_and_batches"]


def data_and_batches(
    config: TrainConfig,
    device: Any = None,
    precision: str | None = None,
    clip: Any = "resolve",
) -> tuple[BatchPlan, Any, MicroBatchChoice]:
    """The batch plan, the data module checked against the data (packing included) and the
    micro-batch choice; ``device``: where the memory is read (default: this machine's CPU),
    ``precision``: the resolved one (default ``trainer.precision``), ``clip``: the resolved
    ``clip_grad_per_micro_batch`` (default: resolved here)."""
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
    choice = choose_micro_batch(
        config.model.bert(vocab),
        {
            "input_ids": [1, datamodule.max_seq_length],
            "masked_lm_positions": [1, datamodule.predictions_per_pack],
            "nsp_labels": [1, datamodule.packing.sequences_per_row_max],
        },
        precision=precision or config.trainer.precision,
        clip=clip,
        device=device if device is not None else torch.device("cpu"),
        requested=None if config.compile_only else requested,  # compile-only reports fits
        per_device=max(1, phase.global_batch_size // world),
        max_rows=max(1, datamodule.num_train_rows // world),
        packed=datamodule.packing.enabled,
        memory_fraction=config.memory_fraction,
    )
    if requested is not None and config.compile_only:
        choice = dataclasses.replace(choice, size=requested, reason="set by micro_batch_size")
    batch = first or batch_plan(
        phase.global_batch_size, acc.devices, acc.num_nodes, choice.size,
        config.eval_micro_batch_size,
    )  # fmt: skip
    if datamodule.packing.enabled:  # the global batch counts sequences: fewer, fuller rows
        # a micro batch the user set is kept; one chosen here for unpacked rows (at most the
        # per-device batch) is only an upper bound: the step holds global / sequences-per-row
        # rows, not micro × devices rows of up to K sequences each
        batch = packed_batch_plan(
            batch,
            datamodule.sequences_per_row,
            requested,
            max_micro_batch_size=None if requested is not None else batch.micro_batch_size,
        )
    datamodule.configure_batches(batch.micro_batch_size, batch.eval_micro_batch_size)
    return batch, datamodule, choice


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
