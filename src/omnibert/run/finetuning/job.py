"""``omnibert-finetune``'s run on the shared pipeline (:mod:`omnibert.run.pipeline.stages`),
used by the app, ``omnibert-predict`` and the tests; the task node owns what differs between
tasks.

:func:`prepare`: the inputs, checked before compute
(:func:`~omnibert.run.finetuning.inputs.check_inputs`) → the accelerator plugin, the initial weights
(:func:`~omnibert.checkpoints.init_from.load_encoder_source`: an omnibert ``.ckpt``, a Hugging Face
directory or a TF1 prefix; the vocab comes from the checkpoint), the training features, the plan and
the data module. :func:`build`: the task (``task``'s ``_target_``) with the weights, the configured
callbacks and loggers, the Trainer from ``trainer``. :func:`fit`, then predictions on the eval
splits, the official metrics, the submission files and ``summary.json`` in the run directory
(:func:`run`, :func:`~omnibert.run.finetuning.outputs.evaluate_finetuned`).

How a task plugs in (reader, head, metric, submission writer): :mod:`omnibert.finetune.spec`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnibert import stopping
from omnibert.accelerators import build_plugin
from omnibert.accelerators.base import FP8, lightning_precision
from omnibert.accelerators.float8 import check_float8, convert_to_float8, plan_float8
from omnibert.accelerators.launchers import check_launch_layout
from omnibert.callbacks.nonfinite import NonFiniteAdvice, NonFiniteSteps
from omnibert.checkpoints.init_from import load_encoder_source
from omnibert.checkpoints.resume_rules import FINETUNING, RunRecord, RunSettings, plan_resume
from omnibert.checkpoints.resuming import (
    auto_resume_reason,
    check_resume_position,
    refuse_a_finished_run,
    refuse_another_run,
    resolve_ckpt_path,
)
from omnibert.checkpoints.space import module_checkpoint_bytes, plan_checkpoint_space
from omnibert.compat import seed_everything
from omnibert.config import FinetuneConfig
from omnibert.config.finetune import Recipe
from omnibert.data.finetuning import FineTuneDataModule, batches_taken
from omnibert.errors import is_rank_zero, quiet_other_ranks, set_process_rank
from omnibert.finetune.batching import TrimPadding
from omnibert.finetune.tokenizer import FineTuneInputError, build_tokenizer
from omnibert.reporting import write_curves
from omnibert.run.finetuning.inputs import FinetuneInputs, check_inputs
from omnibert.run.finetuning.outputs import evaluate_finetuned
from omnibert.run.pipeline.builders import (
    build_callbacks,
    build_loggers,
    build_trainer,
    quiet_third_party_deprecations,
)
from omnibert.run.pipeline.compile_cache import use_compile_cache
from omnibert.run.pipeline.kernels import optimizer_choice
from omnibert.run.pipeline.stages import Prepared, Run, fit_safely
from omnibert.run.pipeline.target_types import check_target_types

__all__ = [
    "FEW_STEPS",
    "FinetuneJob",
    "FinetunePlan",
    "build",
    "few_steps_notice",
    "fit",
    "prepare",
    "run",
]


@dataclass(frozen=True)
class FinetunePlan:
    """What a fine-tuning run derived (printed, logged with the config, in ``summary.json``)."""

    task: str
    data: dict[str, str]
    train_examples: int
    train_features: int
    steps_per_epoch: int
    epochs: int
    max_steps: int
    global_batch_size: int
    micro_batch_size: int
    accumulate_grad_batches: int
    init_from: str
    ckpt_path: str | None
    precision: str
    kernels: dict[str, str]
    #: trainer.precision=fp8's layers and recipe (accelerators.float8.Float8Plan; None: not fp8)
    float8: Any = None
    #: what this run changes from the checkpoint it resumes, applied (checkpoints.resume_rules)
    resume_changes: list[str] = dataclasses.field(default_factory=list)
    #: a checkpoint's size × how many at once against the free space (checkpoints.space)
    checkpoint_space: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: where compiled code is kept, why there, warm or cold (run.pipeline.compile_cache)
    compile_cache: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class FinetuneJob:
    """What only a fine-tuning run carries: its inputs, the checkpoint's vocab and tokenizer,
    the training features."""

    inputs: FinetuneInputs
    vocab_file: str
    tokenizer: Any
    train_tensors: dict[str, Any]


def prepare(cfg: FinetuneConfig | FinetuneInputs) -> Prepared:
    """The checked inputs (given, or :func:`check_inputs` of the config), then the
    checkpoint, the tokenizer, the training features, the plan and the data module (no
    training yet)."""
    quiet_third_party_deprecations()
    inputs = cfg if isinstance(cfg, FinetuneInputs) else check_inputs(cfg)
    config, recipe = inputs.config, inputs.recipe
    check_target_types(config.target_nodes(), config.composition.origins)
    compile_cache = use_compile_cache(config.paths.run_dir)  # before anything compiles
    plugin = build_plugin(config.accelerator.node.plain())
    launch = check_launch_layout(plugin.name, plugin.devices, plugin.num_nodes)
    set_process_rank(launch.rank)  # who speaks for the run (omnibert.errors.is_rank_zero)
    precision, why = plugin.resolve_precision(config.trainer.precision)
    torchao = check_float8(plugin, config.trainer.fp8.emulate) if precision == FP8 else None
    plugin.check_precision(lightning_precision(precision))
    if plugin.name == "ipu":
        raise FineTuneInputError(
            "omnibert-finetune does not run on accelerator=ipu yet; use cpu, gpu or hpu."
        )
    plugin.check_optimizer(config.optimizer)  # e.g. one zero1 or FSDP would not keep exact
    # CPU threads from the CPUs this process may use, as pretraining sets them
    plugin.configure_threads(config.data.num_workers)
    plugin.decide_compile(None, 0)  # compile=auto: no timed rate here, so eager (CPU)
    checkpoint_dir = Path(config.paths.checkpoint_dir)
    refuse_a_finished_run(checkpoint_dir, config.ckpt_path, FineTuneInputError)
    ckpt_path = resolve_ckpt_path(config.ckpt_path, checkpoint_dir)
    init_from = str(config.model.init_from)
    source = load_encoder_source(init_from, config.model.bert_config, recipe.settings)
    vocab = source.vocab_file
    if vocab is None or not Path(vocab).is_file():
        raise FineTuneInputError(
            f"model.init_from={init_from} has no vocab.txt beside it (or recorded in it); the "
            "vocab must come from the checkpoint: put its vocab.txt there."
        )
    if recipe.max_seq_length > source.config.max_position_embeddings:
        raise FineTuneInputError(
            f"task.max_seq_length={recipe.max_seq_length} exceeds the checkpoint's "
            f"max_position_embeddings={source.config.max_position_embeddings}; lower it."
        )
    tokenizer = build_tokenizer(vocab)
    feats = inputs.data.features(inputs.train, tokenizer, recipe.plain(), training=True)
    with torch.device("meta"):  # the task on the meta device: shapes only, no memory
        meta_task = config.task.build(_recursive_=False)(model_config=source.config.to_dict())
    float8 = None
    if torchao is not None:  # which of the task's layers run in fp8
        float8 = plan_float8(config.trainer.fp8, torchao, meta_task.model)
        why = f"{float8.describe()}; {why}"
    world = plugin.devices * plugin.num_nodes
    batches = math.ceil(len(feats) / (inputs.micro_batch_size * world))
    if "limit_train_batches" in config.trainer.node:  # Lightning's cut of each epoch
        batches = _limited(config.trainer.node["limit_train_batches"], batches)
    steps_per_epoch = math.ceil(batches / inputs.accumulate)
    plan = FinetunePlan(
        task=config.task_name,
        data=inputs.where,
        train_examples=len(inputs.train),
        train_features=len(feats),
        steps_per_epoch=steps_per_epoch,
        epochs=recipe.epochs,
        max_steps=steps_per_epoch * recipe.epochs,
        global_batch_size=recipe.batch_size,
        micro_batch_size=inputs.micro_batch_size,
        accumulate_grad_batches=inputs.accumulate,
        init_from=init_from,
        ckpt_path=ckpt_path,
        precision=precision,
        kernels={
            "precision": f"{precision} ({why})",
            "optimizer": optimizer_choice(config.optimizer, plugin.device, 0),
            "compile": "off (omnibert-finetune runs the model eagerly)",
        },
        float8=float8,
        compile_cache=compile_cache.describe(),
    )
    plan = dataclasses.replace(plan, checkpoint_space=_checkpoint_space(config, plan, meta_task))
    if ckpt_path is not None:  # what differs from the checkpoint: applied, or refused
        settings = _settings(config, plan, world)
        changes = plan_resume(
            ckpt_path,
            settings,
            FINETUNING,
            FineTuneInputError,
            config.run_name,
            config.composition.origins,
        )
        reason = auto_resume_reason(config.ckpt_path)
        refuse_another_run(ckpt_path, changes, reason, FineTuneInputError)
        plan = dataclasses.replace(plan, resume_changes=changes)
    datamodule = FineTuneDataModule(
        feats.tensors, inputs.micro_batch_size, config.seed, config.data.num_workers,
        TrimPadding.of(config.data),
    )  # fmt: skip
    if ckpt_path is not None:  # another micro batch, devices, data or seed: one sentence, now
        check_resume_position(ckpt_path, datamodule.train_batch_sampler(world_size=world))
    job = FinetuneJob(inputs, vocab, tokenizer, feats.tensors)
    return Prepared(config, plugin, plugin.environment(), plan, datamodule, source, job=job)


def _limited(limit: Any, batches: int) -> int:
    """The micro-batches per epoch under ``trainer.limit_train_batches=limit`` (the plan's
    steps, schedule and step count follow it); one sentence when it leaves none."""
    valid = not isinstance(limit, bool) and (
        (isinstance(limit, int) and limit >= 0) or (isinstance(limit, float) and 0 <= limit <= 1)
    )
    if not valid:
        raise FineTuneInputError(
            f"trainer.limit_train_batches={limit!r} must be a count of micro batches (an "
            "integer) or a share of each epoch in [0, 1]; fix trainer.limit_train_batches."
        )
    taken = batches_taken(limit, batches)
    if taken < 1:
        raise FineTuneInputError(
            f"trainer.limit_train_batches={limit!r} leaves no training batch of the {batches} "
            "an epoch holds; raise it or remove it."
        )
    return taken


def _checkpoint_space(config: FinetuneConfig, plan: FinetunePlan, task: Any) -> dict[str, Any]:
    """A checkpoint of the task (encoder and head) × how many at once against the free space,
    as pretraining's plan counts it (:mod:`omnibert.checkpoints.space`: refused when not even one
    fits); empty without a checkpoint callback."""
    saving = config.checkpointing
    if saving is None:
        return {}
    each = module_checkpoint_bytes(task, plan.precision, config.optimizer.plain())
    return plan_checkpoint_space(
        str(config.paths.checkpoint_dir), each, saving.keep_last, saving.every_n_train_steps,
        plan.max_steps,
    )  # fmt: skip


def _settings(config: FinetuneConfig, plan: FinetunePlan, world: int) -> RunSettings:
    """The settings a resume compares with its checkpoint's, and every checkpoint records."""
    saving = config.checkpointing
    return RunSettings(
        optimizer=config.optimizer.plain(),
        schedule=None if config.schedule is None else config.schedule.plain(),
        total_steps=plan.max_steps,
        global_batch_size=plan.global_batch_size,
        micro_batch_size=plan.micro_batch_size,
        world_size=world,
        precision=plan.precision,
        every_n_train_steps=None if saving is None else saving.every_n_train_steps,
        keep_last=None if saving is None else saving.keep_last,
    )


def build(prepared: Prepared, run_dir: Path) -> Run:
    """The task with the initial weights (the encoder and a fresh head, or a fine-tuned
    run's both), the configured callbacks and loggers, and the Trainer of ``trainer``."""
    config, plan, job = prepared.config, prepared.plan, prepared.job
    seed_everything(config.seed, workers=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    vocab_copy = run_dir / "vocab.txt"
    if is_rank_zero() and Path(job.vocab_file).resolve() != vocab_copy.resolve():
        shutil.copyfile(job.vocab_file, vocab_copy)  # the run's files: rank 0 writes them
    task = config.task.build(_recursive_=False)(
        model_config=dataclasses.asdict(prepared.init.config),
        optimizer=config.optimizer.plain(),
        schedule=None if config.schedule is None else config.schedule.plain(),
        total_steps=plan.max_steps,
        init_from=plan.init_from,
        vocab_file=str(vocab_copy.resolve()),
    )
    new = prepared.init.load_into(task)
    if plan.float8 is not None:  # trainer.precision=fp8: torchao's Float8Linear in place
        convert_to_float8(task.model, plan.float8)
    advice = NonFiniteAdvice(
        lr_key="task.lr", lr=job.inputs.recipe.lr, run_name=config.run_name
    )  # what the non-finite stop's advice names
    world = prepared.plugin.devices * prepared.plugin.num_nodes
    record = RunRecord(_settings(config, plan, world).record())
    callbacks = build_callbacks(config, float(plan.global_batch_size), [record], advice)
    loggers = build_loggers(
        config.logger, {"config": dict(config.composition.recorded), "plan": plan.to_dict()}
    )
    micro_batches = plan.steps_per_epoch * plan.accumulate_grad_batches  # per rank and epoch
    trainer = build_trainer(
        config, prepared.plugin, plan.precision, callbacks, loggers,
        max_steps=plan.max_steps,
        max_epochs=plan.epochs,
        accumulate_grad_batches=plan.accumulate_grad_batches,
        # at most the micro-batches of an epoch: Lightning warns about a longer interval
        log_every_n_steps=max(1, min(int(config.trainer.log_every_n_steps or 50), micro_batches)),
        limit_val_batches=0,
    )  # fmt: skip
    return Run(prepared, task, trainer, callbacks, prepared.init.description, new)


def fit(run: Run) -> dict[str, Any]:
    """Train; the training facts for the summary (the final checkpoint is the checkpoint
    callback's ``final.ckpt``)."""
    task, trainer = run.task, run.trainer
    if is_rank_zero():
        print(f"omnibert-finetune: initialised from {run.initialised_from}", flush=True)
        print(f"omnibert-finetune: new (freshly initialised) keys: {', '.join(run.new_keys)}")
    seconds = fit_safely(run, lambda step: f" after fine-tuning finished at step {step}")
    losses = task.losses()
    tenth = max(1, len(losses) // 10)
    final = Path(run.prepared.config.paths.checkpoint_dir) / "final.ckpt"
    nonfinite = next(cb for cb in run.callbacks if isinstance(cb, NonFiniteSteps))
    return {
        "steps": trainer.global_step,
        "fit_seconds": round(seconds, 3),
        "train_loss_first": sum(losses[:tenth]) / tenth if losses else None,
        "train_loss_last": sum(losses[-tenth:]) / tenth if losses else None,
        "new_keys": run.new_keys,
        "checkpoint": str(final) if final.is_file() else None,
        **nonfinite.summary(),
    }


#: a plan with fewer optimiser steps says so: the task's recipe (made for the full data
#: set) barely trains on a small one (27 questions at batch 32: 2 steps over 2 epochs)
FEW_STEPS = 10


def few_steps_notice(steps: int, recipe: Recipe, examples: int) -> str | None:
    """One line when the plan has fewer than :data:`FEW_STEPS` optimiser steps, else None."""
    if steps >= FEW_STEPS:
        return None
    return (
        f"omnibert-finetune: note: only {steps} optimiser step{'' if steps == 1 else 's'} "
        f"({examples} training examples, task.batch_size={recipe.batch_size}, "
        f"task.epochs={recipe.epochs}), too few to learn much; raise task.epochs or lower "
        "task.batch_size for more steps."
    )


def run(cfg: FinetuneConfig | FinetuneInputs) -> dict[str, Any]:
    """Prepare, fit, evaluate; ``summary.json`` and ``curves.png`` in the run directory;
    returns the summary. One voice (:mod:`omnibert.errors`): in a run of several processes
    rank 0 prints the plan, the progress and the summary, evaluates and writes the files;
    another rank trains its share, prints only its errors and returns ``{}``."""
    stopping.set_context(" before fine-tuning started")
    prepared = prepare(cfg)  # this process's rank is known from here on
    quiet_other_ranks()
    config, plan = prepared.config, prepared.plan
    inputs = prepared.job.inputs
    run_dir = Path(config.paths.run_dir)
    if is_rank_zero():
        _print_plan(prepared)
    built = build(prepared, run_dir)
    facts = fit(built)
    if not built.trainer.is_global_zero:
        return {}
    autocast = prepared.plugin.autocast(plan.precision)
    evaluated = evaluate_finetuned(inputs, prepared.job.tokenizer, built.task, autocast, run_dir)
    metric_values = evaluated["metrics"]
    data = inputs.data
    summary = {
        "task": config.task_name,
        "benchmark": data.benchmark,
        "task_label": data.label,
        "metric_names": list(data.metrics),
        "run_name": config.run_name,
        "seed": config.seed,
        "init_from": str(config.model.init_from),
        "train_examples": plan.train_examples,
        "train_features": plan.train_features,
        "eval_examples": sum(len(d) for d in inputs.evals.values()),
        **metric_values,
        "metrics": metric_values,
        "files": evaluated["files"],
        **facts,
        "plan": plan.to_dict(),
        "run_dir": str(run_dir),
    }
    curves = write_curves(  # the loss curve (and the final metrics) next to summary.json
        built.trainer.loggers,
        run_dir,
        f"omnibert-finetune {config.run_name}: {facts['steps']} steps",
        final={k: float(v) for k, v in metric_values.items() if isinstance(v, int | float)},
    )
    summary["curves"] = str(curves) if curves else None
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _print_plan(prepared: Prepared) -> None:
    """The plan's lines (rank 0's: one voice)."""
    config, plan = prepared.config, prepared.plan
    inputs = prepared.job.inputs
    print(
        f"omnibert-finetune: {config.task_name} from {config.model.init_from}: "
        f"{plan.train_examples} training examples -> {plan.train_features} "
        f"features, {plan.steps_per_epoch} steps/epoch x {plan.epochs} "
        f"epochs = {plan.max_steps} steps (batch {plan.global_batch_size}, "
        f"micro {plan.micro_batch_size}, accumulation {plan.accumulate_grad_batches})",
        flush=True,
    )
    notice = few_steps_notice(plan.max_steps, inputs.recipe, plan.train_examples)
    if notice:
        print(notice, flush=True)
    if plan.ckpt_path is not None:
        said = "; ".join(plan.resume_changes) or "none: the checkpoint's settings"
        print(f"omnibert-finetune: resume from {plan.ckpt_path}; changes: {said}", flush=True)
    kernels = "; ".join(f"{k} {v}" for k, v in plan.kernels.items())
    print(f"omnibert-finetune: kernels: {kernels}", flush=True)
    print(f"omnibert-finetune: compile cache: {plan.compile_cache}", flush=True)
    if plan.checkpoint_space:
        space = plan.checkpoint_space
        print(f"omnibert-finetune: checkpoint space: {space['description']}", flush=True)
        if space["warning"]:
            print(f"omnibert-finetune: warning: {space['warning']}", flush=True)
