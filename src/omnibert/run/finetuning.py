"""The wiring of a fine-tuning run, shared by ``omnibert-finetune``, ``omnibert-predict`` and
the tests.

In this order: resolve the config and check every input before compute — the task, the data
files (format and content, read with json/csv only), the checkpoint, the output directory,
the batch arithmetic (:func:`check_inputs`) → load the encoder (``load_pretrained``: an
omnibert ``.ckpt``, a Hugging Face directory or a TF1 prefix; the vocab comes from the
checkpoint), tokenise, derive the steps (:func:`prepare`) → the task with its fresh head, the
Trainer, fit (:func:`fit`) → predictions on the eval file, the official metrics, the
submission files and ``summary.json`` in the run directory (:func:`evaluate`).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig

from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = ["FORMATS", "Prepared", "check_inputs", "evaluate", "fit", "prepare", "run"]

log = logging.getLogger("omnibert.finetune")

#: task.format -> (reader of the data files, LightningModule)
FORMATS = {"squad": "QuestionAnsweringTask", "glue_mrpc": "SequenceClassificationTask"}
EXAMPLE = (
    "e.g. omnibert-finetune task=squad data.train_file=train-v1.1.json "
    "data.eval_file=dev-v1.1.json model.init_from=<checkpoint>"
)


def _read(fmt: str, path: str, key: str, training: bool) -> list[Any]:
    if fmt == "squad":
        from omnibert.finetune.squad import read_squad

        return read_squad(path, key, training)
    from omnibert.finetune.glue import read_mrpc

    return read_mrpc(path, key, training)


@dataclass
class Inputs:
    """The checked config and the examples read from the data files."""

    c: dict[str, Any]
    recipe: dict[str, Any]
    train: list[Any]
    eval: list[Any] | None
    micro_batch_size: int
    accumulate: int


def check_inputs(cfg: DictConfig) -> Inputs:
    """Everything checkable without torch: one sentence naming the key and the fix."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from omnibert.paths import check_writable_dir

    try:  # not run.checks.resolve_config: that module imports Lightning
        c = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    except OmegaConfBaseException as err:
        raise FineTuneInputError(
            f"the config does not resolve: {err}".splitlines()[0] + f"; {EXAMPLE}."
        ) from err
    task = c.get("task") or {}
    fmt = task.get("format")
    if fmt not in FORMATS:
        raise FineTuneInputError(
            f"the task config ({task.get('_target_')}) is not a fine-tuning task (no "
            f"task.format among {', '.join(FORMATS)}); use task=squad or task=mrpc."
        )
    recipe = {k: v for k, v in task.items() if not str(k).startswith("_")}
    for key in ("epochs", "batch_size", "max_seq_length", "eval_batch_size"):
        value = recipe.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise FineTuneInputError(f"task.{key}={value!r} must be a positive integer; fix it.")
    data = c["data"]
    if not data.get("train_file"):
        raise FineTuneInputError(f"data.train_file is not set; {EXAMPLE}.")
    if not c["model"].get("init_from"):
        raise FineTuneInputError(
            "model.init_from is not set; point it at a Hugging Face BERT directory, an "
            "omnibert .ckpt or a TF1 checkpoint prefix (+ model.bert_config=)."
        )
    check_writable_dir(c["paths"]["run_dir"], "paths.run_dir")
    train = _read(fmt, data["train_file"], "data.train_file", training=True)
    evaluation = None
    if data.get("eval_file"):
        evaluation = _read(fmt, data["eval_file"], "data.eval_file", training=False)
    acc = c["accelerator"]
    world = int(acc["devices"]) * int(acc["num_nodes"])
    micro = c.get("micro_batch_size") or recipe["batch_size"] // world
    if micro < 1 or recipe["batch_size"] % (micro * world):
        raise FineTuneInputError(
            f"task.batch_size={recipe['batch_size']} is not a multiple of micro_batch_size="
            f"{micro} x {world} device(s); choose a micro_batch_size that divides it."
        )
    return Inputs(c, recipe, train, evaluation, micro, recipe["batch_size"] // (micro * world))


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
    extras: dict[str, Any] = field(default_factory=dict)


def features(
    fmt: str, examples: list[Any], tokenizer: Any, recipe: Mapping[str, Any], training: bool
) -> Any:
    """SQuAD windows (:class:`~omnibert.finetune.squad.SquadFeatures`) or MRPC pair arrays."""
    if fmt == "squad":
        from omnibert.finetune.squad import squad_features

        return squad_features(
            examples,
            tokenizer,
            recipe["max_seq_length"],
            recipe["doc_stride"],
            recipe["max_query_length"],
            training=training,
        )
    from omnibert.finetune.glue import pair_features

    return pair_features(examples, tokenizer, recipe["max_seq_length"])


def _tensors(fmt: str, feats: Any, training: bool) -> dict[str, Any]:
    import torch

    if fmt == "squad":
        return dict(feats.tensors(training))
    out = {k: torch.from_numpy(v) for k, v in feats.items()}
    if not training:
        out.pop("labels")
    return out


def prepare(cfg: DictConfig) -> Prepared:
    """:func:`check_inputs`, then the checkpoint, the tokenizer, the training features and
    the step count (no training yet)."""
    inputs = check_inputs(cfg)
    from omnibert.accelerators import build_plugin
    from omnibert.convert.checkpoints import load_pretrained
    from omnibert.finetune.tokenizer import build_tokenizer

    c, recipe = inputs.c, inputs.recipe
    plugin = build_plugin(cfg.accelerator)
    plugin.check_precision(str(c["trainer"].get("precision")))
    if plugin.name == "ipu":
        raise FineTuneInputError(
            "omnibert-finetune does not run on accelerator=ipu yet; use cpu, gpu or hpu."
        )
    loaded = load_pretrained(
        c["model"]["init_from"],
        c["model"].get("bert_config"),
        require_heads=False,
        key="model.init_from",
    )
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
    fmt = recipe["format"]
    feats = features(fmt, inputs.train, tokenizer, recipe, training=True)
    tensors = _tensors(fmt, feats, training=True)
    n = int(tensors["input_ids"].shape[0])
    world = plugin.devices * plugin.num_nodes
    batches = math.ceil(n / (inputs.micro_batch_size * world))
    steps_per_epoch = math.ceil(batches / inputs.accumulate)
    return Prepared(
        inputs, loaded, vocab, tokenizer, tensors, n, steps_per_epoch,
        steps_per_epoch * recipe["epochs"], plugin,
    )  # fmt: skip


class DictDataset:
    """Rows of a dict of equally long tensors (the default collate stacks them)."""

    def __init__(self, tensors: Mapping[str, Any]) -> None:
        self.tensors = dict(tensors)
        self.length = int(next(iter(self.tensors.values())).shape[0])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {k: v[index] for k, v in self.tensors.items()}


def build_task(prepared: Prepared, run_dir: Path) -> tuple[Any, list[str]]:
    """The task with the pretrained encoder and a fresh head; the new parameter names."""
    import dataclasses

    from hydra.utils import get_class

    c, recipe = prepared.inputs.c, prepared.inputs.recipe
    target = c["task"].get("_target_") or f"omnibert.tasks.{FORMATS[recipe['format']]}"
    vocab_copy = run_dir / "vocab.txt"
    run_dir.mkdir(parents=True, exist_ok=True)
    if Path(prepared.vocab_file).resolve() != vocab_copy.resolve():
        shutil.copyfile(prepared.vocab_file, vocab_copy)
    task = get_class(target)(
        model_config=dataclasses.asdict(prepared.loaded.config),
        optimizer=c["optimizer"],
        schedule=c.get("schedule"),
        total_steps=prepared.total_steps,
        recipe=recipe,
        init_from=str(c["model"]["init_from"]),
        vocab_file=str(vocab_copy.resolve()),
    )
    encoder = {
        k.removeprefix("bert."): v
        for k, v in prepared.loaded.model.state_dict().items()
        if k.startswith("bert.")
    }
    new = task.load_encoder(encoder, prepared.loaded.fresh_heads)
    return task, new


def fit(prepared: Prepared, run_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    """Build the task and the Trainer, train; returns (task, trainer, training facts)."""
    import torch
    from torch.utils.data import DataLoader

    from omnibert import stopping
    from omnibert.callbacks.stop import StopAtSafePoint
    from omnibert.compat import seed_everything
    from omnibert.run.checks import instantiate_node
    from omnibert.stopping import ignore_in_worker

    c, inputs = prepared.inputs.c, prepared.inputs
    seed_everything(c["seed"], workers=True)
    task, new = build_task(prepared, run_dir)
    log.info("fresh parameters (not in the checkpoint): %s", ", ".join(new))
    print(f"omnibert-finetune: initialised from {prepared.loaded.description}", flush=True)
    print(f"omnibert-finetune: new (freshly initialised) keys: {', '.join(new)}", flush=True)
    loader: DataLoader[Any] = DataLoader(
        DictDataset(prepared.train_tensors),  # type: ignore[arg-type]
        batch_size=inputs.micro_batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(int(c["seed"])),
        num_workers=int(c["data"].get("num_workers") or 0),
        worker_init_fn=ignore_in_worker,  # a signal to the group stops the run, not a worker
    )
    hardware = prepared.plugin.trainer_kwargs(str(c["trainer"].get("precision")))
    plugins = hardware.pop("plugins")
    loggers = [instantiate_node(n) for n in (c.get("logger") or {}).values() if n is not None]
    trainer = instantiate_node(
        DictConfig(c["trainer"]),
        _convert_="partial",
        **hardware,
        plugins=plugins,
        max_steps=prepared.total_steps,
        max_epochs=inputs.recipe["epochs"],
        accumulate_grad_batches=inputs.accumulate,
        logger=loggers or False,
        enable_checkpointing=False,
        limit_val_batches=0,
        default_root_dir=str(run_dir),
        # SIGTERM / SIGINT: stop at the end of the optimiser step; a fine-tune is short and
        # keeps no checkpoints to resume from, so it is run again
        callbacks=[StopAtSafePoint(hint="fine-tuning does not resume: run the command again")],
    )
    start = time.perf_counter()
    with stopping.at_safe_points():
        trainer.fit(task, train_dataloaders=loader)
    stopping.set_context(f" after fine-tuning finished at step {trainer.global_step}")
    stopping.check()
    seconds = time.perf_counter() - start
    checkpoint = run_dir / "checkpoints" / "final.ckpt"
    trainer.save_checkpoint(checkpoint)
    losses = task.losses()
    tenth = max(1, len(losses) // 10)
    facts = {
        "steps": trainer.global_step,
        "fit_seconds": round(seconds, 3),
        "train_loss_first": sum(losses[:tenth]) / tenth if losses else None,
        "train_loss_last": sum(losses[-tenth:]) / tenth if losses else None,
        "new_keys": new,
        "checkpoint": str(checkpoint),
    }
    return task, trainer, facts


def logits(task: Any, tensors: Mapping[str, Any], batch_size: int, autocast: Any = None) -> Any:
    """The task's outputs over ``tensors`` in batches, as numpy (float32): SQuAD a pair of
    ``[N,S]`` start/end arrays, classification ``[N,labels]``."""
    import contextlib

    import torch

    task.eval()
    device = next(task.parameters()).device
    n = int(tensors["input_ids"].shape[0])
    outs: list[Any] = []
    with torch.no_grad(), autocast if autocast is not None else contextlib.nullcontext():
        for start in range(0, n, batch_size):
            batch = {k: v[start : start + batch_size].to(device) for k, v in tensors.items()}
            out = task(batch)
            outs.append(
                tuple(o.float().cpu() for o in out) if isinstance(out, tuple) else out.float().cpu()
            )
    if outs and isinstance(outs[0], tuple):
        return tuple(torch.cat(parts).numpy() for parts in zip(*outs, strict=True))
    return torch.cat(outs).numpy()


def predict_squad(
    task: Any, examples: list[Any], tokenizer: Any, recipe: Mapping[str, Any], autocast: Any = None
) -> dict[str, Any]:
    """Question id -> :class:`~omnibert.finetune.squad.Prediction`."""
    from omnibert.finetune.squad import best_answers

    feats = features("squad", examples, tokenizer, recipe, training=False)
    start, end = logits(task, _tensors("squad", feats, False), recipe["eval_batch_size"], autocast)
    return best_answers(
        examples, feats, start, end, recipe["n_best_size"], recipe["max_answer_length"]
    )


def predict_pairs(
    task: Any, examples: list[Any], tokenizer: Any, recipe: Mapping[str, Any], autocast: Any = None
) -> list[int]:
    feats = features("glue_mrpc", examples, tokenizer, recipe, training=False)
    out = logits(task, _tensors("glue_mrpc", feats, False), recipe["eval_batch_size"], autocast)
    return [int(x) for x in out.argmax(-1)]


def evaluate(prepared: Prepared, task: Any, run_dir: Path) -> dict[str, Any]:
    """Predictions on the eval file, the official metrics and the submission file."""
    inputs = prepared.inputs
    recipe, examples = inputs.recipe, inputs.eval
    if not examples:
        return {}
    autocast = prepared.plugin.autocast(str(inputs.c["trainer"].get("precision")))
    if recipe["format"] == "squad":
        from omnibert.finetune.squad import write_predictions
        from omnibert.finetune.squad_metric import squad_scores

        predictions = predict_squad(task, examples, prepared.tokenizer, recipe, autocast)
        write_predictions(run_dir / "predictions.json", predictions)
        data = json.loads(Path(inputs.c["data"]["eval_file"]).read_text(encoding="utf-8"))["data"]
        scores = squad_scores(data, {k: p.text for k, p in predictions.items()})
        return {
            "exact_match": scores["exact_match"],
            "f1": scores["f1"],
            "questions": scores["questions"],
        }
    from omnibert.finetune.glue import accuracy_f1, write_submission

    labels_known = all(e.label is not None for e in examples)
    predicted = predict_pairs(task, examples, prepared.tokenizer, recipe, autocast)
    write_submission(run_dir / "MRPC.tsv", predicted)
    if not labels_known:
        return {"pairs": len(predicted)}
    return {**accuracy_f1(predicted, [e.label for e in examples]), "pairs": len(predicted)}


def run(cfg: DictConfig) -> dict[str, Any]:
    """Prepare, fit, evaluate; ``summary.json`` in the run directory; returns the summary."""
    from omnibert import stopping

    stopping.set_context(" before fine-tuning started")
    prepared = prepare(cfg)
    c = prepared.inputs.c
    run_dir = Path(c["paths"]["run_dir"])
    print(
        f"omnibert-finetune: {c['task']['name']} from {c['model']['init_from']}: "
        f"{len(prepared.inputs.train)} training examples -> {prepared.num_train_features} "
        f"features, {prepared.steps_per_epoch} steps/epoch x {prepared.inputs.recipe['epochs']} "
        f"epochs = {prepared.total_steps} steps (batch {prepared.inputs.recipe['batch_size']}, "
        f"micro {prepared.inputs.micro_batch_size}, accumulation {prepared.inputs.accumulate})",
        flush=True,
    )
    task, trainer, facts = fit(prepared, run_dir)
    if not trainer.is_global_zero:
        return {}
    metrics = evaluate(prepared, task, run_dir)
    metric_values = {k: v for k, v in metrics.items() if k not in ("questions", "pairs")}
    summary = {
        "task": c["task"]["name"],
        "run_name": c["run_name"],
        "seed": c["seed"],
        "init_from": str(c["model"]["init_from"]),
        "train_examples": len(prepared.inputs.train),
        "train_features": prepared.num_train_features,
        "eval_examples": len(prepared.inputs.eval or []),
        **metric_values,
        "metrics": metric_values,
        **facts,
        "run_dir": str(run_dir),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
