"""``omnibert-train``'s run on the shared pipeline (:mod:`omnibert.run.pipeline.stages`), used by
the app and by every test that builds a run.

:func:`prepare`: the typed config (ranges checked) → the accelerator plugin (SDK checked) and
the SLURM layout → the data and the batch plan (:mod:`omnibert.run.batches`) → everything
else derived and checked once (vocab size, resume target, initial weights, optimiser and
schedule, clipping, attention, kernels, profiling); no compute yet. :func:`build`: the task
(``task``'s ``_target_``) with its initial weights, callbacks, loggers and the Trainer.
:func:`fit`: trains, validates on the whole eval set and returns the summary.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from omnibert.accelerators import build_plugin
from omnibert.accelerators.base import FP8, lightning_precision
from omnibert.accelerators.float8 import check_float8, convert_to_float8, plan_float8
from omnibert.accelerators.launchers import check_launch_layout
from omnibert.callbacks import PretrainingThroughput
from omnibert.callbacks.mlperf import (
    MLPerfCompliance,
    eval_interval_samples,
    mlperf_hyperparameters,
)
from omnibert.callbacks.nonfinite import NonFiniteAdvice, NonFiniteSteps
from omnibert.checkpoints.init_from import plan_pretraining_init, with_checkpoint_architecture
from omnibert.checkpoints.resume_rules import RunRecord, RunSettings, plan_resume
from omnibert.checkpoints.resuming import (
    check_resume_position,
    check_resume_target,
    remove_stale_temporaries,
    resolve_ckpt_path,
)
from omnibert.checkpoints.space import checkpoint_bytes, plan_checkpoint_space
from omnibert.compat import seed_everything
from omnibert.config import TrainConfig, TrainConfigError
from omnibert.config.sections import next_sentence_objective, objective_name
from omnibert.models import BertForPreTraining
from omnibert.models.attention import plan_attention, resolve_attention
from omnibert.paths import check_writable_dir
from omnibert.run.batches import check_enough_data, data_and_batches
from omnibert.run.checks import check_optimizer, describe_clipping, resolve_clipping
from omnibert.run.launching.profiling import check_profile, profiler_for_run
from omnibert.run.launching.slurm import check_slurm_layout
from omnibert.run.pipeline.builders import (
    build_callbacks,
    build_loggers,
    build_trainer,
    quiet_third_party_deprecations,
)
from omnibert.run.pipeline.kernels import kernel_choices
from omnibert.run.pipeline.stages import Prepared, Run, fit_safely
from omnibert.run.pipeline.target_types import check_target_types
from omnibert.run.plan import BatchPlan, TrainPlan

__all__ = [
    "build",
    "build_task",
    "check_data",
    "check_enough_data",
    "facts",
    "fit",
    "majority_baselines",
    "plan_run",
    "prepare",
    "typed",
]

log = logging.getLogger("omnibert.train")


def typed(cfg: DictConfig | TrainConfig) -> TrainConfig:
    """The run's typed config (the app builds it; tests may pass the composed config)."""
    return cfg if isinstance(cfg, TrainConfig) else TrainConfig.of(cfg)


def prepare(cfg: DictConfig | TrainConfig) -> Prepared:
    """Derive and check everything before compute (module docstring); builds no model."""
    quiet_third_party_deprecations()
    # model.init_from=<Hugging Face dir>: the architecture its config.json states
    config = with_checkpoint_architecture(typed(cfg))
    check_target_types(
        config.target_nodes(), config.origins
    )  # trainer.max_epochs=abc: before anything builds
    for key, path in config.paths.writable_keys().items():  # before any data is read
        check_writable_dir(path, key)
    plugin = build_plugin(config.accelerator.node.plain())
    environment = plugin.environment()
    check_slurm_layout(plugin.name, plugin.devices, plugin.num_nodes)
    check_launch_layout(plugin.name, plugin.devices, plugin.num_nodes)
    plugin.check_optimizer(config.optimizer)  # an optimiser this backend cannot run
    precision, why = plugin.resolve_precision(config.trainer.precision)
    # fp8: the device and torchao checked now (one sentence, exit 2); it trains in bf16-mixed
    torchao = check_float8(plugin, config.trainer.fp8.emulate) if precision == FP8 else None
    plugin.check_precision(lightning_precision(precision))
    clip = resolve_clipping(config.clip_grad_per_micro_batch, config.optimizer)
    workers = int(config.data.get("num_workers") or 0)
    plugin.configure_threads(workers)  # before the speed probe times the model with them
    compiled = bool(getattr(plugin, "compile", False))
    batch, datamodule, choice = data_and_batches(
        config, plugin.device, lightning_precision(precision), clip, compiled
    )
    # again with the rows per second the probe measured: what the loader workers must feed
    rate = dict(choice.probe["rates"]).get(choice.size) if choice.probe else None
    threads = plugin.configure_threads(int(getattr(datamodule, "num_workers", 0) or 0), rate)
    # accelerator.compile=auto (CPU): compile where the run is long enough to pay
    rows = int(config.trainer.max_steps) * batch.rows_per_step / max(1, batch.world_size)
    layers = int(config.model.fields.get("num_hidden_layers") or 1)
    plugin.decide_compile(rows / rate if rate else None, layers)
    plan = plan_run(config, datamodule, batch, precision, clip)
    plugin.check_accumulation(plan.batch.accumulate_grad_batches)
    configured = str(config.model.fields.get("attention", "auto"))
    device_type = {"gpu": "cuda"}.get(plugin.name, plugin.name)
    dropout = float(config.model.fields["attention_probs_dropout_prob"])
    attention = plan_attention(  # raises BertConfigError, a UserError: one sentence, exit 2
        configured, device_type, dropout, config.phase.max_seq_length, config.model.head_size
    )
    plugin.check_attention(configured, tuple(
        resolve_attention(configured, device_type, active, config.phase.max_seq_length)
        for active in (dropout > 0.0, False)  # training, evaluation
    ))  # fmt: skip
    float8 = None
    if torchao is not None:  # which Linear layers run in fp8 (names and shapes: meta device)
        with torch.device("meta"):
            float8 = plan_float8(config.trainer.fp8, torchao, BertForPreTraining(plan.model))
        why = f"{float8.describe()}; {why}"
    kernels = kernel_choices(plugin, plan.model.to_dict(), config.optimizer, precision, why)
    kernels["attention"] = attention  # the backend the model runs (models.attention)
    plan = dataclasses.replace(
        plan, micro_batch_choice=choice.reason, micro_batch_probe=choice.probe,
        threads=threads, attention=attention, float8=float8,
        kernels=kernels, checkpoint_space=_checkpoint_space(config, plan, precision),
    )  # fmt: skip
    if plan.ckpt_path is not None and plugin.samples_as_planned:
        sampler = datamodule.train_batch_sampler(world_size=plan.batch.world_size)
        check_resume_position(plan.ckpt_path, sampler)  # another batch: one sentence, now
    return Prepared(
        config, plugin, environment, plan, datamodule, plan.init, profile=check_profile(config)
    )


def _checkpoint_space(config: TrainConfig, plan: TrainPlan, precision: str) -> dict[str, Any]:
    """A checkpoint's size × how many at once against the free space (refused when not even
    one fits: :mod:`omnibert.checkpoints.space`); empty without a checkpoint callback."""
    saving = config.checkpointing
    if saving is None:
        return {}
    each = checkpoint_bytes(plan.model.to_dict(), precision, config.optimizer)
    return plan_checkpoint_space(
        plan.checkpoint_dir, each, saving.keep_last, saving.every_n_train_steps, plan.max_steps
    )


def check_data(cfg: DictConfig | TrainConfig) -> None:
    """The config resolves and its data fits it (shapes, batch arithmetic): what a later
    phase of a multi-phase run checks before the first one trains."""
    data_and_batches(typed(cfg))  # the memory of this machine's CPU: the data is what is checked


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
            origins=config.origins,
        )
    )  # what differs from the checkpoint: applied and shown, or refused in one sentence
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
        checkpoint_dir=checkpoint_dir,
        clipping=clipping,
        clip_grad_per_micro_batch=micro_clip,
        precision=precision,
        data=datamodule.describe(),
        objective=objective_name(next_sentence),
        model=model,
        init=init,
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
    lr = config.optimizer.get("lr")
    recipe = [float(v) for v in config.phase.lr.values()]
    return NonFiniteAdvice(
        lr_key="optimizer.lr",
        lr=float(lr) if isinstance(lr, int | float) else None,
        recipe_lr=max(recipe) if recipe else None,
        run_name=config.run_name,
    )


def build_task(prepared: Prepared) -> tuple[Any, str | None]:
    """The task (``task``'s ``_target_``) with what the run derived and its initial weights,
    and a description of them (``None`` for random init or a resume)."""
    config, plan = prepared.config, prepared.plan
    task = config.task.build()(
        model_config=plan.model.to_dict(),
        optimizer=config.optimizer.plain(),
        schedule=None if config.schedule is None else config.schedule.plain(),
        total_steps=plan.max_steps,
        init_from=plan.init_from,
        init_bert_config=plan.init_bert_config,
        vocab_file=prepared.datamodule.vocab_file,
        clip_grad_per_micro_batch=plan.clip_grad_per_micro_batch,
        do_lower_case=prepared.datamodule.do_lower_case,
    )
    loaded = prepared.init.load_into(task.model) if prepared.init is not None else None
    return task, loaded


def _mlperf_callback(prepared: Prepared, run_dir: Path) -> Any:
    """MLPerf mode's cadence, stop-at-target and compliance log, or None when it is off."""
    config, plan = prepared.config, prepared.plan
    mlperf = config.mlperf
    if mlperf is None:
        return None
    every = mlperf.eval_every_samples or eval_interval_samples(plan.batch.global_batch_size)
    return MLPerfCompliance(
        run_dir / mlperf.log_file,
        target_accuracy=mlperf.target_accuracy,
        eval_every_samples=every,
        max_samples=mlperf.max_samples,
        submission=dict(mlperf.submission),
        hyperparameters=mlperf_hyperparameters(config, plan.batch.accumulate_grad_batches),
        eval_samples=prepared.datamodule.num_eval_samples,
    )


def facts(prepared: Prepared) -> dict[str, Any]:
    """What the loggers record as the run's hyper-parameters."""
    return {
        "config": dict(prepared.config.raw),
        "plan": prepared.plan.to_dict(),
        "environment": prepared.environment,
    }


def build(prepared: Prepared, output_dir: Path | None = None) -> Run:
    """The task (:func:`build_task`), callbacks, loggers and the Trainer."""
    config, plugin, plan = prepared.config, prepared.plugin, prepared.plan
    run_dir = output_dir if output_dir is not None else Path(config.paths.run_dir)
    for name in remove_stale_temporaries(plan.checkpoint_dir):
        log.warning("removed %s, a checkpoint a killed process had not finished writing", name)
    seed_everything(config.seed, workers=False)
    mlperf = _mlperf_callback(prepared, run_dir)  # logs init_start before the model
    task, loaded = build_task(prepared)
    record = run_settings(config, plan.batch, plan.precision, plan.clip_grad_per_micro_batch)
    extra = [RunRecord(record.record()), *([mlperf] if mlperf else [])]
    callbacks = build_callbacks(
        config, plan.batch.sequences_per_step, extra, nonfinite_advice(config)
    )
    loggers = build_loggers(config.loggers, facts(prepared))
    if plan.float8 is not None:  # trainer.precision=fp8: the swap before torch.compile
        convert_to_float8(task.model, plan.float8)
    plugin.compile_model(task.model)
    callbacks += plugin.callbacks()  # e.g. the CUDA graph step marker
    # the plugin's view of the loop counts (IPU: device-side accumulation)
    loop = plugin.loop_kwargs(
        plan.batch.accumulate_grad_batches,
        plan.limit_train_batches,
        plan.val_check_interval,
        plan.max_steps,
    )
    if loop["val_check_interval"] is None:
        loop["val_check_interval"] = (loop["max_steps"] + 1) * loop["accumulate_grad_batches"]
    if prepared.profile is not None:  # profile=true: torch.profiler traces in <output dir>
        loop["profiler"] = profiler_for_run(prepared.profile, run_dir / "profile", plugin.name)
    trainer = build_trainer(config, plugin, plan.precision, callbacks, loggers, **loop)
    return Run(prepared, task, trainer, callbacks, loaded)


def majority_baselines(
    validation: dict[str, float] | None, next_sentence: bool = True
) -> dict[str, float | None]:
    """``mlm_majority_baseline`` / ``nsp_majority_baseline``: the accuracy of always
    predicting the eval set's most frequent masked token / NSP label (what an accuracy is
    to be compared with; None without validation; no NSP one for an MLM-only model)."""
    val = validation or {}
    out = {"mlm_majority_baseline": val.get("val/mlm_majority_baseline")}
    if next_sentence:
        out["nsp_majority_baseline"] = val.get("val/nsp_majority_baseline")
    return out


def fit(run: Run) -> dict[str, Any]:
    """Train, validate on the whole eval set at the end, return the summary."""
    prepared, task, trainer = run.prepared, run.task, run.trainer
    plan = prepared.plan
    last_ckpt = Path(plan.checkpoint_dir) / "last.ckpt"

    def finished(step: int) -> str:
        held = f" ({last_ckpt} holds it)" if last_ckpt.is_file() else ""
        return f" after training finished at step {step}{held}"

    def validate_at_the_end() -> None:
        last = task.last_validation
        if plan.data.get("eval_samples") and (last is None or last["step"] != trainer.global_step):
            trainer.validate(task, datamodule=prepared.datamodule, verbose=False)

    seconds = fit_safely(run, finished, validate_at_the_end)
    throughput = next((cb for cb in run.callbacks if isinstance(cb, PretrainingThroughput)), None)
    mlperf = next((cb for cb in run.callbacks if isinstance(cb, MLPerfCompliance)), None)
    nonfinite = next(cb for cb in run.callbacks if isinstance(cb, NonFiniteSteps))
    return {
        "run_name": prepared.config.run_name,
        "steps": trainer.global_step,
        "fit_seconds": round(seconds, 3),
        "objective": objective_name(task.next_sentence),
        "validation": task.last_validation,
        **majority_baselines(task.last_validation, task.next_sentence),
        "throughput": throughput.summary() if throughput is not None else {},
        **nonfinite.summary(),
        **({"mlperf": mlperf.summary()} if mlperf is not None else {}),
        "checkpoint_dir": plan.checkpoint_dir,
        "last_checkpoint": str(last_ckpt) if last_ckpt.is_file() else None,
        "plan": plan.to_dict(),
    }
