"""GLUE MRPC: the TSV files, sentence-pair features, accuracy / F1 and the submission file.

The files are GLUE's ``train.tsv`` / ``dev.tsv`` (header ``Quality  #1 ID  #2 ID  #1 String
#2 String``, label 1 = paraphrase) or ``test.tsv`` (``index`` instead of ``Quality``, no
labels). Sentences hold bare quote characters, so the files are read with
``csv.QUOTE_NONE``: a ``"`` is text, never a field delimiter. A pair is
``[CLS] #1 [SEP] #2 [SEP]``, cut longest-first to ``max_seq_length`` (BERT's
``_truncate_seq_pair``). The submission is GLUE's ``MRPC.tsv``: ``index<TAB>prediction``
under that header, one row per pair in file order.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = [
    "MRPC_HEADER",
    "PairExample",
    "accuracy_f1",
    "pair_features",
    "read_mrpc",
    "write_submission",
]

MRPC_HEADER = ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")
TEST_HEADER = ("index", "#1 ID", "#2 ID", "#1 String", "#2 String")


@dataclass(frozen=True)
class PairExample:
    index: int
    first: str
    second: str
    label: int | None


def read_mrpc(path: str | Path, key: str, training: bool) -> list[PairExample]:
    """The pairs of a GLUE MRPC TSV; one sentence naming ``key`` and the fix when the file is
    missing or not MRPC-shaped (training needs labels)."""
    path = Path(path)
    if not path.is_file():
        raise FineTuneInputError(
            f"{key}={path} does not exist; download GLUE MRPC (README: Fine-tuning and "
            "inference) or point it at its train.tsv / dev.tsv."
        )
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    except UnicodeDecodeError as err:
        raise FineTuneInputError(f"{key}={path} is not UTF-8 text; pass GLUE's MRPC TSV.") from err
    header = tuple(rows[0]) if rows else ()
    if header not in (MRPC_HEADER, TEST_HEADER):
        raise FineTuneInputError(
            f"{key}={path} does not start with GLUE's MRPC header ({', '.join(MRPC_HEADER)}, "
            "tab-separated); task=mrpc reads GLUE's MRPC TSV (a SQuAD JSON needs task=squad)."
        )
    labelled = header == MRPC_HEADER
    if training and not labelled:
        raise FineTuneInputError(
            f"{key}={path} is a test file without labels (header starts with 'index'); "
            "train on GLUE's train.tsv."
        )
    examples: list[PairExample] = []
    for number, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != 5:
            raise FineTuneInputError(
                f"{key}={path} line {number} has {len(row)} tab-separated fields, not 5; fix "
                "the line or re-download the file."
            )
        label = None
        if labelled:
            if row[0] not in ("0", "1"):
                raise FineTuneInputError(
                    f"{key}={path} line {number} has Quality={row[0]!r}; it must be 0 or 1."
                )
            label = int(row[0])
        examples.append(PairExample(len(examples), row[3], row[4], label))
    if not examples:
        raise FineTuneInputError(f"{key}={path} holds no pairs; pass a non-empty MRPC TSV.")
    return examples


def _truncate_pair(first: list[int], second: list[int], budget: int) -> None:
    while len(first) + len(second) > budget:
        (first if len(first) > len(second) else second).pop()


def pair_features(
    examples: Sequence[PairExample], tokenizer: Any, max_seq_length: int = 128
) -> dict[str, np.ndarray]:
    """``input_ids``, ``segment_ids``, ``attention_mask`` ``[N,S]`` and ``labels`` ``[N]``
    (-1 when unlabelled)."""
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    pad_id = tokenizer.token_to_id("[PAD]")
    firsts = tokenizer.encode_batch([e.first for e in examples], add_special_tokens=False)
    seconds = tokenizer.encode_batch([e.second for e in examples], add_special_tokens=False)
    n = len(examples)
    ids = np.full((n, max_seq_length), pad_id, dtype=np.int64)
    segments = np.zeros((n, max_seq_length), dtype=np.int64)
    mask = np.zeros((n, max_seq_length), dtype=np.int64)
    for row, (a, b) in enumerate(zip(firsts, seconds, strict=True)):
        first, second = list(a.ids), list(b.ids)
        _truncate_pair(first, second, max_seq_length - 3)
        tokens = [cls_id, *first, sep_id, *second, sep_id]
        ids[row, : len(tokens)] = tokens
        segments[row, len(first) + 2 : len(tokens)] = 1
        mask[row, : len(tokens)] = 1
    labels = np.asarray([-1 if e.label is None else e.label for e in examples], dtype=np.int64)
    return {"input_ids": ids, "segment_ids": segments, "attention_mask": mask, "labels": labels}


def accuracy_f1(predictions: Sequence[int], labels: Sequence[int]) -> dict[str, float]:
    """Accuracy and the F1 of the positive class (1 = paraphrase), on the 0-1 scale as GLUE
    reports MRPC; F1 is 0 when there is no true positive."""
    if len(predictions) != len(labels) or not labels:
        raise ValueError("predictions and labels must be non-empty and of equal length")
    pairs = list(zip(predictions, labels, strict=True))
    tp = sum(1 for p, y in pairs if p == 1 and y == 1)
    fp = sum(1 for p, y in pairs if p == 1 and y == 0)
    fn = sum(1 for p, y in pairs if p == 0 and y == 1)
    correct = sum(1 for p, y in pairs if p == y)
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    return {"accuracy": correct / len(pairs), "f1": f1}


def write_submission(path: Path, predictions: Sequence[int]) -> None:
    """GLUE's ``MRPC.tsv``: ``index<TAB>prediction`` under that header."""
    lines = ["index\tprediction", *(f"{i}\t{int(p)}" for i, p in enumerate(predictions))]
    path.write_text("\n".join(lines) + "\n")
