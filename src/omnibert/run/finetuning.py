"""The wiring of a fine-tuning run, shared by ``omnibert-finetune``, ``omnibert-predict`` and
the tests: the same run pipeline as pretraining (:mod:`omnibert.run.training`), with the task
node owning what differs.

In this order: resolve the config and check every input before compute
(:func:`check_inputs`: the task node, its data (``task.data``, a
:class:`~omnibert.finetune.spec.TaskData`; the splits through ``datasets``, checked for
columns and labels), the checkpoint path, the output directory, the batch arithmetic) →
the accelerator plugin, the encoder (``load_pretrained``: an omnibert ``.ckpt``, a Hugging
Face directory or a TF1 prefix; the vocab comes from the checkpoint), the training features,
the plan (:func:`prepare`) → the task (``instantiate(cfg.task)``), the data module, the
configured callbacks and loggers, the Trainer from ``cfg.trainer`` (:func:`build`: the
pretraining groups, unchanged: ``finetune.yaml``'s ``phase`` node is the task's recipe as
they read it) → fit (:func:`fit`) → predictions on the eval splits, the official metrics, the
submission files and ``summary.json`` in the run directory (:func:`evaluate`, :func:`run`).

How a task plugs in (reader, head, metric, submission writer): :mod:`omnibert.finetune.spec`.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig

from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = ["Inputs", "Prepared", "build", "check_inputs", "evaluate", "fit", "prepare", "run"]

log = logging.getLogger("omnibert.finetune")

EXAMPLE = (
    "e.g. omnibert-finetune task=mrpc model.init_from=<checkpoint> (data from the Hub's "
    "nyu-mll/glue, or data.train_file=train.tsv data.eval_file=dev.tsv)"
)


@dataclass
class Inputs:
    """The checked config, the task's data and its splits (``datasets.Dataset``)."""

    c: dict[str, Any]
    recipe: dict[str, Any]
    data: Any
    train: Any
    evals: dict[str, Any]
    tests: dict[str, Any]
    where: dict[str, str]
    micro_batch_size: int
    accumulate: int


def _resolve(cfg: DictConfig) -> dict[str, Any]:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:  # not run.checks.resolve_config: that module imports Lightning
        return cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    except OmegaConfBaseException as err:
        raise FineTuneInputError(
            f"the config does not resolve: {err}".splitlines()[0] + f"; {EXAMPLE}."
        ) from err


def task_data(task: dict[str, Any]) -> Any:
    """The task's :class:`~omnibert.finetune.spec.TaskData` from its ``data`` node."""
    from hydra.utils import instantiate

    node = task.get("data")
    if not isinstance(node, dict) or "_target_" not in node:
        raise FineTuneInputError(
            f"the task config ({task.get('_target_')}) is not a fine-tuning task (no task.data "
            "with a _target_); use task=squad, task=mrpc or another GLUE task (conf/task/)."
        )
    return instantiate(node, _convert_="all")


def _check_recipe(recipe: dict[str, Any], data: Any) -> None:
    for key in ("epochs", "batch_size", "max_seq_length", "eval_batch_size"):
        value = recipe.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise FineTuneInputError(f"task.{key}={value!r} must be a positive integer; fix it.")
    names = getattr(data, "label_names", None)
    if data.benchmark == "glue":
        wanted = 1 if names is None else len(names)
        if recipe.get("num_labels") != wanted:
            raise FineTuneInputError(
                f"task.num_labels={recipe.get('num_labels')} but task={data.task} has "
                f"{'a regression score' if names is None else f'{wanted} labels'}; set "
                f"task.num_labels={wanted}."
            )


def _splits(inputs_c: dict[str, Any], data: Any, role: str) -> tuple[dict[str, Any], dict]:
    """The eval or test splits: from files when any file is configured (a run on local
    files never reaches the Hub), else from ``data.dataset`` / the task's Hub name."""
    from omnibert.finetune.sources import file_for, load_split

    data_cfg = inputs_c["data"]
    splits = data.eval_splits if role == "eval" else data.test_splits
    local = any(data_cfg.get(k) for k in ("train_file", "eval_file", "test_file"))
    key = f"{role}_file"
    given = data_cfg.get(key)
    if isinstance(given, dict) and set(given) - set(splits):
        unknown = ", ".join(sorted(set(given) - set(splits)))
        raise FineTuneInputError(
            f"data.{key} names {unknown}, which task={data.task} does not have; its "
            f"{role} splits are {', '.join(splits) or 'none'}."
        )
    out, where = {}, {}
    for position, (name, split) in enumerate(splits.items()):
        file, _ = file_for(data_cfg, role, name, position == 0)
        if file is None and local:
            continue
        out[name], where[f"{role}:{name}"] = load_split(
            data, data_cfg, role, name, split, position == 0
        )
        data.check(out[name], where[f"{role}:{name}"], labelled=role == "eval")
    return out, where


def check_inputs(cfg: DictConfig) -> Inputs:
    """Everything checkable without torch: one sentence naming the key and the fix."""
    from omnibert.finetune.sources import load_split
    from omnibert.paths import check_writable_dir

    c = _resolve(cfg)
    task = c.get("task") or {}
    data = task_data(task)
    recipe = {k: v for k, v in task.items() if not str(k).startswith("_")}
    _check_recipe(recipe, data)
    if not c["model"].get("init_from"):
        raise FineTuneInputError(
            "model.init_from is not set; point it at a Hugging Face BERT directory, an "
            "omnibert .ckpt or a TF1 checkpoint prefix (+ model.bert_config=)."
        )
    check_writable_dir(c["paths"]["run_dir"], "paths.run_dir")
    train, train_where = load_split(data, c["data"], "train", "train", data.train_split)
    data.check(train, train_where, labelled=True)
    evals, where = _splits(c, data, "eval")
    tests: dict[str, Any] = {}
    if c["data"].get("predict_test"):
        tests, test_where = _splits(c, data, "test")
        where.update(test_where)
    acc = c["accelerator"]
    world = int(acc["devices"]) * int(acc["num_nodes"])
    micro = c.get("micro_batch_size") or recipe["batch_size"] // world
    if micro < 1 or recipe["batch_size"] % (micro * world):
        raise FineTuneInputError(
            f"task.batch_size={recipe['batch_size']} is not a multiple of micro_batch_size="
            f"{micro} x {world} device(s); choose a micro_batch_size that divides it."
        )
    return Inputs(
        c, recipe, data, train, evals, tests, {"train": train_where, **where}, micro,
        recipe["batch_size"] // (micro * world),
    )  # fmt: skip


@dataclass
class Prepared:
    inputs: Inputs
    loaded: Any
    vocab_file: str
    tokenizer: Any
    train_tensors: dict[str, Any]
    num_train_features: int
    steps_per_epoch: int
    total_steps: int
    plugin: Any
    ckpt_path: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    #: trainer.precision with auto resolved by the accelerator
    precision: str = "32-true"
    #: the kernels the run uses (precision, optimiser update; omnibert.run.kernels)
    kernels: dict[str, str] = field(default_factory=dict)

    def plan(self) -> dict[str, Any]:
        """What the run derived (printed, logged with the config, in ``summary.json``)."""
        i = self.inputs
        return {
            "task": i.c["task"]["name"],
            "data": i.where,
            "train_examples": len(i.train),
            "train_features": self.num_train_features,
            "steps_per_epoch": self.steps_per_epoch,
            "epochs": i.recipe["epochs"],
            "max_steps": self.total_steps,
            "global_batch_size": i.recipe["batch_size"],
            "micro_batch_size": i.micro_batch_size,
            "accumulate_grad_batches": i.accumulate,
            "init_from": str(i.c["model"]["init_from"]),
            "ckpt_path": self.ckpt_path,
            "precision": self.precision,
            "kernels": self.kernels,
        }


def prepare(cfg: DictConfig) -> Prepared:
    """:func:`check_inputs`, then the checkpoint, the tokenizer, the training features and
    the step count (no training yet)."""
    import math

    from omnibert.run.training import quiet_third_party_deprecations

    quiet_third_party_deprecations()
    inputs = check_inputs(cfg)
    from omnibert.accelerators import build_plugin
    from omnibert.finetune.tokenizer import build_tokenizer
    from omnibert.run.checks import resolve_ckpt_path
    from omnibert.run.finetune_init import load_encoder_source
    from omnibert.run.target_types import check_target_types

    c, recipe = inputs.c, inputs.recipe
    check_target_types(c)
    plugin = build_plugin(cfg.accelerator)
    precision, why = plugin.resolve_precision(c["trainer"].get("precision"))
    plugin.check_precision(precision)
    if plugin.name == "ipu":
        raise FineTuneInputError(
            "omnibert-finetune does not run on accelerator=ipu yet; use cpu, gpu or hpu."
        )
    # CPU threads from the CPUs this process may use, as pretraining sets them
    plugin.configure_threads(int(c["data"].get("num_workers") or 0))
    checkpoint_dir = Path(c["paths"]["checkpoint_dir"])
    if c.get("ckpt_path") is None and (checkpoint_dir / "final.ckpt").is_file():
        raise FineTuneInputError(
            f"{checkpoint_dir} already holds final.ckpt, a finished fine-tuning run; choose "
            "another run_name (or seed, or paths.output_root) to keep it, or delete it."
        )
    ckpt_path = resolve_ckpt_path(c.get("ckpt_path"), checkpoint_dir)
    loaded = load_encoder_source(c, recipe)
    vocab = loaded.vocab_file
    if vocab is None or not Path(vocab).is_file():
        raise FineTuneInputError(
            f"model.init_from={c['model']['init_from']} has no vocab.txt beside it (or recorded "
            "in it); the vocab must come from the checkpoint: put its vocab.txt there."
        )
    if recipe["max_seq_length"] > loaded.config.max_position_embeddings:
        raise FineTuneInputError(
            f"task.max_seq_length={recipe['max_seq_length']} exceeds the checkpoint's "
            f"max_position_embeddings={loaded.config.max_position_embeddings}; lower it."
        )
    tokenizer = build_tokenizer(vocab)
    feats = inputs.data.features(inputs.train, tokenizer, recipe, training=True)
    n = len(feats)
    world = plugin.devices * plugin.num_nodes
    batches = math.ceil(n / (inputs.micro_batch_size * world))
    steps_per_epoch = math.ceil(batches / inputs.accumulate)
    from omnibert.run.kernels import optimizer_choice

    kernels = {
        "precision": f"{precision} ({why})",
        "optimizer": optimizer_choice(c["optimizer"], plugin.device, 0),
        "compile": "off (omnibert-finetune runs the model eagerly)",
    }
    return Prepared(
        inputs, loaded, vocab, tokenizer, feats.tensors, n, steps_per_epoch,
        steps_per_epoch * recipe["epochs"], plugin, ckpt_path, precision=precision,
        kernels=kernels,
    )  # fmt: skip


@dataclass
class Run:
    prepared: Prepared
    task: Any
    trainer: Any
    datamodule: Any
    new_keys: list[str]


def build(prepared: Prepared, run_dir: Path) -> Run:
    """The task with the pretrained encoder and a fresh head, the data module, the
    configured callbacks and loggers, and the Trainer of ``cfg.trainer``."""
    import dataclasses
    import shutil
    import sys

    from lightning.pytorch.callbacks import ProgressBar

    from omnibert.callbacks import AtomicCheckpointIO, CompletedBatchProgress
    from omnibert.callbacks.progress import select_progress
    from omnibert.callbacks.requeue import CheckpointOnSignal, submitit_signal
    from omnibert.callbacks.stop import StopAtSafePoint
    from omnibert.compat import seed_everything
    from omnibert.data.finetuning import FineTuneDataModule
    from omnibert.finetune.batching import TrimPadding
    from omnibert.run.checks import instantiate_node
    from omnibert.run.training import loggers_for

    inputs = prepared.inputs
    c = inputs.c
    seed_everything(c["seed"], workers=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    vocab_copy = run_dir / "vocab.txt"
    if Path(prepared.vocab_file).resolve() != vocab_copy.resolve():
        shutil.copyfile(prepared.vocab_file, vocab_copy)
    task = instantiate_node(c["task"], _recursive_=False)(
        model_config=dataclasses.asdict(prepared.loaded.config),
        optimizer=c["optimizer"],
        schedule=c.get("schedule"),
        total_steps=prepared.total_steps,
        init_from=str(c["model"]["init_from"]),
        vocab_file=str(vocab_copy.resolve()),
    )
    new = prepared.loaded.load_into(task)
    datamodule = FineTuneDataModule(
        prepared.train_tensors, inputs.micro_batch_size, int(c["seed"]),
        int(c["data"].get("num_workers") or 0), TrimPadding.from_config(c["data"]),
    )  # fmt: skip
    nodes = c.get("callbacks") or {}
    callbacks = [instantiate_node(n) for n in nodes.values() if n is not None]
    callbacks.append(CompletedBatchProgress())
    callbacks.append(StopAtSafePoint())  # SIGTERM / SIGINT: checkpoint this step, then stop
    if submitit_signal() is not None:  # a submitit job: checkpoint at the time limit, requeue
        callbacks.append(CheckpointOnSignal())
    if not c["trainer"].get("enable_progress_bar", True):
        callbacks = [cb for cb in callbacks if not isinstance(cb, ProgressBar)]
    callbacks = select_progress(callbacks, sys.stdout.isatty(), float(inputs.recipe["batch_size"]))
    facts = {"config": c, "plan": prepared.plan()}
    loggers = loggers_for(DictConfig(c.get("logger") or {}), facts)
    hardware = prepared.plugin.trainer_kwargs(prepared.precision)
    plugins = hardware.pop("plugins")
    trainer = instantiate_node(
        DictConfig(c["trainer"]),
        _convert_="partial",
        **hardware,
        plugins=[*plugins, AtomicCheckpointIO()],
        callbacks=callbacks,
        logger=loggers or False,
        max_steps=prepared.total_steps,
        max_epochs=inputs.recipe["epochs"],
        accumulate_grad_batches=inputs.accumulate,
        # at most the micro-batches of an epoch: Lightning warns about a longer interval
        log_every_n_steps=max(
            1,
            min(
                int(c["trainer"].get("log_every_n_steps") or 50),
                -(-len(datamodule.dataset) // inputs.micro_batch_size),
            ),
        ),
        limit_val_batches=0,
    )
    return Run(prepared, task, trainer, datamodule, new)


def fit(run: Run) -> dict[str, Any]:
    """Train; the training facts for the summary (the final checkpoint is the checkpoint
    callback's ``final.ckpt``)."""
    from omnibert import stopping
    from omnibert.run.checks import RESUME_FILE
    from omnibert.run.training import finish_loggers

    prepared, task, trainer = run.prepared, run.task, run.trainer
    checkpoint_dir = Path(prepared.inputs.c["paths"]["checkpoint_dir"])
    print(f"omnibert-finetune: initialised from {prepared.loaded.description}", flush=True)
    print(f"omnibert-finetune: new (freshly initialised) keys: {', '.join(run.new_keys)}")
    start = time.perf_counter()
    try:
        with stopping.at_safe_points():  # a signal stops at the end of an optimiser step
            trainer.fit(task, datamodule=run.datamodule, ckpt_path=prepared.ckpt_path)
    finally:
        finish_loggers(trainer.loggers)
    stopping.set_context(f" after fine-tuning finished at step {trainer.global_step}")
    stopping.check()
    seconds = time.perf_counter() - start
    if trainer.is_global_zero:
        (checkpoint_dir / RESUME_FILE).unlink(missing_ok=True)
    losses = task.losses()
    tenth = max(1, len(losses) // 10)
    final = checkpoint_dir / "final.ckpt"
    return {
        "steps": trainer.global_step,
        "fit_seconds": round(seconds, 3),
        "train_loss_first": sum(losses[:tenth]) / tenth if losses else None,
        "train_loss_last": sum(losses[-tenth:]) / tenth if losses else None,
        "new_keys": run.new_keys,
        "checkpoint": str(final) if final.is_file() else None,
    }


def logits(
    task: Any,
    tensors: dict[str, Any],
    batch_size: int,
    autocast: Any = None,
    trim: Any = None,
    progress: Any = None,
) -> Any:
    """The task's outputs over ``tensors`` as numpy (float32), in input order: SQuAD a pair of
    ``[N,S]`` start/end arrays, classification ``[N,labels]``.

    Rows run longest first in batches cut to their longest row (``trim``, a
    :class:`~omnibert.finetune.batching.TrimPadding`; default: cut to a multiple of 8). A
    row's padding columns are ``-inf`` in SQuAD's arrays, whether its batch computed them or
    not: no answer starts or ends there, and what the head gives a padding token depends on
    how wide the batch was, so left in, it would take n-best slots from real tokens and make
    the answers depend on the batch size. ``progress(rows_done, rows)`` is called after each
    batch."""
    import contextlib

    import numpy as np
    import torch

    from omnibert.finetune.batching import TrimPadding, length_order

    trim = trim if trim is not None else TrimPadding()
    task.eval()
    device = next(task.parameters()).device
    n, width = (int(x) for x in tensors["input_ids"].shape)
    out: Any = None
    done = 0
    with torch.no_grad(), autocast if autocast is not None else contextlib.nullcontext():
        for rows in length_order(tensors["attention_mask"], batch_size):
            batch = trim.trim({k: v[rows] for k, v in tensors.items()})
            result = task({k: v.to(device) for k, v in batch.items()})
            parts = result if isinstance(result, tuple) else (result,)
            arrays = [p.float().cpu().numpy() for p in parts]
            if out is None:
                out = [
                    np.full((n, width), -np.inf, np.float32)
                    if isinstance(result, tuple)
                    else np.zeros((n, *a.shape[1:]), np.float32)
                    for a in arrays
                ]
            index = rows.numpy()
            if isinstance(result, tuple):  # per-token outputs: padding is no answer
                padding = (batch["attention_mask"] == 0).numpy()
                for array in arrays:
                    array[padding] = -np.inf
            for target, array in zip(out, arrays, strict=True):
                target[index, : array.shape[1]] = array
            done += len(index)
            if progress is not None:
                progress(done, n)
    if out is None:  # no rows
        return np.zeros((0, 1), np.float32)
    return tuple(out) if len(out) > 1 else out[0]


def predict_outputs(
    data: Any,
    task: Any,
    dataset: Any,
    tokenizer: Any,
    recipe: dict[str, Any],
    autocast: Any,
    trim: Any = None,
    progress: Any = None,
) -> tuple[list[Any], Any]:
    """One prediction per example of ``dataset`` (the task's own post-processing) and the
    head's outputs they came from (per feature: SQuAD's ``(start, end)`` logits, GLUE's
    ``[N, num_labels]``); ``trim`` and ``progress`` as in :func:`logits`."""
    feats = data.features(dataset, tokenizer, recipe, training=False)
    outputs = logits(task, feats.tensors, recipe["eval_batch_size"], autocast, trim, progress)
    return list(data.predict(dataset, feats, outputs, recipe)), outputs


def evaluate(prepared: Prepared, task: Any, run_dir: Path) -> dict[str, Any]:
    """Predictions on every eval split (metrics, files under ``eval/``) and test split
    (submission files under ``submission/``)."""
    inputs = prepared.inputs
    data, recipe = inputs.data, inputs.recipe
    from omnibert.finetune.batching import TrimPadding

    autocast = prepared.plugin.autocast(prepared.precision)
    trim = TrimPadding.from_config(inputs.c["data"])
    metrics: dict[str, float] = {}
    files: dict[str, str] = {}
    several = len(inputs.evals) > 1
    for name, dataset in inputs.evals.items():
        predicted, _ = predict_outputs(
            data, task, dataset, prepared.tokenizer, recipe, autocast, trim
        )
        files[f"eval:{name}"] = str(data.write(run_dir / "eval", name, dataset, predicted))
        if data.has_labels(dataset):
            for key, value in data.scores(dataset, predicted).items():
                metrics[f"{key}_{name}" if several else key] = value
    for name, dataset in inputs.tests.items():
        predicted, _ = predict_outputs(
            data, task, dataset, prepared.tokenizer, recipe, autocast, trim
        )
        files[f"test:{name}"] = str(data.write(run_dir / "submission", name, dataset, predicted))
    return {"metrics": metrics, "files": files}


#: a plan with fewer optimiser steps says so: the task's recipe (made for the full data
#: set) barely trains on a small one (27 questions at batch 32: 2 steps over 2 epochs)
FEW_STEPS = 10


def few_steps_notice(steps: int, recipe: dict[str, Any], examples: int) -> str | None:
    """One line when the plan has fewer than :data:`FEW_STEPS` optimiser steps, else None."""
    if steps >= FEW_STEPS:
        return None
    return (
        f"omnibert-finetune: note: only {steps} optimiser step{'' if steps == 1 else 's'} "
        f"({examples} training examples, task.batch_size={recipe['batch_size']}, "
        f"task.epochs={recipe['epochs']}), too few to learn much; raise task.epochs or lower "
        "task.batch_size for more steps."
    )


def run(cfg: DictConfig) -> dict[str, Any]:
    """Prepare, fit, evaluate; ``summary.json`` and ``curves.png`` in the run directory;
    returns the summary."""
    from omnibert import stopping
    from omnibert.reporting import write_curves

    stopping.set_context(" before fine-tuning started")
    prepared = prepare(cfg)
    inputs = prepared.inputs
    c = inputs.c
    run_dir = Path(c["paths"]["run_dir"])
    print(
        f"omnibert-finetune: {c['task']['name']} from {c['model']['init_from']}: "
        f"{len(inputs.train)} training examples -> {prepared.num_train_features} "
        f"features, {prepared.steps_per_epoch} steps/epoch x {inputs.recipe['epochs']} "
        f"epochs = {prepared.total_steps} steps (batch {inputs.recipe['batch_size']}, "
        f"micro {inputs.micro_batch_size}, accumulation {inputs.accumulate})",
        flush=True,
    )
    notice = few_steps_notice(prepared.total_steps, inputs.recipe, len(inputs.train))
    if notice:
        print(notice, flush=True)
    kernels = "; ".join(f"{k} {v}" for k, v in prepared.kernels.items())
    print(f"omnibert-finetune: kernels: {kernels}", flush=True)
    built = build(prepared, run_dir)
    facts = fit(built)
    if not built.trainer.is_global_zero:
        return {}
    evaluated = evaluate(prepared, built.task, run_dir)
    metric_values = evaluated["metrics"]
    data = inputs.data
    summary = {
        "task": c["task"]["name"],
        "benchmark": data.benchmark,
        "task_label": data.label,
        "metric_names": list(data.metrics),
        "run_name": c["run_name"],
        "seed": c["seed"],
        "init_from": str(c["model"]["init_from"]),
        "train_examples": len(inputs.train),
        "train_features": prepared.num_train_features,
        "eval_examples": sum(len(d) for d in inputs.evals.values()),
        **metric_values,
        "metrics": metric_values,
        "files": evaluated["files"],
        **facts,
        "plan": prepared.plan(),
        "run_dir": str(run_dir),
    }
    curves = write_curves(  # the loss curve (and the final metrics) next to summary.json
        built.trainer.loggers,
        run_dir,
        f"omnibert-finetune {c['run_name']}: {facts['steps']} steps",
        final={k: float(v) for k, v in metric_values.items() if isinstance(v, int | float)},
    )
    summary["curves"] = str(curves) if curves else None
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
