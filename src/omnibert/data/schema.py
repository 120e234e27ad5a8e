"""The on-disk contract between ``omnibert-prepare`` and training: an output directory's
columns, their Arrow types and the ``metadata.json`` that marks it complete.

A complete directory holds ``data-PPPPP-KKKKK.arrow`` files (HF ``datasets``), its
``state.json`` / ``dataset_info.json`` and ``metadata.json`` (settings, hashes, counts,
length histogram), written last. Rows are **unpadded**: token ids uint16 (int32 for vocabs
over 65,536), segments int8, masked positions uint16, the next-sentence label int8.
"""

from __future__ import annotations

import datasets

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
