"""The on-disk contract between ``omnibert-prepare`` and training: an output directory's
columns, their Arrow types and the ``metadata.json`` that marks it complete.

A complete directory holds ``data-PPPPP-KKKKK.arrow`` files (HF ``datasets``), its
``state.json`` / ``dataset_info.json`` and ``metadata.json`` (settings, hashes, counts,
length histogram), written last. Rows are **unpadded**: token ids uint16 (int32 for vocabs
over 65,536), segments int8, masked positions uint16, the next-sentence label int8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np

METADATA_FILE = "metadata.json"
FORMAT_NAME = "omnibert-pretraining"
FORMAT_VERSION = 1
COLUMNS = (
    "input_ids",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "next_sentence_label",
)


def id_dtype(vocab_size: int) -> str:
    """Smallest Arrow integer type that holds every token id."""
    return "uint16" if vocab_size <= 1 << 16 else "int32"


def features(vocab_size: int, max_seq_length: int) -> datasets.Features:
    """The ``datasets`` features of the columns for this vocab and sequence length."""
    ids = datasets.Value(id_dtype(vocab_size))
    position = datasets.Value("uint16" if max_seq_length <= 1 << 16 else "int32")
    return datasets.Features(
        {
            "input_ids": datasets.List(ids),
            "segment_ids": datasets.List(datasets.Value("int8")),
            "masked_lm_positions": datasets.List(position),
            "masked_lm_ids": datasets.List(ids),
            "next_sentence_label": datasets.Value("int8"),
        }
    )


@dataclass
class RowStats:
    """Counts over the rows a dataset keeps (all instances, or the first N for eval), as
    ``metadata.json`` records them (``counts``, ``sequence_length_histogram``)."""

    rows: int
    masked: int
    random_next: int
    histogram: np.ndarray

    @classmethod
    def from_dataset(cls, dataset: Any, max_seq_length: int) -> RowStats:
        """The counts over every row of a ``datasets.Dataset`` with these columns."""
        table = dataset.data
        lengths = np.asarray(table.column("input_ids").combine_chunks().value_lengths())
        masked = table.column("masked_lm_positions").combine_chunks().value_lengths()
        labels = np.asarray(table.column("next_sentence_label").combine_chunks())
        return cls(
            rows=len(dataset),
            masked=int(np.asarray(masked).sum()),
            random_next=int(labels.sum()),
            histogram=np.bincount(lengths.astype(np.int64), minlength=max_seq_length + 1),
        )
