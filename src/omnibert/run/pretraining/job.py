"""``omnibert-train``'s run on the shared pipeline (:mod:`omnibert.run.pipeline.stages`), used
by the app and by every test that builds a run.

:func:`prepare`: the typed config (ranges checked) → the accelerator plugin (SDK checked) and the
SLURM layout → the data and the batch plan (:mod:`omnibert.run.pretraining.batches`) → everything
else derived and checked once (vocab size, resume target, initial weights, optimiser and schedule,
clipping, attention, kernels, profiling); no compute yet. :func:`build`: the task (``task``'s
``_target_``) with its initial weights, callbacks, loggers and the Trainer. :func:`fit`: trains,
validates on the whole eval set and returns the summary.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch

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
from omnibert.callbacks.nonfinite import NonFiniteSteps
from omnibert.checkpoints.init_from import with_checkpoint_architecture
from omnibert.checkpoints.resume_rules import RunRecord
from omnibert.checkpoints.resuming import (
    check_resume_position,
    remove_stale_temporaries,
)
from omnibert.compat import seed_everything
from omnibert.config import TrainConfig
from omnibert.config.sections import objective_name
from omnibert.errors import set_process_rank
from omnibert.models import BertForPreTraining
from omnibert.models.attention_choice import plan_attention, resolve_attention
from omnibert.paths import check_writable_dir
from omnibert.run.launching.profiling import check_profile, profiler_for_run
from omnibert.run.launching.slurm import check_slurm_layout
from omnibert.run.pipeline.builders import (
    build_callbacks,
    build_loggers,
    build_trainer,
    quiet_third_party_deprecations,
)
from omnibert.run.pipeline.compile_cache import use_compile_cache
from omnibert.run.pipeline.kernels import kernel_choices
from omnibert.run.pipeline.stages import Prepared, Run, fit_safely
from omnibert.run.pipeline.target_types import check_target_types
from omnibert.run.pretraining.batches import data_and_batches
from omnibert.run.pretraining.checks import resolve_clipping
from omnibert.run.pretraining.plan import (
    checkpoint_space_of,
    nonfinite_advice,
    plan_run,
    run_settings,
)

__all__ = [
    "build",
    "build_task",
    "check_data",
    "fit",
    "logged_hyperparameters",
    "majority_baselines",
    "prepare",
]

log = logging.getLogger("omnibert.train")


def prepare(config: TrainConfig) -> Prepared:
    """Derive and check everything before compute (module docstring); builds no model.
    ``config``: the typed config the app built (``TrainConfig.of`` of the composed one)."""
    quiet_third_party_deprecations()
    # model.init_from=<Hugging Face dir>: the architecture its config.json states
    config = with_checkpoint_architecture(config)
    check_target_types(
        config.target_nodes(), config.composition.origins
    )  # trainer.max_epochs=abc: before anything builds
    for key, path in config.paths.writable_keys().items():  # before any data is read
        check_writable_dir(path, key)
    compile_cache = use_compile_cache(config.paths.run_dir)  # before anything compiles
    plugin = build_plugin(config.accelerator.node.plain())
    environment = plugin.environment()
    check_slurm_layout(plugin.name, plugin.devices, plugin.num_nodes)
    launch = check_launch_layout(plugin.name, plugin.devices, plugin.num_nodes)
    set_process_rank(launch.rank)  # who speaks for the run (omnibert.errors.is_rank_zero)
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
    layers = config.model.num_hidden_layers
    plugin.decide_compile(rows / rate if rate else None, layers)
    plan = plan_run(config, datamodule, batch, precision, clip)
    plugin.check_accumulation(plan.batch.accumulate_grad_batches)
    configured = config.model.attention
    device_type = {"gpu": "cuda"}.get(plugin.name, plugin.name)
    dropout = config.model.attention_dropout
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
        kernels=kernels, checkpoint_space=checkpoint_space_of(config, plan, precision),
        compile_cache=compile_cache.describe(),
    )  # fmt: skip
    if plan.ckpt_path is not None and plugin.samples_as_planned:
        sampler = datamodule.train_batch_sampler(world_size=plan.batch.world_size)
        check_resume_position(plan.ckpt_path, sampler)  # another batch: one sentence, now
    return Prepared(
        config, plugin, environment, plan, datamodule, plan.init, profile=check_profile(config)
    )


def check_data(config: TrainConfig) -> None:
    """The config's data fits it (shapes, batch arithmetic): what a later phase of a
    multi-phase run checks before the first one trains."""
    data_and_batches(config)  # the memory of this machine's CPU: the data is what is checked


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
        submission=dataclasses.asdict(mlperf.submission),
        hyperparameters=mlperf_hyperparameters(config, plan.batch.accumulate_grad_batches),
        eval_samples=prepared.datamodule.num_eval_samples,
    )


def logged_hyperparameters(prepared: Prepared) -> dict[str, Any]:
    """What the loggers record as the run's hyper-parameters."""
    return {
        "config": dict(prepared.config.composition.recorded),
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
    loggers = build_loggers(config.logger, logged_hyperparameters(prepared))
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
