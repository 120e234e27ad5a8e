"""Unpadded pretraining rows → the static-shape batch every model and accelerator consumes.

A batch always holds every key of :data:`BATCH_KEYS` with shapes fixed by the settings
(``S = max_seq_length``, ``P = max_predictions_per_seq``, ``K = 1`` sequence per row since
rows are not packed), so one compiled graph serves every step::

    input_ids, segment_ids, position_ids, sequence_ids    [B,S] int64
    masked_lm_positions, masked_lm_ids                     [B,P] int64
    masked_lm_weights                                      [B,P] float32
    nsp_positions, nsp_labels                              [B,K] int64
    nsp_weights                                            [B,K] float32

Rows arrive either as a list of dicts (``input_ids`` ... ``next_sentence_label``) or as a
:class:`RowBlock` (an Arrow table of the rows, what :class:`ArrowRows` gives in one
``take``). Both are turned into flat value arrays plus per-row lengths and scattered into
the padded arrays with one boolean-mask assignment per key: no Python loop over tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import torch

__all__ = ["BATCH_KEYS", "ROW_KEYS", "ArrowRows", "CollateError", "PretrainingCollator", "RowBlock"]

BATCH_KEYS = (
    "input_ids",
    "segment_ids",
    "position_ids",
    "sequence_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "nsp_positions",
    "nsp_labels",
    "nsp_weights",
)
ROW_KEYS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids")
LABEL_KEY = "next_sentence_label"

IntArray = npt.NDArray[np.int64]
_TORCH_DTYPES: dict[type[np.generic], torch.dtype] = {
    np.int64: torch.int64,
    np.float32: torch.float32,
}


class CollateError(ValueError):
    """A row does not fit the batch settings; the message names the row and the fix."""


@dataclass(frozen=True)
class RowBlock:
    """Rows fetched in one Arrow ``take``: ``indices[i]`` is the dataset index of row i."""

    indices: IntArray
    table: pa.Table

    def __len__(self) -> int:
        return len(self.indices)


class ArrowRows(torch.utils.data.Dataset[dict[str, Any]]):
    """A map-style dataset over a Hugging Face ``datasets.Dataset`` of unpadded rows whose
    ``__getitems__`` (what the DataLoader calls with a batch of indices) returns a
    :class:`RowBlock` from one Arrow gather instead of building a Python dict per row.
    Picklable: a memory-mapped dataset pickles as its file paths."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._arrow = dataset.with_format("arrow")

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row: dict[str, Any] = self.dataset[int(index)]
        return row

    def __getitems__(self, indices: Sequence[int]) -> RowBlock:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return RowBlock(idx, self._arrow[idx.tolist()] if idx.size else self._arrow[0:0])


def _ragged_from_arrow(column: pa.ChunkedArray | pa.Array) -> tuple[IntArray, IntArray]:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    lengths = np.asarray(array.value_lengths().fill_null(0), dtype=np.int64)
    values = np.asarray(array.flatten().to_numpy(zero_copy_only=False), dtype=np.int64)
    return values, lengths


def _ragged_from_rows(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[IntArray, IntArray]:
    parts = [np.asarray(row[key], dtype=np.int64).reshape(-1) for row in rows]
    lengths = np.fromiter((p.size for p in parts), dtype=np.int64, count=len(parts))
    values = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return values, lengths


def _layout(size: int, s: int, p: int) -> dict[str, tuple[tuple[int, int], type[np.generic]]]:
    """Shape and dtype of every batch key, int64 keys first (so all stay 8-byte aligned)."""
    int_widths = {"masked_lm_positions": p, "masked_lm_ids": p, "nsp_positions": 1}
    int_widths["nsp_labels"] = 1
    out: dict[str, tuple[tuple[int, int], type[np.generic]]] = {}
    for key in BATCH_KEYS:
        if key not in ("masked_lm_weights", "nsp_weights"):
            out[key] = ((size, int_widths.get(key, s)), np.int64)
    out["masked_lm_weights"] = ((size, p), np.float32)
    out["nsp_weights"] = ((size, 1), np.float32)
    return out


def _allocate(size: int, s: int, p: int) -> tuple[npt.NDArray[np.uint8], dict[str, Any]]:
    """One zeroed byte buffer and the batch arrays as views into it. A DataLoader worker
    then hands the main process one shared-memory block per batch instead of one per key
    (about 4x less inter-process overhead per batch)."""
    layout = _layout(size, s, p)
    nbytes = {k: shape[0] * shape[1] * np.dtype(dt).itemsize for k, (shape, dt) in layout.items()}
    buffer = np.zeros(sum(nbytes.values()), dtype=np.uint8)
    arrays, offset = {}, 0
    for key, (shape, dtype) in layout.items():
        arrays[key] = buffer[offset : offset + nbytes[key]].view(dtype).reshape(shape)
        offset += nbytes[key]
    return buffer, arrays


def _scatter(out: IntArray, values: IntArray, lengths: IntArray) -> None:
    """Write ragged rows (flat values + lengths) into the zeroed ``out`` row by row."""
    out[: lengths.size][np.arange(out.shape[1])[None, :] < lengths[:, None]] = values


class PretrainingCollator:
    """Turns unpadded rows into the static-shape batch (see the module docstring).

    ``batch_size`` (evaluation) pads a short batch up to that size with all-zero rows whose
    ``masked_lm_weights`` and ``nsp_weights`` are 0, so metrics over a whole eval set stay
    exact while every batch keeps the same shape. Plain data only, hence picklable.
    """

    def __init__(
        self, max_seq_length: int, max_predictions_per_seq: int, batch_size: int | None = None
    ) -> None:
        if max_seq_length < 1 or max_predictions_per_seq < 1:
            raise ValueError(
                f"max_seq_length={max_seq_length} and max_predictions_per_seq="
                f"{max_predictions_per_seq} must both be positive."
            )
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be positive (or None for training).")
        self.max_seq_length = max_seq_length
        self.max_predictions_per_seq = max_predictions_per_seq
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return (
            f"PretrainingCollator(max_seq_length={self.max_seq_length}, "
            f"max_predictions_per_seq={self.max_predictions_per_seq}, "
            f"batch_size={self.batch_size})"
        )

    def __call__(self, rows: RowBlock | Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        buffer, arrays = self._collate(rows)
        shared = torch.from_numpy(buffer)
        batch, offset = {}, 0
        for key, array in arrays.items():  # views of one storage, in the buffer's order
            view = shared[offset : offset + array.nbytes].view(_TORCH_DTYPES[array.dtype.type])
            batch[key] = view.view(array.shape)
            offset += array.nbytes
        return {key: batch[key] for key in BATCH_KEYS}

    def collate_numpy(
        self, rows: RowBlock | Sequence[Mapping[str, Any]]
    ) -> dict[str, npt.NDArray[Any]]:
        """The batch as numpy arrays (what ``__call__`` returns as tensors)."""
        arrays = self._collate(rows)[1]
        return {key: arrays[key] for key in BATCH_KEYS}

    def _collate(
        self, rows: RowBlock | Sequence[Mapping[str, Any]]
    ) -> tuple[npt.NDArray[np.uint8], dict[str, npt.NDArray[Any]]]:
        ragged: dict[str, tuple[IntArray, IntArray]]
        if isinstance(rows, RowBlock):
            indices: IntArray | None = rows.indices
            ragged = {k: _ragged_from_arrow(rows.table.column(k)) for k in ROW_KEYS}
            labels = np.asarray(rows.table.column(LABEL_KEY).to_numpy(), dtype=np.int64)
        else:
            indices = None
            ragged = {k: _ragged_from_rows(rows, k) for k in ROW_KEYS}
            labels = np.fromiter((int(r[LABEL_KEY]) for r in rows), np.int64, count=len(rows))
        n = labels.size
        size = self.batch_size if self.batch_size is not None else n
        if n > size:
            raise CollateError(
                f"got {n} rows for an evaluation batch of batch_size={size}; the batch sampler "
                "must not yield more rows than the collator's batch_size."
            )
        self._validate(ragged, labels, indices)

        s, p = self.max_seq_length, self.max_predictions_per_seq
        buffer, out = _allocate(size, s, p)
        seq_lengths, mlm_counts = ragged["input_ids"][1], ragged["masked_lm_positions"][1]
        for key in ROW_KEYS:
            _scatter(out[key], *ragged[key])
        real_tokens = np.arange(s)[None, :] < seq_lengths[:, None]
        out["position_ids"][:n] = np.where(real_tokens, np.arange(s)[None, :], 0)
        out["sequence_ids"][:n] = real_tokens
        out["masked_lm_weights"][:n] = np.arange(p)[None, :] < mlm_counts[:, None]
        out["nsp_labels"][:n, 0] = labels
        out["nsp_weights"][:n] = 1.0
        return buffer, out

    def _validate(
        self,
        ragged: Mapping[str, tuple[IntArray, IntArray]],
        labels: IntArray,
        indices: IntArray | None,
    ) -> None:
        """Raise :class:`CollateError` for the first row that breaks the settings."""
        s, p = self.max_seq_length, self.max_predictions_per_seq
        seq_lengths = ragged["input_ids"][1]
        mlm_counts = ragged["masked_lm_positions"][1]

        def name(i: int) -> str:
            if indices is None:
                return f"row {i} of the batch"
            return f"row {int(indices[i])} of the dataset"

        def first(bad: npt.NDArray[np.bool_]) -> int | None:
            hits = np.flatnonzero(bad)
            return int(hits[0]) if hits.size else None

        if (i := first(seq_lengths > s)) is not None:
            raise CollateError(
                f"{name(i)} has {int(seq_lengths[i])} tokens, more than max_seq_length={s}; "
                "set max_seq_length to the value the data was prepared with."
            )
        if (i := first(mlm_counts > p)) is not None:
            raise CollateError(
                f"{name(i)} has {int(mlm_counts[i])} masked positions, more than "
                f"max_predictions_per_seq={p}; set max_predictions_per_seq to the value the "
                "data was prepared with."
            )
        for key, like, what in (
            ("segment_ids", seq_lengths, "input_ids"),
            ("masked_lm_ids", mlm_counts, "masked_lm_positions"),
        ):
            if (i := first(ragged[key][1] != like)) is not None:
                raise CollateError(
                    f"{name(i)} has {int(ragged[key][1][i])} {key} for {int(like[i])} {what}; "
                    "the data is corrupt, re-create it."
                )
        positions = ragged["masked_lm_positions"][0]
        if positions.size:
            row_of = np.repeat(np.arange(seq_lengths.size), mlm_counts)
            outside = (positions < 0) | (positions >= seq_lengths[row_of])
            if (j := first(outside)) is not None:
                i = int(row_of[j])
                raise CollateError(
                    f"{name(i)} masks position {int(positions[j])}, outside its "
                    f"{int(seq_lengths[i])} tokens; the data is corrupt, re-create it."
                )
        if (i := first((labels < 0) | (labels > 1))) is not None:
            raise CollateError(
                f"{name(i)} has next_sentence_label={int(labels[i])}, not 0 or 1; the data is "
                "corrupt, re-create it."
            )
