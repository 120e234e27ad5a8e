"""Padding and unpadding between omnibert's unpadded records and fixed-width BERT arrays.

An omnibert record (one Arrow row) is a dict with ``input_ids``, ``segment_ids``,
``masked_lm_positions``, ``masked_lm_ids`` (lists of ints, unpadded) and
``next_sentence_label`` (int; 1 = the second segment is a random next, as in Google's
``create_pretraining_data.py``). The TFRecord and HDF5 formats store the same record padded
with zeros to ``max_seq_length`` / ``max_predictions_per_seq`` plus ``input_mask`` (and, in
TFRecord, ``masked_lm_weights``); this module converts blocks of records both ways with numpy
and checks the invariants, so that both formats give back exactly the same records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from omnibert.errors import UserError

__all__ = ["RECORD_KEYS", "PaddedBatch", "RecordError", "pad_records", "unpad_batch"]

RECORD_KEYS = (
    "input_ids",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "next_sentence_label",
)

IntArray = npt.NDArray[np.int64]
PaddedBatch = dict[str, npt.NDArray[Any]]
"""``input_ids``, ``input_mask``, ``segment_ids`` [B,S]; ``masked_lm_positions``,
``masked_lm_ids``, ``masked_lm_weights`` (float32) [B,P]; ``next_sentence_labels`` [B]."""


class RecordError(UserError):
    """One record (``index`` within the block) breaks the layout; ``problem`` says how."""

    def __init__(self, index: int, problem: str) -> None:
        super().__init__(problem)
        self.index = index
        self.problem = problem


def pad_records(
    records: Sequence[dict[str, Any]], max_seq_length: int, max_predictions_per_seq: int
) -> PaddedBatch:
    """Pad a block of omnibert records to fixed width (zeros, as Google's writer pads)."""
    n, seq, preds = len(records), max_seq_length, max_predictions_per_seq
    out: PaddedBatch = {
        "input_ids": np.zeros((n, seq), np.int64),
        "input_mask": np.zeros((n, seq), np.int64),
        "segment_ids": np.zeros((n, seq), np.int64),
        "masked_lm_positions": np.zeros((n, preds), np.int64),
        "masked_lm_ids": np.zeros((n, preds), np.int64),
        "masked_lm_weights": np.zeros((n, preds), np.float32),
        "next_sentence_labels": np.zeros(n, np.int64),
    }
    for i, rec in enumerate(records):
        missing = [k for k in RECORD_KEYS if k not in rec]
        if missing:
            raise RecordError(i, f"the record has no {', '.join(missing)}")
        ids, seg = rec["input_ids"], rec["segment_ids"]
        pos, mid = rec["masked_lm_positions"], rec["masked_lm_ids"]
        length, count = len(ids), len(pos)
        if length > seq:
            raise RecordError(i, f"the record has {length} tokens, more than max_seq_length={seq}")
        if len(seg) != length:
            raise RecordError(i, f"{len(seg)} segment_ids for {length} input_ids")
        if count > preds:
            raise RecordError(
                i,
                f"the record has {count} masked positions, more than "
                f"max_predictions_per_seq={preds}",
            )
        if len(mid) != count:
            raise RecordError(i, f"{len(mid)} masked_lm_ids for {count} masked_lm_positions")
        out["input_ids"][i, :length] = ids
        out["input_mask"][i, :length] = 1
        out["segment_ids"][i, :length] = seg
        out["masked_lm_positions"][i, :count] = pos
        out["masked_lm_ids"][i, :count] = mid
        out["masked_lm_weights"][i, :count] = 1.0
        out["next_sentence_labels"][i] = int(rec["next_sentence_label"])
    return out


def _first_bad(rows: npt.ArrayLike) -> int:
    return int(np.flatnonzero(np.asarray(rows))[0])


def _prefix_rows(valid: npt.NDArray[np.bool_]) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """Per row: the count of true values and whether they are a prefix (true..., false...)."""
    counts = valid.sum(axis=1)
    prefix = np.arange(valid.shape[1])[None, :] < counts[:, None]
    return counts, (valid == prefix).all(axis=1)


def unpad_batch(
    input_ids: IntArray,
    input_mask: IntArray,
    segment_ids: IntArray,
    masked_lm_positions: IntArray,
    masked_lm_ids: IntArray,
    masked_lm_valid: npt.NDArray[np.bool_],
    next_sentence_labels: IntArray,
) -> list[dict[str, Any]]:
    """Turn a padded block back into omnibert records, checking the padding invariants.

    The sequence length of a row is ``sum(input_mask)`` (the mask must be ones then zeros);
    its predictions are the slots where ``masked_lm_valid`` is true (weight 1 in TFRecord,
    a nonzero position in NVIDIA HDF5). Raises :class:`RecordError` for the first bad row.
    """
    if input_mask.size and (input_mask.min() < 0 or input_mask.max() > 1):
        bad = ((input_mask < 0) | (input_mask > 1)).any(axis=1)
        raise RecordError(_first_bad(bad), "input_mask is not 0/1")
    lengths, mask_ok = _prefix_rows(input_mask.astype(bool))
    if not mask_ok.all():
        raise RecordError(_first_bad(~mask_ok), "input_mask is not ones followed by zeros")
    counts = masked_lm_valid.sum(axis=1)
    outside = masked_lm_valid & (masked_lm_positions >= lengths[:, None])
    outside |= masked_lm_valid & (masked_lm_positions < 0)
    if outside.any():
        raise RecordError(
            _first_bad(outside.any(axis=1)),
            "a masked_lm_position points outside the unpadded sequence",
        )
    nsp = next_sentence_labels.reshape(-1)
    if nsp.size and (nsp.min() < 0 or nsp.max() > 1):
        raise RecordError(_first_bad((nsp < 0) | (nsp > 1)), "next_sentence_labels is not 0/1")

    # Select the real values with one boolean mask per array (row-major, so each row's values
    # stay contiguous and in order), convert once, then cut the flat lists per row.
    real = input_mask.astype(bool)
    ids, seg = input_ids[real].tolist(), segment_ids[real].tolist()
    pos, mid = (
        masked_lm_positions[masked_lm_valid].tolist(),
        masked_lm_ids[masked_lm_valid].tolist(),
    )
    tok_end, pred_end = np.cumsum(lengths).tolist(), np.cumsum(counts).tolist()
    tok_start, pred_start = [0, *tok_end[:-1]], [0, *pred_end[:-1]]
    out = [
        {
            "input_ids": ids[a:b],
            "segment_ids": seg[a:b],
            "masked_lm_positions": pos[c:d],
            "masked_lm_ids": mid[c:d],
            "next_sentence_label": label,
        }
        for a, b, c, d, label in zip(
            tok_start, tok_end, pred_start, pred_end, nsp.tolist(), strict=True
        )
    ]
    return out
