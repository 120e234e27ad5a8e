"""A fine-tuned model's outputs over a split and the task's predictions from them, the same
at any batch size and padding: what a fine-tuning run's evaluation, ``omnibert-predict`` and
the benchmarks read."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnibert.config.finetune import Recipe
from omnibert.finetune.batching import TrimPadding, length_order

__all__ = ["evaluate_finetuned", "logits", "predict_outputs"]


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
    recipe: Recipe,
    autocast: Any,
    trim: Any = None,
    progress: Any = None,
) -> tuple[list[Any], Any]:
    """One prediction per example of ``dataset`` (the task's own post-processing) and the
    head's outputs they came from (per feature: SQuAD's ``(start, end)`` logits, GLUE's
    ``[N, num_labels]``); ``trim`` and ``progress`` as in :func:`logits`."""
    feats = data.features(dataset, tokenizer, recipe.plain(), training=False)
    outputs = logits(task, feats.tensors, recipe.eval_batch_size, autocast, trim, progress)
    return list(data.predict(dataset, feats, outputs, recipe.plain())), outputs


def evaluate_finetuned(
    inputs: Any, tokenizer: Any, task: Any, autocast: Any, run_dir: Path
) -> dict[str, Any]:
    """Predictions of ``task`` on every eval split of the checked ``inputs``
    (:class:`~omnibert.run.finetuning.inputs.FinetuneInputs`: metrics, files under ``eval/``) and
    test split (submission files under ``submission/``)."""
    data, recipe = inputs.data, inputs.recipe
    trim = TrimPadding.of(inputs.config.data)
    metrics: dict[str, float] = {}
    files: dict[str, str] = {}
    several = len(inputs.evals) > 1
    for name, dataset in inputs.evals.items():
        predicted, _ = predict_outputs(data, task, dataset, tokenizer, recipe, autocast, trim)
        files[f"eval:{name}"] = str(data.write(run_dir / "eval", name, dataset, predicted))
        if data.has_labels(dataset):
            for key, value in data.scores(dataset, predicted).items():
                metrics[f"{key}_{name}" if several else key] = value
    for name, dataset in inputs.tests.items():
        predicted, _ = predict_outputs(data, task, dataset, tokenizer, recipe, autocast, trim)
        files[f"test:{name}"] = str(data.write(run_dir / "submission", name, dataset, predicted))
    return {"metrics": metrics, "files": files}
