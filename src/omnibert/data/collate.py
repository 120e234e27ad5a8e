"""Unpadded pretraining rows → the static-shape batch every model and accelerator consumes.

A batch always holds every key of :data:`BATCH_KEYS` with shapes fixed by the settings
(``S = max_seq_length``, ``P`` = masked positions per row, ``K`` = sequences per row: 1
unpacked), so one compiled graph serves every step::

    input_ids, segment_ids, position_ids, sequence_ids    [B,S] int64
    masked_lm_positions, masked_lm_ids                     [B,P] int64
    masked_lm_weights                                      [B,P] float32
    nsp_positions, nsp_labels                              [B,K] int64
    nsp_weights                                            [B,K] float32

Rows arrive either as a list of dicts (``input_ids`` ... ``next_sentence_label``) or as a
:class:`RowBlock` (an Arrow table of the rows, what :class:`ArrowRows` gives in one
``take``). Both are turned into flat value arrays plus per-row lengths and scattered into
the padded arrays with one fancy-index assignment per key: no Python loop over tokens.

Packed rows: a :class:`RowBlock` with ``pack_sizes`` lists its sequences pack by pack (what
a batch sampler that yields lists of packs, each a list of dataset indices, gets from
:meth:`ArrowRows.__getitems__`). Sequence k (0-based) of a pack is written after the
previous ones: ``sequence_ids`` k+1 over its tokens, ``position_ids`` restarting at 0, its
masked positions shifted by its offset in the row and listed after the previous
sequences' (``masked_lm_*`` slots fill from the left), and its [CLS] offset, label and
weight 1 in NSP slot k. Unused slots keep weight 0, so packing changes the number of rows,
never the loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import torch

from omnibert.data.rows import ArrowRows, CollateError, RowBlock, ShardMap, flatten_packs
from omnibert.models.bert import BATCH_KEYS

__all__ = [
    "BATCH_KEYS",
    "ROW_KEYS",
    "ArrowRows",
    "CollateError",
    "PretrainingCollator",
    "RowBlock",
    "flatten_packs",
]

ROW_KEYS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids")
LABEL_KEY = "next_sentence_label"

IntArray = npt.NDArray[np.int64]
_TORCH_DTYPES: dict[type[np.generic], torch.dtype] = {
    np.int64: torch.int64,
    np.float32: torch.float32,
}


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


def _layout(
    size: int, s: int, p: int, k: int
) -> dict[str, tuple[tuple[int, int], type[np.generic]]]:
    """Shape and dtype of every batch key, int64 keys first (so all stay 8-byte aligned)."""
    widths = {"masked_lm_positions": p, "masked_lm_ids": p, "nsp_positions": k, "nsp_labels": k}
    out: dict[str, tuple[tuple[int, int], type[np.generic]]] = {}
    for key in BATCH_KEYS:
        if key not in ("masked_lm_weights", "nsp_weights"):
            out[key] = ((size, widths.get(key, s)), np.int64)
    out["masked_lm_weights"] = ((size, p), np.float32)
    out["nsp_weights"] = ((size, k), np.float32)
    return out


def _allocate(size: int, s: int, p: int, k: int) -> tuple[npt.NDArray[np.uint8], dict[str, Any]]:
    """One zeroed byte buffer and the batch arrays as views into it. A DataLoader worker
    then hands the main process one shared-memory block per batch instead of one per key
    (one block to share and map instead of ten)."""
    layout = _layout(size, s, p, k)
    nbytes = {k: shape[0] * shape[1] * np.dtype(dt).itemsize for k, (shape, dt) in layout.items()}
    buffer = np.zeros(sum(nbytes.values()), dtype=np.uint8)
    arrays, offset = {}, 0
    for key, (shape, dtype) in layout.items():
        arrays[key] = buffer[offset : offset + nbytes[key]].view(dtype).reshape(shape)
        offset += nbytes[key]
    return buffer, arrays


def _starts(lengths: IntArray) -> IntArray:
    """Exclusive prefix sums: where each of the ragged parts begins."""
    out = np.zeros(lengths.size, dtype=np.int64)
    np.cumsum(lengths[:-1], out=out[1:])
    return out


@dataclass(frozen=True)
class _Layout:
    """Where every sequence of a (packed) batch goes: its row, slot and token offset."""

    row: IntArray  # per sequence: the batch row (pack) holding it
    slot: IntArray  # per sequence: 0-based place inside its pack
    offset: IntArray  # per sequence: first token column inside its row
    mask_offset: IntArray  # per sequence: first masked_lm slot inside its row
    row_tokens: IntArray  # per row: real tokens
    row_masks: IntArray  # per row: masked positions
    row_sequences: IntArray  # per row: sequences

    @staticmethod
    def of(pack_sizes: IntArray, seq_lengths: IntArray, mlm_counts: IntArray) -> _Layout:
        first = _starts(pack_sizes)  # per pack: index of its first sequence
        row = np.repeat(np.arange(pack_sizes.size), pack_sizes)
        slot = np.arange(row.size) - first[row]
        token_start, mask_start = _starts(seq_lengths), _starts(mlm_counts)
        offset = token_start - token_start[first][row]
        mask_offset = mask_start - mask_start[first][row]
        return _Layout(
            row=row,
            slot=slot,
            offset=offset,
            mask_offset=mask_offset,
            row_tokens=np.bincount(row, seq_lengths, minlength=pack_sizes.size).astype(np.int64),
            row_masks=np.bincount(row, mlm_counts, minlength=pack_sizes.size).astype(np.int64),
            row_sequences=pack_sizes,
        )


class PretrainingCollator:
    """Turns unpadded rows (or packs of them) into the static-shape batch (module docstring).

    ``max_predictions_per_seq`` bounds the masked positions of one sequence (what the data was
    prepared with); ``max_sequences_per_pack`` (K) and ``max_predictions_per_pack`` (P of the
    batch, default ``max_predictions_per_seq``) size packed rows. ``batch_size``
    (evaluation) pads a short batch up to that size with all-zero rows whose
    ``masked_lm_weights`` and ``nsp_weights`` are 0, so metrics over a whole eval set stay
    exact while every batch keeps the same shape. ``vocab_size`` (the data's vocab) bounds
    the token ids: with it, every batch's token, segment and masked-token ids, masked
    positions and next-sentence labels are range-checked before any model sees them (one
    vectorised comparison per array, in the loader worker: no device sync), and a row out of
    range raises :class:`CollateError` naming its shard file, its row there and the repair
    command. Plain data only, hence picklable.
    """

    def __init__(
        self,
        max_seq_length: int,
        max_predictions_per_seq: int,
        batch_size: int | None = None,
        *,
        max_sequences_per_pack: int = 1,
        max_predictions_per_pack: int | None = None,
        vocab_size: int | None = None,
        type_vocab_size: int = 2,
    ) -> None:
        if max_seq_length < 1 or max_predictions_per_seq < 1:
            raise ValueError(
                f"max_seq_length={max_seq_length} and max_predictions_per_seq="
                f"{max_predictions_per_seq} must both be positive."
            )
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be positive (or None for training).")
        per_pack = max_predictions_per_pack or max_predictions_per_seq
        if max_sequences_per_pack < 1 or per_pack < max_predictions_per_seq:
            raise ValueError(
                f"max_sequences_per_pack={max_sequences_per_pack} must be positive and "
                f"max_predictions_per_pack={per_pack} at least max_predictions_per_seq="
                f"{max_predictions_per_seq}."
            )
        self.max_seq_length = max_seq_length
        self.max_predictions_per_seq = max_predictions_per_seq
        self.batch_size = batch_size
        self.max_sequences_per_pack = max_sequences_per_pack
        self.max_predictions_per_pack = per_pack
        self.vocab_size = vocab_size
        self.type_vocab_size = type_vocab_size

    def __repr__(self) -> str:
        return (
            f"PretrainingCollator(max_seq_length={self.max_seq_length}, "
            f"max_predictions_per_seq={self.max_predictions_per_seq}, "
            f"batch_size={self.batch_size}, "
            f"max_sequences_per_pack={self.max_sequences_per_pack}, "
            f"max_predictions_per_pack={self.max_predictions_per_pack}, "
            f"vocab_size={self.vocab_size})"
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
        pack_sizes: IntArray | None = None
        if isinstance(rows, RowBlock):
            indices: IntArray | None = rows.indices
            shards = rows.shards
            ragged = {k: _ragged_from_arrow(rows.table.column(k)) for k in ROW_KEYS}
            labels = np.asarray(rows.table.column(LABEL_KEY).to_numpy(), dtype=np.int64)
            pack_sizes = rows.pack_sizes
        else:
            indices, shards = None, None
            ragged = {k: _ragged_from_rows(rows, k) for k in ROW_KEYS}
            labels = np.fromiter((int(r[LABEL_KEY]) for r in rows), np.int64, count=len(rows))
        if pack_sizes is None:
            pack_sizes = np.ones(labels.size, dtype=np.int64)
        elif int(pack_sizes.sum()) != labels.size or (pack_sizes < 1).any():
            raise CollateError(
                f"the pack sizes {pack_sizes.tolist()} do not split the {labels.size} rows "
                "fetched; the batch sampler must yield non-empty packs."
            )
        n = pack_sizes.size
        size = self.batch_size if self.batch_size is not None else n
        if n > size:
            raise CollateError(
                f"got {n} rows for an evaluation batch of batch_size={size}; the batch sampler "
                "must not yield more rows than the collator's batch_size."
            )
        seq_lengths, mlm_counts = ragged["input_ids"][1], ragged["masked_lm_positions"][1]
        self._validate(ragged, labels, indices, shards)
        layout = _Layout.of(pack_sizes, seq_lengths, mlm_counts)
        self._validate_packs(layout, indices, pack_sizes)

        s, p, k = self.max_seq_length, self.max_predictions_per_pack, self.max_sequences_per_pack
        buffer, out = _allocate(size, s, p, k)
        # every token: its sequence, its place in the sequence, its (row, column) in the batch
        token_seq = np.repeat(np.arange(seq_lengths.size), seq_lengths)
        token_pos = np.arange(token_seq.size) - _starts(seq_lengths)[token_seq]
        at = layout.row[token_seq] * s + layout.offset[token_seq] + token_pos  # flat [B*S] index
        out["input_ids"].reshape(-1)[at] = ragged["input_ids"][0]
        out["segment_ids"].reshape(-1)[at] = ragged["segment_ids"][0]
        out["position_ids"].reshape(-1)[at] = token_pos
        out["sequence_ids"].reshape(-1)[at] = layout.slot[token_seq] + 1
        # every masked position: shifted by its sequence's offset, after the pack's earlier ones
        mask_seq = np.repeat(np.arange(mlm_counts.size), mlm_counts)
        mask_pos = np.arange(mask_seq.size) - _starts(mlm_counts)[mask_seq]
        at = layout.row[mask_seq] * p + layout.mask_offset[mask_seq] + mask_pos  # flat [B*P]
        positions = ragged["masked_lm_positions"][0]
        out["masked_lm_positions"].reshape(-1)[at] = positions + layout.offset[mask_seq]
        out["masked_lm_ids"].reshape(-1)[at] = ragged["masked_lm_ids"][0]
        out["masked_lm_weights"].reshape(-1)[at] = 1.0
        # one NSP slot per sequence: its [CLS] column
        out["nsp_positions"][layout.row, layout.slot] = layout.offset
        out["nsp_labels"][layout.row, layout.slot] = labels
        out["nsp_weights"][layout.row, layout.slot] = 1.0
        return buffer, out

    def _validate_packs(
        self, layout: _Layout, indices: IntArray | None, pack_sizes: IntArray
    ) -> None:
        """Raise :class:`CollateError` for the first pack that does not fit a row (unpacked
        rows cannot get here: :meth:`_validate` checked each sequence against S and P)."""
        first = _starts(pack_sizes)
        for per_row, limit, what, key in (
            (layout.row_sequences, self.max_sequences_per_pack, "sequences", "max_sequences_per_pack"),
            (layout.row_tokens, self.max_seq_length, "tokens", "max_seq_length"),
            (layout.row_masks, self.max_predictions_per_pack, "masked positions", "max_predictions_per_pack"),
        ):  # fmt: skip
            over = np.flatnonzero(per_row > limit)
            if over.size:
                j = int(over[0])
                members = first[j] + np.arange(pack_sizes[j])
                ids = (members if indices is None else indices[members]).tolist()
                where = "rows" if indices is None else "dataset rows"
                raise CollateError(
                    f"the pack of {where} {ids} holds {int(per_row[j])} {what}, more than {key}="
                    f"{limit}; the pack index or sampler was made for other settings, rebuild it "
                    f"or raise data.pack.{key}."
                )

    def _validate(
        self,
        ragged: Mapping[str, tuple[IntArray, IntArray]],
        labels: IntArray,
        indices: IntArray | None,
        shards: ShardMap | None = None,
    ) -> None:
        """Raise :class:`CollateError` for the first sequence that breaks the settings,
        naming its dataset row and, when ``shards`` is known, its Arrow file and row there."""
        s, p = self.max_seq_length, self.max_predictions_per_seq
        seq_lengths = ragged["input_ids"][1]
        mlm_counts = ragged["masked_lm_positions"][1]

        def name(i: int) -> str:
            if indices is None:
                return f"row {i} of the batch"
            if shards is None:
                return f"row {int(indices[i])} of the dataset"
            return f"row {int(indices[i])} of the dataset ({shards.locate(int(indices[i]))})"

        corrupt = f"the data is corrupt, {shards.fix if shards is not None else 're-create it.'}"

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
                    + corrupt
                )
        positions = ragged["masked_lm_positions"][0]
        if positions.size:
            row_of = np.repeat(np.arange(seq_lengths.size), mlm_counts)
            outside = (positions < 0) | (positions >= seq_lengths[row_of])
            if (j := first(outside)) is not None:
                i = int(row_of[j])
                raise CollateError(
                    f"{name(i)} masks position {int(positions[j])}, outside its "
                    f"{int(seq_lengths[i])} tokens; " + corrupt
                )
        if (i := first((labels < 0) | (labels > 1))) is not None:
            raise CollateError(
                f"{name(i)} has next_sentence_label={int(labels[i])}, not 0 or 1; " + corrupt
            )
        bounds = [("segment_ids", self.type_vocab_size)]
        if self.vocab_size is not None:
            bounds += [("input_ids", self.vocab_size), ("masked_lm_ids", self.vocab_size)]
        for key, limit in bounds:
            values, lengths = ragged[key]
            if values.size and (values.min() < 0 or values.max() >= limit):  # the common case
                j = int(np.flatnonzero((values < 0) | (values >= limit))[0])
                i = int(np.searchsorted(np.cumsum(lengths), j, side="right"))
                raise CollateError(
                    f"{name(i)} has {key} value {int(values[j])}, outside 0..{limit - 1}; "
                    + corrupt
                )
