"""The wiring of a training run, shared by ``omnibert-train`` and every test that builds a run.

In this order: resolve and range-check the config → the accelerator plugin (SDK checked) and
the SLURM layout → the batch plan → the data module, checked → everything else derived and
checked (vocab size, resume target, initial weights, optimiser and schedule, clipping,
profiling) = :func:`prepare`, no compute yet; then the task (``cfg.task``'s ``_target_``),
callbacks, loggers and the Trainer = :func:`build`; then :func:`fit` trains, validates on the
whole eval set and returns the summary. The composed config is never modified.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from omnibert.compat import seed_everything
from omnibert.errors import UserError
from omnibert.paths import check_writable_dir
from omnibert.run.checks import (
    RESUME_FILE,
    check_init_from,
    check_optimizer,
    check_resume_position,
    check_resume_target,
    describe_clipping,
    instantiate_node,
    remove_stale_temporaries,
    resolve_ckpt_path,
    resolve_clipping,
    resolve_config,
    resolve_vocab_size,
    tf1_bert_config,
)
from omnibert.run.kernels import kernel_choices
from omnibert.run.plan import (
    BatchPlan,
    TrainConfigError,
    TrainPlan,
    batch_plan,
    packed_batch_plan,
)

__all__ = [
    "Prepared",
    "Run",
    "build",
    "build_task",
    "check_data",
    "fit",
    "loggers_for",
    "prepare",
    "resolve",
]

log = logging.getLogger("omnibert.train")


def resolve(cfg: DictConfig) -> dict[str, Any]:
    """The training config as plain containers, interpolations resolved, ranges checked;
    every problem is one sentence naming the key."""
    from omnibert.schema import validate

    c = resolve_config(
        cfg, "e.g. omnibert-train data.train_path=<dir> data.eval_path=<dir> (or experiment=demo)"
    )
    validate(cfg)
    task = c.get("task") or {}
    if task.get("data") is not None:  # conf/task/squad.yaml, mrpc.yaml, the GLUE tasks
        raise TrainConfigError(
            f"task={task.get('name')} is a fine-tuning task; run omnibert-finetune "
            f"task={task.get('name')} (omnibert-train pretrains: task=pretraining)."
        )
    return c


@dataclass
class Prepared:
    """Everything derived and checked before compute (``prepare``)."""

    cfg: DictConfig
    c: dict[str, Any]
    plugin: Any
    environment: dict[str, Any]
    datamodule: Any
    plan: TrainPlan
    profile: Any = None


@dataclass
class Run:
    """A built run: the prepared plan plus the task, callbacks, loggers and Trainer."""

    prepared: Prepared
    task: Any
    trainer: Any
    callbacks: list[Any] = field(default_factory=list)
    initialised_from: str | None = None


def _plugin(cfg: DictConfig) -> tuple[Any, dict[str, Any]]:
    """The accelerator plugin (its SDK checked before any compute) and the environment
    report."""
    from omnibert.accelerators import build_plugin

    plugin = build_plugin(cfg.accelerator)
    return plugin, plugin.environment()


def quiet_third_party_deprecations() -> None:
    """Silence two deprecation warnings every run printed that come from third-party code
    calling torch's deprecated APIs, not from omnibert (matched by message and by the
    module the warning is attributed to, nothing else): torchdata's ``StatefulDataLoader``
    calls ``torch.set_vital`` (torchdata 0.11), Lightning's ``_pytree`` builds a
    ``LeafSpec`` (Lightning 2.5 with torch >= 2.10). And each Lightning log line once
    (:func:`omnibert.logs.single_lightning_output`)."""
    from omnibert.logs import single_lightning_output

    single_lightning_output()
    warnings.filterwarnings(
        "ignore", message=r"'set_vital' is deprecated", category=UserWarning,
        module=r"torchdata\.stateful_dataloader",
    )  # fmt: skip
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning, module=r"lightning\.pytorch\.utilities\._pytree",
    )  # fmt: skip


def prepare(cfg: DictConfig) -> Prepared:
    """Derive and check everything before compute (module docstring); builds no model."""
    quiet_third_party_deprecations()
    from omnibert.run.profiling import check_profile
    from omnibert.run.slurm import check_slurm_layout
    from omnibert.run.target_types import check_target_types

    c = resolve(cfg)
    check_target_types(c)  # trainer.max_epochs=abc: named before anything is built
    for name in ("output_root", "checkpoint_dir", "log_dir"):  # before any data is read
        if c["paths"].get(name) is not None:
            check_writable_dir(c["paths"][name], f"paths.{name}")
    plugin, environment = _plugin(cfg)
    check_slurm_layout(plugin.name, plugin.devices, plugin.num_nodes)
    plugin.check_optimizer(c["optimizer"])  # an optimiser this backend cannot run
    precision, why = plugin.resolve_precision(c["trainer"].get("precision"))
    plugin.check_precision(precision)
    batch, datamodule, choice = _batch_and_data(cfg, c, plugin.device, precision)
    threads = plugin.configure_threads(int(getattr(datamodule, "num_workers", 0) or 0))
    plan = plan_run(c, datamodule, batch, precision)
    plugin.check_accumulation(plan.batch.accumulate_grad_batches)
    model_config = {**c["model"]["config"], "vocab_size": plan.vocab_size}
    attention = _plan_attention(c, plugin.name)
    kernels = kernel_choices(plugin, model_config, c["optimizer"], precision, why)
    kernels["attention"] = attention  # the backend the model runs (models.attention)
    plan = dataclasses.replace(
        plan, micro_batch_choice=choice.reason, threads=threads, attention=attention,
        kernels=kernels,
    )  # fmt: skip
    if plan.ckpt_path is not None and plugin.samples_as_planned:
        sampler = datamodule.train_batch_sampler(world_size=plan.batch.world_size)
        check_resume_position(plan.ckpt_path, sampler)  # another batch: one sentence, now
    profile = check_profile(c)
    return Prepared(cfg, c, plugin, environment, datamodule, plan, profile)


def _plan_attention(c: dict[str, Any], accelerator: str) -> str:
    """The attention backend the run uses on this accelerator (model.config.attention: auto
    resolved), refused before compute where it cannot train (e.g. flex on the CPU)."""
    from omnibert.models.attention import plan_attention

    model = c["model"]["config"]
    return plan_attention(  # raises BertConfigError, a UserError: one sentence, exit 2
        str(model.get("attention", "auto")),
        {"gpu": "cuda"}.get(accelerator, accelerator),
        float(model["attention_probs_dropout_prob"]),
        int(c["phase"]["max_seq_length"]),
        int(model["hidden_size"]) // int(model["num_attention_heads"]),
    )


def _batch_and_data(
    cfg: DictConfig, c: dict[str, Any], device: Any = None, precision: str | None = None
) -> tuple[BatchPlan, Any, Any]:
    """The batch plan, the data module checked against the data (packing included) and the
    micro-batch choice (:mod:`omnibert.run.memory`; ``device``: where the memory is read;
    ``precision``: the resolved one, default ``trainer.precision``)."""
    from omnibert.models import BertConfig
    from omnibert.run.memory import choose_micro_batch

    acc = c["accelerator"]
    requested = c.get("micro_batch_size")
    first = batch_plan(
        c["phase"]["global_batch_size"], acc["devices"], acc["num_nodes"], requested,
        c.get("eval_micro_batch_size"),
    ) if requested is not None else None  # fmt: skip
    datamodule = instantiate_node(
        cfg.data,
        micro_batch_size=requested or 1,
        eval_micro_batch_size=c.get("eval_micro_batch_size"),
    )
    datamodule.check()
    world = acc["devices"] * acc["num_nodes"]
    check_enough_data(c["phase"]["global_batch_size"], datamodule, world, requested)
    vocab = resolve_vocab_size(c["model"]["config"], datamodule.vocab_size)
    choice = choose_micro_batch(
        BertConfig(**{**c["model"]["config"], "vocab_size": vocab}),
        {
            "input_ids": [1, datamodule.max_seq_length],
            "masked_lm_positions": [1, datamodule.predictions_per_pack],
            "nsp_labels": [1, datamodule.packing.sequences_per_row_max],
        },
        precision=precision or str(c["trainer"].get("precision")),
        clip=resolve_clipping(c.get("clip_grad_per_micro_batch"), c["optimizer"]),
        device=device if device is not None else torch.device("cpu"),
        requested=None if c.get("compile_only") else requested,  # compile-only reports fits
        per_device=max(1, c["phase"]["global_batch_size"] // world),
        max_rows=max(1, datamodule.num_train_rows // world),
        packed=datamodule.packing.enabled,
        memory_fraction=float(c.get("memory_fraction", 0.8)),
    )
    if requested is not None and c.get("compile_only"):
        choice = dataclasses.replace(choice, size=requested, reason="set by micro_batch_size")
    batch = first or batch_plan(
        c["phase"]["global_batch_size"], acc["devices"], acc["num_nodes"], choice.size,
        c.get("eval_micro_batch_size"),
    )  # fmt: skip
    datamodule.micro_batch_size = batch.micro_batch_size
    datamodule.eval_micro_batch_size = batch.eval_micro_batch_size
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
        datamodule.micro_batch_size = batch.micro_batch_size
    datamodule.check()
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


def check_data(cfg: DictConfig) -> None:
    """The config resolves and its data fits it (shapes, batch arithmetic): what a later
    phase of a multi-phase run checks before the first one trains."""
    c = resolve(cfg)
    _batch_and_data(cfg, c)  # the memory of this machine's CPU: the data is what is checked


def plan_run(
    c: dict[str, Any], datamodule: Any, batch: BatchPlan, precision: str | None = None
) -> TrainPlan:
    """Everything derived from the resolved config ``c`` and the (checked) data;
    ``precision``: ``trainer.precision`` resolved by the accelerator (default: as written)."""
    from omnibert.models import BertConfig

    model_cfg = dict(c["model"]["config"])
    vocab_size = resolve_vocab_size(model_cfg, datamodule.vocab_size)
    model_cfg["vocab_size"] = vocab_size
    config = BertConfig(**model_cfg)
    phase = c["phase"]
    if phase["max_seq_length"] > config.max_position_embeddings:
        raise TrainConfigError(
            f"phase.max_seq_length={phase['max_seq_length']} exceeds "
            f"model.config.max_position_embeddings={config.max_position_embeddings}; shorten "
            "the sequences or use a model with more positions."
        )
    max_steps = c["trainer"]["max_steps"]
    if not isinstance(max_steps, int) or max_steps < 1:
        raise TrainConfigError(f"phase.max_steps={max_steps!r} must be a positive integer.")
    model_init, phase_init = c["model"].get("init_from"), phase.get("init_from")
    checkpoint_dir = str(Path(c["paths"]["checkpoint_dir"]).resolve())
    ckpt = resolve_ckpt_path(c.get("ckpt_path"), checkpoint_dir)
    if ckpt is not None:
        check_resume_target(ckpt, model_cfg)
        init_from = init_bert_config = None  # a resume takes its weights from the checkpoint
    else:
        if model_init is not None and phase_init is not None:
            raise TrainConfigError(
                f"both model.init_from={model_init} and phase.init_from={phase_init} are set; "
                "set the one you mean and the other to null."
            )
        bert_config = c["model"].get("bert_config")
        init_from = check_init_from(
            model_init if model_init is not None else phase_init,
            dataclasses.asdict(config),
            bert_config,
        )
        init_bert_config = tf1_bert_config(init_from, bert_config)
    check_optimizer(c["optimizer"], c.get("schedule"), max_steps)
    micro_clip = resolve_clipping(c.get("clip_grad_per_micro_batch"), c["optimizer"])
    precision = precision or str(c["trainer"].get("precision"))
    if micro_clip is not None and precision.startswith("16"):
        raise TrainConfigError(
            f"clip_grad_per_micro_batch with trainer.precision={precision} would clip "
            "loss-scaled gradients; use bf16-mixed or 32-true."
        )
    clipping = describe_clipping(micro_clip, c["optimizer"], c["trainer"].get("gradient_clip_val"))
    steps_per_epoch = datamodule.num_train_rows // batch.rows_per_step
    if steps_per_epoch < 1:
        fits = int(batch.global_batch_size * datamodule.num_train_rows / batch.rows_per_step)
        raise TrainConfigError(
            f"the training set has {datamodule.num_train_samples} sequences in "
            f"{datamodule.num_train_rows} rows, fewer than one global batch of "
            f"{batch.rows_per_step} rows (phase.global_batch_size={batch.global_batch_size}); "
            f"set phase.global_batch_size to about {fits} or less, or use more data."
        )
    cap = c.get("steps_per_epoch")
    if cap is not None:
        steps_per_epoch = min(steps_per_epoch, cap)
    every = c.get("val_every_n_steps")
    if datamodule.num_eval_samples == 0:
        every = None
    if c.get("mlperf") is not None:
        if datamodule.num_eval_samples == 0:
            raise TrainConfigError(
                "MLPerf mode (phase=mlperf) evaluates on the eval set; set data.eval_path."
            )
        every = None  # MLPerf evaluates at its own cadence (callbacks/mlperf.py)
    acc = batch.accumulate_grad_batches
    return TrainPlan(
        batch=batch,
        max_steps=max_steps,
        steps_per_epoch=steps_per_epoch,
        limit_train_batches=steps_per_epoch * acc,
        val_every_n_steps=every,
        val_check_interval=None if every is None else every * acc,
        vocab_size=vocab_size,
        init_from=init_from,
        init_bert_config=init_bert_config,
        ckpt_path=ckpt,
        checkpoint_dir=checkpoint_dir,
        clipping=clipping,
        clip_grad_per_micro_batch=micro_clip,
        precision=precision,
        data=datamodule.describe(),
    )


def _instantiate_all(nodes: DictConfig | None) -> list[Any]:
    if not nodes:
        return []
    return [instantiate_node(node) for node in nodes.values() if node is not None]


def build_task(prepared: Prepared) -> tuple[Any, str | None]:
    """The task (``cfg.task``'s ``_target_``) with what the run derived, and a description of
    the initial weights it loaded (``None`` for random init or a resume)."""
    c, plan = prepared.c, prepared.plan
    task = instantiate_node(prepared.cfg.task)(
        model_config={**c["model"]["config"], "vocab_size": plan.vocab_size},
        optimizer=c["optimizer"],
        schedule=c.get("schedule"),
        total_steps=plan.max_steps,
        init_from=plan.init_from,
        init_bert_config=plan.init_bert_config,
        vocab_file=prepared.datamodule.vocab_file,
        clip_grad_per_micro_batch=plan.clip_grad_per_micro_batch,
    )
    loaded = task.load_initial_weights() if plan.ckpt_path is None else None
    return task, loaded


def _mlperf_callback(prepared: Prepared, output_dir: Path | None) -> Any:
    """MLPerf mode's cadence, stop-at-target and compliance log, or None when it is off."""
    node = prepared.c.get("mlperf")
    if node is None:
        return None
    from omnibert.callbacks.mlperf import (
        MLPerfCompliance,
        eval_interval_samples,
        mlperf_hyperparameters,
    )

    plan = prepared.plan
    where = output_dir if output_dir is not None else Path(prepared.c["paths"]["run_dir"])
    every = node["eval_every_samples"] or eval_interval_samples(plan.batch.global_batch_size)
    return MLPerfCompliance(
        where / node["log_file"],
        target_accuracy=node["target_accuracy"],
        eval_every_samples=every,
        max_samples=node["max_samples"],
        submission=node["submission"],
        hyperparameters=mlperf_hyperparameters(prepared.c, plan.batch.accumulate_grad_batches),
        eval_samples=prepared.datamodule.num_eval_samples,
    )


def build(prepared: Prepared, output_dir: Path | None = None) -> Run:
    """The task (:func:`build_task`), callbacks, loggers and the Trainer."""
    from lightning.pytorch.callbacks import ProgressBar

    from omnibert.callbacks import AtomicCheckpointIO, CompletedBatchProgress
    from omnibert.callbacks.progress import select_progress
    from omnibert.callbacks.requeue import CheckpointOnSignal, submitit_signal
    from omnibert.callbacks.stop import StopAtSafePoint
    from omnibert.run.profiling import profiler_for_run

    cfg, c, plugin, plan = prepared.cfg, prepared.c, prepared.plugin, prepared.plan
    for name in remove_stale_temporaries(plan.checkpoint_dir):
        log.warning("removed %s, a checkpoint a killed process had not finished writing", name)
    seed_everything(c["seed"], workers=False)
    mlperf = _mlperf_callback(prepared, output_dir)  # logs init_start before the model
    task, loaded = build_task(prepared)
    callbacks = [*_instantiate_all(cfg.get("callbacks")), CompletedBatchProgress()]
    callbacks.append(StopAtSafePoint())  # SIGTERM / SIGINT: checkpoint this step, then stop
    callbacks += [mlperf] if mlperf else []
    if submitit_signal() is not None:  # a submitit job: checkpoint at the time limit, requeue
        callbacks.append(CheckpointOnSignal())
    if not c["trainer"].get("enable_progress_bar", True):
        callbacks = [cb for cb in callbacks if not isinstance(cb, ProgressBar)]
    # a terminal gets the progress bar, a log file step-counting lines (callbacks/progress.py)
    callbacks = select_progress(callbacks, sys.stdout.isatty(), plan.batch.sequences_per_step)
    loggers = build_loggers(prepared)
    plugin.compile_model(task.model)
    callbacks += plugin.callbacks()  # e.g. the CUDA graph step marker
    # the plugin's Trainer arguments (accelerator, strategy, precision, ...) and its view of
    # the loop counts (IPU: device-side accumulation) override the trainer config's
    hardware = plugin.trainer_kwargs(plan.precision)
    hardware_plugins = hardware.pop("plugins")
    loop = plugin.loop_kwargs(
        plan.batch.accumulate_grad_batches,
        plan.limit_train_batches,
        plan.val_check_interval,
        plan.max_steps,
    )
    if loop["val_check_interval"] is None:
        loop["val_check_interval"] = (loop["max_steps"] + 1) * loop["accumulate_grad_batches"]
    if prepared.profile is not None:  # profile=true: torch.profiler traces in <output dir>
        run_dir = output_dir if output_dir is not None else Path(c["paths"]["run_dir"])
        hardware["profiler"] = profiler_for_run(prepared.profile, run_dir / "profile", plugin.name)
    trainer = instantiate_node(
        cfg.trainer,
        _convert_="partial",  # plain lists: Lightning < 2.5 takes no ListConfig of plugins
        **{**hardware, **loop},
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[*hardware_plugins, AtomicCheckpointIO()],
    )
    return Run(prepared, task, trainer, callbacks, loaded)


def build_loggers(prepared: Prepared) -> list[Any]:
    """The configured loggers (``logger=csv``, ``[csv,wandb]``, ...), each given the resolved
    config, the plan and the environment report."""
    facts = {
        "config": prepared.c,
        "plan": prepared.plan.to_dict(),
        "environment": prepared.environment,
    }
    return loggers_for(prepared.cfg.get("logger"), facts)


def loggers_for(nodes: DictConfig | None, facts: dict[str, Any]) -> list[Any]:
    """The logger nodes (``cfg.logger``) instantiated, each given ``facts`` (the resolved
    config, the plan, ...) as its hyper-parameters: pretraining and fine-tuning alike."""
    loggers = _instantiate_all(nodes)
    for logger in loggers:
        logger.log_hyperparams(facts)
    return loggers


def finish_loggers(loggers: list[Any]) -> None:
    """End the experiment-tracker runs a run started (W&B: ``Run.finish``), so the next run
    in this process (a sequential multirun, a test) starts its own instead of reusing it;
    Lightning's ``finalize`` leaves them open."""
    for logger in loggers:
        experiment = getattr(logger, "_experiment", None)
        if experiment is not None and callable(getattr(experiment, "finish", None)):
            experiment.finish()


def majority_baselines(validation: dict[str, float] | None) -> dict[str, float | None]:
    """``mlm_majority_baseline`` / ``nsp_majority_baseline``: the accuracy of always
    predicting the eval set's most frequent masked token / NSP label (what an accuracy is
    to be compared with; None without validation)."""
    val = validation or {}
    return {
        "mlm_majority_baseline": val.get("val/mlm_majority_baseline"),
        "nsp_majority_baseline": val.get("val/nsp_majority_baseline"),
    }


def fit(run: Run) -> dict[str, Any]:
    """Train, validate on the whole eval set at the end, return the summary."""
    from omnibert import stopping
    from omnibert.callbacks import PretrainingThroughput
    from omnibert.callbacks.mlperf import MLPerfCompliance

    prepared, task, trainer = run.prepared, run.task, run.trainer
    plan = prepared.plan
    start = time.perf_counter()
    try:
        try:
            with stopping.at_safe_points():  # a signal stops at the end of an optimiser step
                trainer.fit(task, datamodule=prepared.datamodule, ckpt_path=plan.ckpt_path)
        except RuntimeError as err:
            # Lightning's teardown can fail while a user error from restoring the loader
            # propagates ("Please call iter(combined_loader) first"): the user's sentence wins
            if isinstance(err.__context__, UserError):
                raise err.__context__ from None
            raise
        seconds = time.perf_counter() - start
        last_ckpt = Path(plan.checkpoint_dir) / "last.ckpt"
        stopping.set_context(
            f" after training finished at step {trainer.global_step} ({last_ckpt} holds it)"
            if last_ckpt.is_file()
            else f" after training finished at step {trainer.global_step}"
        )
        stopping.check()  # a signal during the last validation inside fit
        if trainer.is_global_zero:  # finished: nothing left to resume after a time limit
            (Path(plan.checkpoint_dir) / RESUME_FILE).unlink(missing_ok=True)
        last = task.last_validation
        if plan.data.get("eval_samples") and (last is None or last["step"] != trainer.global_step):
            trainer.validate(task, datamodule=prepared.datamodule, verbose=False)
    finally:
        finish_loggers(trainer.loggers)
    throughput = next((cb for cb in run.callbacks if isinstance(cb, PretrainingThroughput)), None)
    mlperf = next((cb for cb in run.callbacks if isinstance(cb, MLPerfCompliance)), None)
    return {
        "run_name": prepared.c["run_name"],
        "steps": trainer.global_step,
        "fit_seconds": round(seconds, 3),
        "validation": task.last_validation,
        **majority_baselines(task.last_validation),
        "throughput": throughput.summary() if throughput is not None else {},
        **({"mlperf": mlperf.summary()} if mlperf is not None else {}),
        "checkpoint_dir": plan.checkpoint_dir,
        "last_checkpoint": str(last_ckpt) if last_ckpt.is_file() else None,
        "plan": plan.to_dict(),
    }
