"""GLUE: the nine tasks' data (Hub ``nyu-mll/glue`` or the original TSV files), features,
predictions, metrics and submission files, configured per task by ``conf/task/<task>.yaml``
(``task.data``: :class:`GlueData`).

* **Columns** are the Hub's: ``sentence`` (CoLA, SST-2), ``sentence1``/``sentence2`` (MRPC,
  STS-B, RTE, WNLI), ``question1``/``question2`` (QQP), ``premise``/``hypothesis`` (MNLI,
  AX), ``question``/``sentence`` (QNLI), ``label`` (a class id, -1 in test splits; STS-B a
  float score) and ``idx``.
* **Features**: ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``, the pair cut longest-first to
  ``max_seq_length`` (BERT's ``_truncate_seq_pair``), segment 1 on ``b``.
* **Predictions**: the argmax class, or STS-B's regression output (``num_labels: 1``).
* **Metrics**: :mod:`omnibert.finetune.glue_metrics`.
* **Submission**: ``<Name>.tsv`` (``CoLA.tsv``, ``SST-2.tsv``, ``MNLI-m.tsv``, ``AX.tsv``, ...):
  ``index<TAB>prediction`` under that header, the label written as the GLUE server takes it
  (``task.data.submission_labels``: MNLI/AX/QNLI/RTE by name, the others by number; STS-B a
  score, every digit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from omnibert.finetune.glue_metrics import compute
from omnibert.finetune.glue_tsv import read_glue_tsv
from omnibert.finetune.spec import Features, TaskData
from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = ["GlueData", "text_features"]


def _truncate_pair(first: list[int], second: list[int], budget: int) -> None:
    while len(first) + len(second) > budget:
        (first if len(first) > len(second) else second).pop()


def text_features(
    tokenizer: Any,
    firsts: Sequence[str],
    seconds: Sequence[str] | None,
    max_seq_length: int,
) -> dict[str, np.ndarray]:
    """``input_ids``, ``segment_ids``, ``attention_mask`` ``[N,S]`` of single sentences or
    pairs, padded to ``max_seq_length``."""
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    pad_id = tokenizer.token_to_id("[PAD]")
    a_enc = tokenizer.encode_batch(list(firsts), add_special_tokens=False)
    b_enc = (
        tokenizer.encode_batch(list(seconds), add_special_tokens=False)
        if seconds is not None
        else None
    )
    n = len(a_enc)
    ids = np.full((n, max_seq_length), pad_id, dtype=np.int64)
    segments = np.zeros((n, max_seq_length), dtype=np.int64)
    mask = np.zeros((n, max_seq_length), dtype=np.int64)
    for row in range(n):
        first = list(a_enc[row].ids)
        if b_enc is None:
            first = first[: max_seq_length - 2]
            tokens = [cls_id, *first, sep_id]
        else:
            second = list(b_enc[row].ids)
            _truncate_pair(first, second, max_seq_length - 3)
            tokens = [cls_id, *first, sep_id, *second, sep_id]
            segments[row, len(first) + 2 : len(tokens)] = 1
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
    return {"input_ids": ids, "segment_ids": segments, "attention_mask": mask}


class GlueData(TaskData):
    """One GLUE task's data (module docstring).

    Args (beyond :class:`~omnibert.finetune.spec.TaskData`'s):
        text_columns: the Hub columns fed to the model: one (a sentence) or two (a pair).
        label_names: the Hub's class names, in id order; ``None`` for STS-B's scores.
        tsv: ``{Hub column: TSV column}`` of the original files (a header name, or a position
            for files without a header).
        tsv_test: the test file's ``{Hub column: header name}`` when only it has a header (CoLA).
        submission_labels: how the GLUE server wants each class written (``None``: its id).
    """

    def __init__(
        self,
        task: str,
        text_columns: Sequence[str],
        tsv: Mapping[str, str | int],
        label_names: Sequence[str] | None = None,
        submission_labels: Sequence[str] | None = None,
        tsv_test: Mapping[str, str] | None = None,
        hub: str = "nyu-mll/glue",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("benchmark", "glue")
        super().__init__(task, hub, **kwargs)
        self.text_columns = list(text_columns)
        self.label_names = None if label_names is None else list(label_names)
        self.tsv = dict(tsv)
        self.tsv_test = None if tsv_test is None else dict(tsv_test)
        self.submission_labels = None if submission_labels is None else list(submission_labels)

    @property
    def regression(self) -> bool:
        return self.label_names is None

    # ---------------------------------------------------------------- reader
    def read_file(self, path: Path, key: str) -> Any:
        import datasets  # lazy: datasets takes most of a second to import

        columns = read_glue_tsv(
            path, key, self.task, self.tsv, self.text_columns, self.label_names, self.tsv_test
        )
        features = {c: datasets.Value("string") for c in self.text_columns}
        features["label"] = (
            datasets.Value("float32")
            if self.label_names is None
            else datasets.ClassLabel(names=self.label_names)
        )
        features["idx"] = datasets.Value("int32")
        if self.label_names is not None and -1 in columns["label"]:
            features["label"] = datasets.Value("int64")  # a test file: -1, as on the Hub
        return datasets.Dataset.from_dict(columns, features=datasets.Features(features))

    def check(self, dataset: Any, where: str, labelled: bool) -> None:
        import datasets  # lazy: datasets takes most of a second to import

        need = [*self.text_columns, "label"]
        missing = [c for c in need if c not in dataset.column_names]
        if missing:
            raise FineTuneInputError(
                f"{where} has the columns ({', '.join(dataset.column_names)}), not task="
                f"{self.task}'s ({', '.join(need)}, as {self.hub} {self.config}); pass "
                f"{self.task}'s data or choose the task that matches it."
            )
        feature = dataset.features["label"]
        names = getattr(feature, "names", None)
        if self.regression and isinstance(feature, datasets.ClassLabel):
            raise FineTuneInputError(
                f"{where} has class labels ({', '.join(names or [])}); task={self.task} is a "
                "regression task (similarity scores): pass its own data."
            )
        if names is not None and self.label_names is not None and list(names) != self.label_names:
            raise FineTuneInputError(
                f"{where} has the labels ({', '.join(names)}), not task={self.task}'s "
                f"({', '.join(self.label_names)}): it is another task's data; pass "
                f"{self.task}'s or choose the task that matches it."
            )
        if not self.regression and str(getattr(feature, "dtype", "")).startswith("float"):
            raise FineTuneInputError(
                f"{where} has float labels (scores); task={self.task} is a classification "
                f"task: STS-B's scores need task=stsb."
            )
        labels = np.asarray(dataset["label"])
        if not labelled:
            return
        if len(labels) == 0:
            raise FineTuneInputError(f"{where} holds no examples; pass a non-empty split.")
        if self.regression:
            if np.any(labels < 0):
                raise FineTuneInputError(
                    f"{where} has no scores (label -1: a test split); train and evaluate on "
                    "labelled splits."
                )
            return
        bad = labels[(labels < 0) | (labels >= len(self.label_names or []))]
        if bad.size:
            raise FineTuneInputError(
                f"{where} has the label value {int(bad[0])}"
                + (" (a test split without labels)" if int(bad[0]) == -1 else "")
                + f"; task={self.task}'s labels are 0..{len(self.label_names or []) - 1} "
                f"({', '.join(self.label_names or [])}): pass a labelled split of its data."
            )

    def has_labels(self, dataset: Any) -> bool:
        labels = np.asarray(dataset["label"])
        return bool(labels.size) and not bool(np.any(labels == -1))

    # -------------------------------------------------------------- features
    def features(
        self, dataset: Any, tokenizer: Any, recipe: Mapping[str, Any], training: bool
    ) -> Features:
        # lazy: omnibert.finetune is numpy-only until tensors are handed out (its docstring)
        import torch

        columns = [dataset[c] for c in self.text_columns]
        arrays = text_features(
            tokenizer, columns[0], columns[1] if len(columns) > 1 else None,
            int(recipe["max_seq_length"]),
        )  # fmt: skip
        tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
        if training:
            dtype = torch.float32 if self.regression else torch.int64
            tensors["labels"] = torch.as_tensor(np.asarray(dataset["label"]), dtype=dtype)
        return Features(tensors)

    # ----------------------------------------------------------- predictions
    def predict(
        self, dataset: Any, features: Features, outputs: Any, recipe: Mapping[str, Any]
    ) -> list[Any]:
        out = np.asarray(outputs)
        if self.regression:
            return [float(x) for x in out.reshape(len(out), -1)[:, 0]]
        return [int(x) for x in out.argmax(-1)]

    def scores(self, dataset: Any, predictions: Sequence[Any]) -> dict[str, float]:
        return compute(self.metrics, predictions, list(dataset["label"]))

    def write(self, directory: Path, name: str, dataset: Any, predictions: Sequence[Any]) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.tsv"
        lines = ["index\tprediction"]
        for index, value in zip(dataset["idx"], predictions, strict=True):
            if self.regression:
                text = repr(float(value))  # every digit: the metrics are computed from these
            elif self.submission_labels is not None:
                text = self.submission_labels[int(value)]
            else:
                text = str(int(value))
            lines.append(f"{int(index)}\t{text}")
        path.write_text("\n".join(lines) + "\n")
        return path
