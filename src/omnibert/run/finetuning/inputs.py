"""A fine-tuning run's inputs, checked before torch is imported: the task node and its data
(``task.data``, a :class:`~omnibert.finetune.spec.TaskData`), every split through
``datasets`` (checked for columns and labels), the output directory and the batch
arithmetic (:func:`check_inputs`). Every problem is one sentence naming the key and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omnibert.config import FinetuneConfig
from omnibert.config.finetune import Recipe
from omnibert.config.node import build
from omnibert.finetune.sources import file_for, load_split
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.paths import check_writable_dir

__all__ = ["FinetuneInputs", "check_inputs", "task_data"]


@dataclass
class FinetuneInputs:
    """The checked config, the task's data and its splits (``datasets.Dataset``)."""

    config: FinetuneConfig
    recipe: Recipe
    data: Any
    train: Any
    evals: dict[str, Any]
    tests: dict[str, Any]
    where: dict[str, str]
    micro_batch_size: int
    accumulate: int


def task_data(task: Any) -> Any:
    """The task's :class:`~omnibert.finetune.spec.TaskData` from its ``data`` node."""
    node = task.get("data")
    if not isinstance(node, dict) or "_target_" not in node:
        raise FineTuneInputError(
            f"the task config ({task.get('_target_')}) is not a fine-tuning task (no task.data "
            "with a _target_); use task=squad, task=mrpc or another GLUE task (conf/task/)."
        )
    return build(node, _convert_="all")


def _check_recipe(recipe: Recipe, data: Any) -> None:
    names = getattr(data, "label_names", None)
    if data.benchmark == "glue":
        wanted = 1 if names is None else len(names)
        if recipe.num_labels != wanted:
            raise FineTuneInputError(
                f"task.num_labels={recipe.num_labels} but task={data.task} has "
                f"{'a regression score' if names is None else f'{wanted} labels'}; set "
                f"task.num_labels={wanted}."
            )


def _splits(config: FinetuneConfig, data: Any, role: str) -> tuple[dict[str, Any], dict]:
    """The eval or test splits: from files when any file is configured (a run on local
    files never reaches the Hub), else from ``data.dataset`` / the task's Hub name."""
    source = config.data.source()
    splits = data.eval_splits if role == "eval" else data.test_splits
    key = f"{role}_file"
    given = source.get(key)
    if isinstance(given, dict) and set(given) - set(splits):
        unknown = ", ".join(sorted(set(given) - set(splits)))
        raise FineTuneInputError(
            f"data.{key} names {unknown}, which task={data.task} does not have; its "
            f"{role} splits are {', '.join(splits) or 'none'}."
        )
    out, where = {}, {}
    for position, (name, split) in enumerate(splits.items()):
        file, _ = file_for(source, role, name, position == 0)
        if file is None and config.data.local:
            continue
        out[name], where[f"{role}:{name}"] = load_split(
            data, source, role, name, split, position == 0
        )
        data.check(out[name], where[f"{role}:{name}"], labelled=role == "eval")
    return out, where


def check_inputs(config: FinetuneConfig) -> FinetuneInputs:
    """Everything checkable without torch: one sentence naming the key and the fix
    (``config``: the typed config the app built, ``FinetuneConfig.of`` of the composed one)."""
    data = task_data(config.task)
    recipe = config.recipe(FineTuneInputError)
    _check_recipe(recipe, data)
    if not config.model.init_from:
        raise FineTuneInputError(
            "model.init_from is not set; point it at a Hugging Face BERT directory, an "
            "omnibert .ckpt or a TF1 checkpoint prefix (+ model.bert_config=)."
        )
    check_writable_dir(config.paths.run_dir, "paths.run_dir")
    source = config.data.source()
    train, train_where = load_split(data, source, "train", "train", data.train_split)
    data.check(train, train_where, labelled=True)
    evals, where = _splits(config, data, "eval")
    tests: dict[str, Any] = {}
    if config.data.predict_test:
        tests, test_where = _splits(config, data, "test")
        where.update(test_where)
    world = config.accelerator.world_size
    micro = config.micro_batch_size or recipe.batch_size // world
    if micro < 1 or recipe.batch_size % (micro * world):
        raise FineTuneInputError(
            f"task.batch_size={recipe.batch_size} is not a multiple of micro_batch_size="
            f"{micro} x {world} device(s); choose a micro_batch_size that divides it."
        )
    return FinetuneInputs(
        config, recipe, data, train, evals, tests, {"train": train_where, **where}, micro,
        recipe.batch_size // (micro * world),
    )  # fmt: skip
