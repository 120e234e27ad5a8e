"""The derived training plan: what the run will do (:class:`TrainPlan`, from
:func:`plan_run`).

``omnibert-train`` never mutates its composed config; everything that follows from it (world
size, micro batches and gradient accumulation: :mod:`omnibert.run.pretraining.batches`;
validation cadence in batches, the checkpoint to resume from and what the resume changes, the
initial weights, where gradients are clipped: here and in
:mod:`omnibert.run.pretraining.checks`) is derived, checked, printed and saved with the run as
:class:`TrainPlan`. Every problem is one :class:`TrainConfigError` sentence naming the key and
the fix. :func:`run_settings` are the settings every checkpoint records for a resume
(:mod:`omnibert.checkpoints.resume_rules`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnibert.callbacks.nonfinite import NonFiniteAdvice
from omnibert.checkpoints.init_from import plan_pretraining_init
from omnibert.checkpoints.resume_rules import RunSettings, plan_resume
from omnibert.checkpoints.resuming import (
    auto_resume_reason,
    check_resume_target,
    refuse_another_run,
    resolve_ckpt_path,
)
from omnibert.checkpoints.space import checkpoint_bytes, plan_checkpoint_space
from omnibert.compat import load_checkpoint
from omnibert.config import TrainConfig, TrainConfigError
from omnibert.config.sections import next_sentence_objective, objective_name
from omnibert.run.pretraining.batches import BatchPlan
from omnibert.run.pretraining.checks import check_optimizer, describe_clipping
from omnibert.tasks.rng_states import missing_ranks_note

log = logging.getLogger("omnibert.train")


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
    #: the speed probe's measurements, when it chose the micro batch (run.sizing.speed_probe)
    micro_batch_probe: dict[str, Any] | None = None
    #: the host threads and OpenMP wait policy the accelerator set, and why (omnibert.threads)
    threads: str = ""
    #: which kernels the run uses: precision, attention, optimiser, compile (run.pipeline.kernels)
    kernels: dict[str, str] = dataclasses.field(default_factory=dict)
    #: the attention backend (model.config.attention; auto: its choice for this device)
    attention: str = ""
    #: checkpoint size × how many at once against the free space (checkpoints.space)
    checkpoint_space: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: where compiled code is kept, why there, warm or cold (run.pipeline.compile_cache)
    compile_cache: str = ""
    #: trainer.precision=fp8: recipe, emulation, torchao's version, the Linear layers in fp8
    #: and those kept in bf16 with why (accelerators.float8.Float8Plan; None: not fp8)
    float8: Any = None
    #: what this run changes from the checkpoint it resumes, applied (checkpoints.resume_rules)
    resume_changes: list[str] = dataclasses.field(default_factory=list)
    #: why ckpt_path was taken as auto (checkpoints.resuming.auto_resume_reason; None: not)
    resume_reason: str | None = None
    #: the architecture, vocab size resolved (a BertConfig; not in to_dict: model.config has it)
    model: Any = dataclasses.field(default=None, metadata={"internal": True})
    #: the initial weights, checked (checkpoints.init_from.PretrainingInit; init_from names them)
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
            *([("compile cache", self.compile_cache)] if self.compile_cache else []),
            *([("attention", self.attention)] if self.attention and not self.kernels else []),
            ("clipping", self.clipping),
            ("init from", self._init_description()),
            ("resume from", self._resume_from()),
            *self._resume_rows(),
            ("checkpoints", self.checkpoint_dir),
            *([("checkpoint space", self.checkpoint_space["description"])]
              if self.checkpoint_space else []),
        ]  # fmt: skip

    def _resume_from(self) -> str:
        """The checkpoint resumed (or a fresh run), and why when ``auto`` chose it."""
        if self.resume_reason is None:
            return self.ckpt_path or "fresh run"
        if self.ckpt_path is None:
            return f"fresh run ({self.resume_reason}: no last.ckpt yet)"
        return f"{self.ckpt_path} ({self.resume_reason}: this run's last checkpoint)"

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


def plan_run(
    config: TrainConfig,
    datamodule: Any,
    batch: BatchPlan,
    precision: str,
    micro_clip: float | None,
) -> TrainPlan:
    """Everything derived from the typed config and the (checked) data; ``precision``:
    ``trainer.precision`` resolved by the accelerator; ``micro_clip``: the resolved
    ``clip_grad_per_micro_batch``."""
    vocab_size = datamodule.vocab_size  # checked against model.config.vocab_size already
    model = config.model.bert(vocab_size)
    model_fields = dataclasses.asdict(model)
    phase = config.phase
    if phase.max_seq_length > model.max_position_embeddings:
        raise TrainConfigError(
            f"phase.max_seq_length={phase.max_seq_length} exceeds "
            f"model.config.max_position_embeddings={model.max_position_embeddings}; shorten "
            "the sequences or use a model with more positions."
        )
    checkpoint_dir = str(Path(config.paths.checkpoint_dir).resolve())
    ckpt = resolve_ckpt_path(config.ckpt_path, checkpoint_dir)
    init = None
    if ckpt is not None:
        check_resume_target(ckpt, model_fields)  # a resume takes its weights from it
    else:
        model_init, phase_init = config.model.init_from, phase.init_from
        if model_init is not None and phase_init is not None:
            raise TrainConfigError(
                f"both model.init_from={model_init} and phase.init_from={phase_init} are set; "
                "set the one you mean and the other to null."
            )
        init = plan_pretraining_init(
            model_init if model_init is not None else phase_init,
            config.model.bert_config,
            model_fields,
        )
    check_optimizer(config.optimizer, config.schedule, config.max_steps)
    changes = (
        []
        if ckpt is None
        else plan_resume(
            ckpt,
            run_settings(config, batch, precision, micro_clip),
            run_name=config.run_name,
            origins=config.composition.origins,
        )
    )  # what differs from the checkpoint: applied and shown, or refused in one sentence
    reason = auto_resume_reason(config.ckpt_path)
    refuse_another_run(ckpt, changes, reason, TrainConfigError)  # auto resumes this run only
    if ckpt is not None:  # an older checkpoint: the other ranks' RNG states are not in it
        note = missing_ranks_note(load_checkpoint(ckpt, mmap=True), batch.world_size)
        changes = [*changes, *([note] if note else [])]
    next_sentence = next_sentence_objective(model)
    if next_sentence and getattr(datamodule.source, "next_sentence", None) is False:
        log.warning(
            "the training rows are single segments without next-sentence pairs (prepared "
            "with next_sentence=false) but the model has a next-sentence head, which would "
            "only learn their constant label 0; set model.config.next_sentence_head=false "
            "(MLM only)."
        )
    if micro_clip is not None and precision.startswith("16"):
        raise TrainConfigError(
            f"clip_grad_per_micro_batch with trainer.precision={precision} would clip "
            "loss-scaled gradients; use bf16-mixed or 32-true."
        )
    clipping = describe_clipping(micro_clip, config.optimizer, config.trainer.gradient_clip_val)
    steps_per_epoch = datamodule.num_train_rows // batch.rows_per_step
    if steps_per_epoch < 1:
        fits = int(batch.global_batch_size * datamodule.num_train_rows / batch.rows_per_step)
        raise TrainConfigError(
            f"the training set has {datamodule.num_train_samples} sequences in "
            f"{datamodule.num_train_rows} rows, fewer than one global batch of "
            f"{batch.rows_per_step} rows (phase.global_batch_size={batch.global_batch_size}); "
            f"set phase.global_batch_size to about {fits} or less, or use more data."
        )
    if config.steps_per_epoch is not None:
        steps_per_epoch = min(steps_per_epoch, config.steps_per_epoch)
    every = config.val_every_n_steps
    if datamodule.num_eval_samples == 0:
        every = None
    if config.mlperf is not None:
        if datamodule.num_eval_samples == 0:
            raise TrainConfigError(
                "MLPerf mode (phase=mlperf) evaluates on the eval set; set data.eval_path."
            )
        every = None  # MLPerf evaluates at its own cadence (callbacks/mlperf.py)
    acc = batch.accumulate_grad_batches
    return TrainPlan(
        batch=batch,
        max_steps=config.max_steps,
        steps_per_epoch=steps_per_epoch,
        limit_train_batches=steps_per_epoch * acc,
        val_every_n_steps=every,
        val_check_interval=None if every is None else every * acc,
        vocab_size=vocab_size,
        init_from=None if init is None else init.path,
        init_bert_config=None if init is None else init.bert_config,
        ckpt_path=ckpt,
        resume_changes=changes,
        resume_reason=reason,
        checkpoint_dir=checkpoint_dir,
        clipping=clipping,
        clip_grad_per_micro_batch=micro_clip,
        precision=precision,
        data=datamodule.describe(),
        objective=objective_name(next_sentence),
        model=model,
        init=init,
    )


def checkpoint_space_of(config: TrainConfig, plan: TrainPlan, precision: str) -> dict[str, Any]:
    """A checkpoint's size × how many at once against the free space (refused when not even
    one fits: :mod:`omnibert.checkpoints.space`); empty without a checkpoint callback."""
    saving = config.checkpointing
    if saving is None:
        return {}
    each = checkpoint_bytes(plan.model.to_dict(), precision, config.optimizer)
    return plan_checkpoint_space(
        plan.checkpoint_dir, each, saving.keep_last, saving.every_n_train_steps, plan.max_steps
    )


def run_settings(
    config: TrainConfig, batch: BatchPlan, precision: str, micro_clip: float | None
) -> RunSettings:
    """The settings a resume compares with its checkpoint's, and every checkpoint records."""
    saving = config.checkpointing
    return RunSettings(
        optimizer=config.optimizer.plain(),
        schedule=None if config.schedule is None else config.schedule.plain(),
        total_steps=config.max_steps,
        global_batch_size=batch.global_batch_size,
        micro_batch_size=batch.micro_batch_size,
        world_size=batch.world_size,
        precision=precision,
        every_n_train_steps=None if saving is None else saving.every_n_train_steps,
        keep_last=None if saving is None else saving.keep_last,
        clip_grad_per_micro_batch=micro_clip,
    )


def nonfinite_advice(config: TrainConfig) -> NonFiniteAdvice:
    """The keys the non-finite stop's advice names: ``optimizer.lr``, the run's LR and the
    largest of the phase's recipe LRs (``phase.lr``; the suggestion's ceiling)."""
    recipe = [float(v) for v in config.phase.lr.values()]
    return NonFiniteAdvice(
        lr_key="optimizer.lr",
        lr=config.optimizer.lr,
        recipe_lr=max(recipe) if recipe else None,
        run_name=config.run_name,
    )
