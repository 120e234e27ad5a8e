"""The derived training plan: batch arithmetic and what the run will do.

``omnibert-train`` never mutates its composed config; everything that follows from it (world
size, micro batches, gradient accumulation, validation cadence in batches, the checkpoint to
resume from, where gradients are clipped) is derived (here and in :mod:`omnibert.run.checks`),
checked, printed and saved with the run as :class:`TrainPlan`. Every problem is one
:class:`TrainConfigError` sentence naming the key and the fix.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from omnibert.config import TrainConfigError


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
    init_bert_config: str | None  # the bert_config.json of a TensorFlow 1 init_from
    ckpt_path: str | None
    checkpoint_dir: str
    clipping: str
    clip_grad_per_micro_batch: float | None
    precision: str
    data: dict[str, Any]
    #: what the model learns: "MLM + next-sentence" (BERT) or "MLM only" (no NSP head)
    objective: str = ""
    #: how the micro batch was chosen (omnibert.run.sizing.memory)
    micro_batch_choice: str = ""
    #: the speed probe's measurements, when it chose the micro batch (run.speed_probe)
    micro_batch_probe: dict[str, Any] | None = None
    #: the host threads and OpenMP wait policy the accelerator set, and why (omnibert.threads)
    threads: str = ""
    #: which kernels the run uses: precision, attention, optimiser, compile, ... (run.kernels)
    kernels: dict[str, str] = dataclasses.field(default_factory=dict)
    #: the attention backend (model.config.attention; auto: its choice for this device)
    attention: str = ""
    #: checkpoint size × how many at once against the free space (run.checkpoint_space)
    checkpoint_space: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: trainer.precision=fp8: recipe, emulation, torchao's version, the Linear layers in fp8
    #: and those kept in bf16 with why (accelerators.float8.Float8Plan; None: not fp8)
    float8: Any = None
    #: what this run changes from the checkpoint it resumes, applied (run.resume)
    resume_changes: list[str] = dataclasses.field(default_factory=list)
    #: the architecture, vocab size resolved (a BertConfig; not in to_dict: model.config has it)
    model: Any = dataclasses.field(default=None, metadata={"internal": True})
    #: the initial weights, checked (run.init_from.PretrainingInit; init_from names them)
    init: Any = dataclasses.field(default=None, metadata={"internal": True})

    def to_dict(self) -> dict[str, Any]:
        out = {
            f.name: dataclasses.asdict(getattr(self, f.name))
            if dataclasses.is_dataclass(getattr(self, f.name))
            else copy.deepcopy(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if not f.metadata.get("internal")
        }
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
            *([("micro batch choice", self.micro_batch_choice)] if self.micro_batch_choice else []),
            ("accumulation", f"{b.accumulate_grad_batches} micro-batches per step"),
            ("steps", f"{self.max_steps} ({self.steps_per_epoch} per pass over the data)"),
            ("train samples", f"{self.data.get('train_samples')}"),
            ("eval samples", f"{self.data.get('eval_samples')}"),
            ("validation", val),
            *([("objective", self.objective)] if self.objective else []),
            ("vocab size", f"{self.vocab_size}"),
            *([("CPU threads", self.threads)] if self.threads else []),
            *(list(self.kernels.items()) if self.kernels else [("precision", self.precision)]),
            *([("attention", self.attention)] if self.attention and not self.kernels else []),
            ("clipping", self.clipping),
            ("init from", self._init_description()),
            ("resume from", self.ckpt_path or "fresh run"),
            *self._resume_rows(),
            ("checkpoints", self.checkpoint_dir),
            *([("checkpoint space", self.checkpoint_space["description"])]
              if self.checkpoint_space else []),
        ]  # fmt: skip

    def _resume_rows(self) -> list[tuple[str, str]]:
        """Each change from the resumed checkpoint on a line of its own."""
        if self.ckpt_path is None:
            return []
        if not self.resume_changes:
            return [("resume changes", "none: the checkpoint's settings")]
        return [("resume changes" if i == 0 else "", line)
                for i, line in enumerate(self.resume_changes)]  # fmt: skip

    def _init_description(self) -> str:
        if self.init_from is None:
            return "random init"
        if getattr(self.init, "kind", None) == "huggingface" and self.model is not None:
            m = self.model
            family = "BERT" if m.is_bert else "ModernBERT"
            return (
                f"{self.init_from} (Hugging Face; the architecture is its config.json's: "
                f"{family} L{m.num_hidden_layers}-H{m.hidden_size}-A{m.num_attention_heads}, "
                f"intermediate {m.intermediate_size})"
            )
        if self.init_bert_config is None:
            return self.init_from
        return f"{self.init_from} (TensorFlow 1, {self.init_bert_config})"

    def table(self) -> str:
        width = max(len(k) for k, _ in self.rows())
        return "\n".join(f"  {k:<{width}}  {v}" for k, v in self.rows())
